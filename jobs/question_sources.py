"""Question sources other than a ragsift-shaped Parquet file: JSON Lines or CSV (FlashRAG's dataset
files too: jobs/formats.py), a folder of Parquet files (Spark's, Ray Data's output), a ``datasets`` directory written by
``save_to_disk`` (a Dataset, or a DatasetDict with ``input.split``), ``hf:NAME`` for
``datasets.load_dataset(NAME, split=input.split or "train")`` (a hub name when online, or a local
folder of Parquet / JSON / CSV files), or any file whose columns need renaming (``input.columns``,
ours -> yours). They are converted to ``<output>/_input/questions-<digest>.parquet`` (named by content),
which the run then reads like any question file."""

from __future__ import annotations

import atexit
import json
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.formats import is_foreign, ours
from jobs.formats import read as read_foreign
from jobs.questions import check_questions
from jobs.storage import cannot_write, file_sha256, filesystem, read_only, read_table, redact, uri_of
from schemas.errors import UserError
from schemas.tables import QUESTION_OPTIONAL, QUESTION_REQUIRED


def to_arrow(questions: Any, columns: dict[str, str] | None = None, csv: bool = False, uri: str = "questions") -> pa.Table:
    """An Arrow table with ragsift's column names (``columns`` maps ours -> yours, applied before other
    tools' names are mapped to ours: jobs/formats.py ``ours``; ``csv``: answers cells split at ``|``);
    ids from row numbers when there is no id column."""
    try:
        table = _as_table(questions)
    except UnicodeEncodeError as err:  # a Python string Arrow cannot hold: a lone surrogate ("\ud800")
        raise UserError(f"questions: {_where_unencodable(questions)} is not valid Unicode ({err.reason}: "
                        f"{err.object[err.start:err.end]!r}); Arrow holds UTF-8 only") from None
    columns = columns or {}
    unknown = sorted(set(columns) - set(QUESTION_REQUIRED) - set(QUESTION_OPTIONAL))
    if unknown:  # a misspelt name of ours would leave the file's own column of that name in use
        raise UserError(f"input.columns names {unknown}, not question columns: the keys are ours "
                        f"({', '.join([*QUESTION_REQUIRED, *QUESTION_OPTIONAL])}), the values the file's")
    shared = sorted({theirs for theirs in columns.values() if list(columns.values()).count(theirs) > 1})
    if shared:
        raise UserError(f"input.columns maps one column of the questions, {shared}, to several of ours: "
                        "one column each")
    renames = {theirs: ours for ours, theirs in columns.items()}
    missing = [c for c in renames if c not in table.column_names]
    if missing:
        raise UserError(f"columns {missing} are not in the questions (they have {table.column_names})")
    names = [renames.get(c, c) for c in table.column_names]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"renaming gives two columns named {twice} (the questions have {table.column_names}; "
                        "rename or drop the one input.columns does not name)")
    # text however it is held: a pandas Categorical (dictionary-encoded), a string_view; its values as they are
    table = pa.table({name: decoded(column) for name, column in zip(names, table.columns)})
    table = ours(table, csv, uri)  # ids as text (a DataFrame's 3, 1, 2), answers as lists
    if "id" not in table.column_names:
        table = table.append_column("id", pa.array([str(i) for i in range(table.num_rows)]))
    return table


def _as_table(questions: Any) -> pa.Table:
    if isinstance(questions, pa.Table):
        return questions
    if type(questions).__module__.startswith("pandas"):
        return pa.Table.from_pandas(questions, preserve_index=False)
    if type(questions).__module__.startswith("datasets"):
        import datasets

        if not isinstance(questions, datasets.Dataset):  # a DatasetDict of splits, an IterableDataset
            raise UserError(f"questions: a datasets.{type(questions).__name__} is not one table of questions: pass "
                            "one split (ds['validation']), or an IterableDataset's rows as a Dataset")
        return questions.flatten_indices().data.table  # the rows the Dataset shows, without a copy to Python
    if isinstance(questions, list):
        try:
            return pa.Table.from_pylist(questions)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:  # one key holding text in one row, a number in another
            raise UserError(f"questions: the list's dicts do not make one table, a key's values of one type each "
                            f"({err})") from None
    raise TypeError(f"questions must be a pandas DataFrame, Arrow table, datasets.Dataset or list of dicts, "
                    f"not {type(questions).__name__}")


def _where_unencodable(questions: Any) -> str:
    """The first row and column of ``questions`` (a list of dicts or a DataFrame) whose text is no valid Unicode."""
    rows = questions.to_dict("records") if hasattr(questions, "to_dict") else questions
    for n, row in enumerate(rows):
        for key, value in (row.items() if isinstance(row, dict) else ()):
            for text in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        return f"row {n}'s {key!r}"
    return "a value"


def decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column as its values, a string_view as a string: the types a question's
    columns are checked against."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_string_view(column.type):
        column = column.cast(pa.string())
    return column


def is_datasets_dir(uri: str) -> bool:
    path = Path(uri)
    return "://" not in uri and path.is_dir() and any((path / f).exists() for f in ("state.json", "dataset_dict.json"))


def is_parquet_dir(uri: str) -> bool:
    """A folder (local or in an object store) taken as a table of Parquet files, Spark's or Ray Data's
    output: not a ``datasets`` folder, not ``hf:``."""
    if uri.startswith("hf:") or is_datasets_dir(uri):
        return False
    try:
        fs, path = filesystem(uri)
        return fs.get_file_info(path).type == pafs.FileType.Directory
    except (UserError, OSError):  # not a URI pyarrow opens, or unreachable: the file's own read says why
        return False


def read_parquet_dir(uri: str) -> pa.Table:
    """Every ``*.parquet`` file under the folder, in path order, as one table, with a column for each
    ``key=value`` folder level (files and folders whose names start with ``_`` or ``.`` are left out, as Spark
    and pyarrow leave them: markers, checksums, parts in progress)."""
    import pyarrow.dataset as ds

    fs, root = filesystem(uri)
    files = sorted(e.path for e in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                   if e.type == pafs.FileType.File and e.path.endswith(".parquet")
                   and not any(p.startswith(("_", ".")) for p in e.path[len(root):].split("/") if p))
    if not files:
        raise UserError(f"{redact(uri)}: a folder with no Parquet file (*.parquet) in it; questions in another "
                        "format are one file (JSON Lines, CSV), a `datasets` folder, or hf:<folder>")
    try:
        # key=value folders (Spark's partitionBy, pyarrow's write_to_dataset) hold a column of their own: the
        # files lack it (a partition by `dataset` read without them scored ALL only), kept as text
        names = dict.fromkeys(part.split("=", 1)[0] for f in files for part in f[len(root):].split("/")[:-1]
                              if "=" in part)
        keys = pa.schema([(name, pa.string()) for name in names])
        schema = pa.unify_schemas([pq.read_schema(f, filesystem=fs) for f in files] + [keys])
        return ds.dataset(files, schema=schema, filesystem=fs, format="parquet", partition_base_dir=root,
                          partitioning=ds.partitioning(keys, flavor="hive") if names else None).to_table()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        raise UserError(f"{redact(uri)}: its {len(files)} Parquet files do not read as one table ({err})") from None


def source_sha256(questions: str) -> str | None:
    """The sha256 of a questions file as the user gave it (a JSON Lines file's, not of ragsift's Parquet
    copy, so that it can be checked against theirs); None for a ``datasets`` folder or ``hf:`` name."""
    return None if questions.startswith("hf:") or is_datasets_dir(questions) or is_parquet_dir(questions) \
        else sha256_of(questions)


def sha256_of(uri: str) -> str:
    return file_sha256(*filesystem(uri))


def materialize_questions(uri: str, output: str, columns: dict[str, str], split: str | None) -> str:
    """``uri`` itself when it needs no conversion, else the path of its converted Parquet copy."""
    if is_converted_copy(uri):  # a run's own config.yaml: its input.split / columns are applied in the copy
        return uri
    if split is not None and not uri.startswith("hf:") and not is_datasets_dir(uri):
        raise no_splits(uri, split)
    if not columns and not is_datasets_dir(uri) and not uri.startswith("hf:") and not is_foreign(uri) \
            and not is_parquet_dir(uri):
        return uri
    if uri.startswith("hf:"):
        import datasets

        try:
            loaded = datasets.load_dataset(uri[3:], split=split or "train")
        except Exception as err:  # noqa: BLE001 - offline hub names, bad splits...: one clear CLI error
            raise UserError(f"{uri}: datasets.load_dataset failed: {type(err).__name__}: {err}") from None
        # a local folder of CSV files: datasets reads each cell as its type guess, so its answers are text
        local = Path(uri[3:])
        table = to_arrow(loaded, columns, csv=local.is_dir() and any(local.rglob("*.csv")), uri=uri)
    elif is_datasets_dir(uri):
        import datasets

        try:
            loaded = datasets.load_from_disk(uri)
        except (ValueError, KeyError, TypeError) as err:  # a damaged state.json / dataset_info.json
            raise UserError(f"{uri}: not readable as a `datasets` folder ({type(err).__name__}: {err})") from None
        if isinstance(loaded, datasets.DatasetDict):
            if split is None and len(loaded) == 1:
                split = next(iter(loaded))
            if split not in loaded:
                raise UserError(f"{uri} holds splits {sorted(loaded)}: choose one with --set input.split=NAME")
            loaded = loaded[split]
        elif split is not None:
            raise no_splits(uri, split)
        table = to_arrow(loaded, columns, uri=uri)
    elif is_foreign(uri):
        table = to_arrow(read_foreign(uri, mapped=False), columns, csv=uri.lower().endswith(".csv"), uri=uri)
    elif is_parquet_dir(uri):
        table = to_arrow(read_parquet_dir(uri), columns, uri=uri)
    else:
        table = to_arrow(read_table(uri), columns, uri=uri)
    check_questions(table.schema, uri)  # naming the user's file, before anything is written
    target = write_input(table, output)
    print(f"questions from {redact(uri)} ({table.num_rows} rows) converted to {redact(target)}", file=sys.stderr)
    return target


def no_splits(uri: str, split: str) -> UserError:
    """``input.split`` names a split of a ``datasets`` folder or ``hf:`` dataset: a file read whole was answered
    whatever the split said."""
    return UserError(f"input.split {split!r}: {redact(uri)} is one table, with no splits (a split is one of a "
                     "`datasets` DatasetDict folder's or of hf:NAME's): drop input.split")


def as_parquet(uri: str) -> str:
    """A question file that a job reading gold (evaluate, report, train relevance) opens as Parquet:
    ``uri`` itself, or a JSON Lines / CSV file, a ``datasets`` folder or ``hf:NAME`` converted as
    ``answer`` converts it (so its ids are the answers' ids), into a folder of this process removed at exit.
    A split is the answer run's choice (``input.split``), so ``hf:`` and a folder of several splits are
    refused here, naming the file that run converted."""
    if not (is_datasets_dir(uri) or uri.startswith("hf:") or is_foreign(uri) or is_parquet_dir(uri)):
        return uri
    splits = Path(uri) / "dataset_dict.json"
    if uri.startswith("hf:") or (splits.exists() and len(json.loads(splits.read_text()).get("splits", [])) > 1):
        raise UserError(f"{uri}: which split was answered is the answer run's choice (input.split): pass the "
                        "questions it converted, <output>/_input/questions-<digest>.parquet")
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = tempfile.mkdtemp(prefix="ragsift-questions-")
        atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
    return materialize_questions(uri, _SCRATCH, {}, None)


_SCRATCH: str | None = None


_COPY = re.compile(r"(^|/)_input/questions-[0-9a-f]+\.parquet$")


def is_converted_copy(questions: str) -> bool:
    """Whether ``questions`` is a copy ragsift converted a run's questions into (``write_input``), as a
    run's config.yaml names them: the columns it renamed and the split it chose are in the copy."""
    # an object store's URI carries its query after the path (s3://b/out/_input/...?endpoint_override=...)
    return bool(_COPY.search(questions.split("?", 1)[0] if "://" in questions else questions))


def write_input(table: pa.Table, output: str, digest: str | None = None) -> str:
    """``table`` as ``<output>/_input/questions-<digest>.parquet``, named by its content (the file's
    sha256 unless ``digest`` is given), written under a temporary name and renamed, never rewritten:
    the conversion runs before the output's lease and identity check, so other questions must not
    overwrite the file an earlier run answered from, nor a second driver the file a first one reads."""
    fs, root = filesystem(output)
    if read_only(output):  # a rerun over a finished run on a read-only mount: its copy is there, or none can be
        scratch = tempfile.mkdtemp(prefix="ragsift-input-")
        try:
            pq.write_table(table, copy := f"{scratch}/questions.parquet")
            path = f"{root}/_input/questions-{digest or file_sha256(pafs.LocalFileSystem(), copy)[:16]}.parquet"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if fs.get_file_info(path).type == pafs.FileType.File:
            return uri_of(output, path)
        raise cannot_write(output, "these questions' converted copy is not in it",
                           "answer into a folder it can write (--output)")
    fs.create_dir(f"{root}/_input", recursive=True)
    tmp = f"{root}/_input/.questions-{uuid.uuid4().hex}.parquet.tmp"
    pq.write_table(table, tmp, filesystem=fs)
    path = f"{root}/_input/questions-{digest or file_sha256(fs, tmp)[:16]}.parquet"
    if fs.get_file_info(path).type == pafs.FileType.File:
        fs.delete_file(tmp)
    else:
        fs.move(tmp, path)
    return uri_of(output, path)
