"""What a judge model is trained on and how it is reported: questions kept out (the reported slices),
a stable held-out split by question, the held-out AUC, and the model card written beside the weights."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from jobs import formats
from jobs.formats import is_foreign
from jobs.storage import filesystem, read_table
from schemas.errors import UserError


def excluded_ids(sources: list[str]) -> set[str]:
    """Ids kept out of training, as text: a question file's ``id`` column (Parquet, JSON Lines, CSV, as
    the jobs read them) or an id list (any other file: one id per line). A question file read as an id
    list would exclude nothing, silently."""
    ids: set[str] = set()
    for source in sources:
        if source.lower().endswith(".parquet"):
            column = read_table(source, ["id"])["id"].to_pylist()
        elif is_foreign(source):
            table = formats.read(source)
            if "id" not in table.column_names:
                raise UserError(f"--exclude {source}: no `id` column")
            column = table["id"].to_pylist()
        else:  # utf-8-sig: a byte-order mark would stick to the first id, which then matches nothing
            column = [line.strip() for line in id_list(source).splitlines()]
        ids |= {str(i) for i in column if i is not None and str(i)}
    return ids


def id_list(source: str) -> str:
    """A file of ids, one a line, as text (local or any URI pyarrow reads)."""
    try:
        fs, path = filesystem(source)
        with fs.open_input_stream(path) as f:
            return f.read().decode("utf-8-sig")
    except (FileNotFoundError, IsADirectoryError, OSError) as err:
        raise UserError(f"--exclude {source}: cannot be read ({type(err).__name__}: {err})") from None
    except UnicodeDecodeError:  # a Parquet file named otherwise: a traceback before
        raise UserError(f"--exclude {source}: not a list of ids (text, one a line) nor a question file named "
                        ".parquet / .jsonl / .json / .csv") from None


# what ``ragsift train`` writes in its --output: a folder holding one of them was written by it
OURS = ("card.json", "pairs.parquet", "_checkpoints")  # _checkpoints: a training killed before it wrote


def check_output(output: str) -> None:
    """Before any work: ``train`` writes a local model directory, which the pools load by path, and
    writes it only where it may replace what is there."""
    if "://" in output:  # a local folder named "s3:" was written, and "wrote s3://..." reported
        raise UserError(f"--output {output}: train writes a local model directory; copy it to the object store "
                        "after (the pools load a model by its local path)")
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {output} is a file, not a folder")
    held = [p.name for p in out.iterdir()] if out.is_dir() else []
    if held and not any(name in held for name in OURS):
        raise UserError(f"--output {output} holds files that no `ragsift train` wrote ({', '.join(sorted(held)[:5])}): "
                        "give a new or empty folder")


@contextmanager
def staged(output: str, keep: tuple[str, ...] = ()):
    """A new folder for a model, which takes the place of ``output`` only once whole: written beside it
    (same filesystem), given the files of ``output`` named in ``keep``, then renamed into place. A failure
    or a kill before leaves ``output`` as it was (a kill in the instant between the two renames leaves it
    missing, never part written); the next training clears what a killed one left beside it."""
    out = Path(output).resolve()  # "." or "m_rel/" too: the folder is renamed by its name in its parent
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    folder, old = (out.parent / f".{out.name}.{state}-{os.getpid()}" for state in ("partial", "replaced"))
    shutil.rmtree(old, ignore_errors=True)
    folder.mkdir()
    try:
        yield folder
        for name in keep:
            if (out / name).is_file() and not (folder / name).exists():
                shutil.copy2(out / name, folder / name)
        if out.exists():
            out.rename(old)
        try:
            folder.rename(out)
        except BaseException:
            if old.exists():
                old.rename(out)
            raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def held_out(qid: str, share: float) -> bool:
    """A stable split by question (never by pair, so no question is on both sides); salted, so that
    it is independent of the plain id hash the DEV slices are ordered by."""
    return int(hashlib.sha256(f"held-out:{qid}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def auc(labels: list[float], scores: list[float]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def write_card(output: str, card: dict) -> None:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.json").write_text(json.dumps(card, indent=2))
    lines = [f"# {card['model']}", "", "Trained by `ragsift train`.", "", "```json", json.dumps(card, indent=2), "```"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
