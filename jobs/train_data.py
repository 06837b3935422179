"""What a judge model is trained on and how it is reported: questions kept out (the reported slices),
a stable held-out split by question, the held-out AUC, and the model card written beside the weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from jobs import formats
from jobs.formats import is_foreign
from jobs.storage import read_table
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
            column = [line.strip() for line in Path(source).read_text(encoding="utf-8-sig").splitlines()]
        ids |= {str(i) for i in column if i is not None and str(i)}
    return ids


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
