"""The question table, read row by row: its schema checked, duplicate ids found before the run, each
row a ``Question`` (or an error row) in its input shard.

Row policy (schema problems raise SchemaError; a bad row never stops the others):

==========================  =======================================================
null id                     error row, id ``<row N>`` (``<<row N>`` ... if a real id starts
                            with ``<row ``: a stand-in never equals a real id)
null / empty question       error row ``empty question``
question over the limit     error row ``question too long (N chars > limit)``
invalid UTF-8               error row ``invalid UTF-8 in question``
control characters          removed (tab and newline kept); empty afterwards -> error row
duplicate id                the first occurrence (by row order) is answered; later ones are
                            dropped and counted in the run's metrics
==========================  =======================================================
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.storage import file_sha256, filesystem, hash_ids, open_parquet, redact, text_values
from schemas.records import Question
from schemas.tables import (
    QUESTION_OPTIONAL,
    QUESTION_REQUIRED,
    SchemaError,
    check_schema,
)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


NULL_ID_PREFIX = "<row "
# the optional columns answering reads (gold columns are read by evaluate, label and calibrate, which check them)
READ_BY_ANSWER = {c: QUESTION_OPTIONAL[c] for c in ("kind", "dataset")}


def _row_id(row: int, prefix: str = NULL_ID_PREFIX) -> str:
    """The id a row without one gets (its error row carries it)."""
    return f"{prefix}{row}>"


def stand_in_row(qid) -> int | None:
    """The row number N of a stand-in id ``<row N>`` (``<<row N>`` and so on: ``_row_id``), None for another id."""
    match = re.fullmatch(r"<+row (\d+)>", str(qid))
    return int(match.group(1)) if match else None


def _effective_ids(batch_ids: list, first_row: int, prefix: str) -> list[str]:
    return [qid if qid is not None else _row_id(first_row + i, prefix) for i, qid in enumerate(batch_ids)]


def _stand_in_depths(ids: list) -> set[int]:
    """The ``k`` for which an id of ``ids`` starts with ``k`` times ``<`` and ``row ``."""
    array = pa.array(ids, pa.string())
    candidates = array.filter(pc.fill_null(pc.starts_with(array, "<"), False)).to_pylist()  # rare: checked one by one
    return {len(i) - len(i.lstrip("<")) for i in candidates if i.lstrip("<").startswith("row ")}


@dataclass
class InputPlan:
    """What one pass over the ``id`` column tells: rows within the limit and duplicate rows to drop."""

    uri: str
    rows: int
    duplicate_rows: set[int] = field(default_factory=set)
    file_size: int | None = None
    null_id_prefix: str = NULL_ID_PREFIX  # of the stand-in ids of rows without an id
    sha256: str | None = None  # of the file's bytes: an edit that keeps its size is another input

    @property
    def answered(self) -> int:
        return self.rows - len(self.duplicate_rows)

    def shard_sizes(self, shard_rows: int) -> dict[int, int]:
        """Questions answered per input shard (its rows within the limit, less dropped duplicates)."""
        dropped = Counter(r // shard_rows for r in self.duplicate_rows)
        return {s: min(self.rows, (s + 1) * shard_rows) - s * shard_rows - dropped[s]
                for s in range(-(-self.rows // shard_rows))}


def rename_with_set(missing: list[str]) -> str:
    mapping = ", ".join(f"{c}: <yours>" for c in missing)
    return f"if the file names it otherwise, map it (answer, compare, label, calibrate): --set 'input.columns={{{mapping}}}'"


def check_questions(schema: pa.Schema, uri: str, rename: Callable[[list[str]], str] = rename_with_set) -> list[str]:
    """The question columns of ``schema`` (``uri``'s, named in the error) as ``answer`` reads them, the
    optional ones it reads too (a wrong type was found only after the models had loaded); ``rename(missing
    columns)``: how to map the file's own columns to them."""
    return _check_questions(schema, READ_BY_ANSWER, uri, rename)


def _check_questions(schema: pa.Schema, optional: dict, uri: str,
                     rename: Callable[[list[str]], str] = rename_with_set) -> list[str]:
    """check_schema, and where a required column is missing, how to name the file's own column for it."""
    try:
        return check_schema(schema, QUESTION_REQUIRED, optional, redact(uri))
    except SchemaError as err:
        missing = [c for c in QUESTION_REQUIRED if c not in schema.names]
        if not missing:
            raise
        raise SchemaError(f"{err}; {rename(missing)}") from None


def _open_questions(uri: str, limit: int | None) -> tuple[pq.ParquetFile, int]:
    """The questions file, schema-checked, and how many of its rows are in play."""
    pf = open_parquet(uri)
    _check_questions(pf.schema_arrow, READ_BY_ANSWER, uri)
    return pf, pf.metadata.num_rows if limit is None else min(limit, pf.metadata.num_rows)


def decoded(values: pa.Array) -> tuple[list, set[int]]:
    """``values`` as Python values, and the positions of those that are not valid UTF-8, None among them (a
    Parquet file is read as written: one bad id was a UnicodeDecodeError from the middle of the run's plan, not
    the error row of its question; CSV and JSON Lines are checked as they are converted)."""
    values = text_values(values)  # such a value as its bytes
    bad = {i for i, v in enumerate(values) if isinstance(v, bytes)}
    return [None if i in bad else v for i, v in enumerate(values)], bad


def value_counts(uri: str, column: str, rows: int, batch_rows: int = 65536) -> dict[str, int]:
    """How many of the first ``rows`` questions hold each value of ``column`` (none without the column;
    nulls left out), read a batch at a time."""
    pf = open_parquet(uri)
    counts: Counter = Counter()
    if column not in pf.schema_arrow.names:
        return {}
    seen = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=[column]):
        values, _ = decoded(batch.column(0).slice(0, max(0, rows - seen)))  # a kind not UTF-8 is no kind it names
        counts.update(v for v in values if v is not None)
        seen += batch.num_rows
        if seen >= rows:
            break
    return dict(counts)


def plan_input(uri: str, batch_rows: int = 65536, limit: int | None = None) -> InputPlan:
    """Validate the schema and find duplicate ids (8 bytes per row, transient)."""
    pf, total = _open_questions(uri, limit)
    hashes = np.empty(total, dtype=np.uint64)
    nulls: list[int] = []
    taken: set[int] = set()
    n = 0
    for ids in _id_batches(pf, batch_rows, total):
        # the stand-ins' prefix is known only after the last id: null rows are hashed once it is
        hashes[n:n + len(ids)] = hash_ids(["" if qid is None else qid for qid in ids])
        nulls += [n + i for i, qid in enumerate(ids) if qid is None]
        taken |= _stand_in_depths(ids)
        n += len(ids)
    depth = min(k for k in range(1, len(taken) + 2) if k not in taken)  # the shortest prefix no real id starts with
    prefix = "<" * (depth - 1) + NULL_ID_PREFIX
    if nulls:
        hashes[nulls] = hash_ids([_row_id(row, prefix) for row in nulls])
    values, counts = np.unique(hashes, return_counts=True)
    suspects = set(values[counts > 1].tolist())
    duplicates: set[int] = set()
    if suspects:  # exact check on the (rare) rows whose hash repeats
        first: dict[str, int] = {}
        n = 0
        for ids in _id_batches(pf, batch_rows, total):
            for i, (qid, h) in enumerate(zip(_effective_ids(ids, n, prefix), hashes[n:n + len(ids)].tolist())):
                if h in suspects:
                    if qid in first:
                        duplicates.add(n + i)
                    else:
                        first[qid] = n + i
            n += len(ids)
    fs, path = filesystem(uri)
    return InputPlan(redact(uri), total, duplicates, fs.get_file_info(path).size, prefix, file_sha256(fs, path))


def _id_batches(pf: pq.ParquetFile, batch_rows: int, total: int) -> Iterator[list]:
    """The ids, a batch at a time; one that is not valid UTF-8 is None, as its row has no id it can be written
    under (its error row gets a stand-in)."""
    n = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["id"]):
        ids, _ = decoded(batch.column("id").slice(0, total - n))
        n += len(ids)
        yield ids
        if n >= total:
            return


def question_rows(uri: str, batch_rows: int = 1024, limit: int | None = None, *, shard_rows: int = 10_000,
                  skip_shards: frozenset[int] = frozenset(), drop_rows: set[int] = frozenset(),
                  max_chars: int = 4096, null_id_prefix: str = NULL_ID_PREFIX) -> Iterator[Question]:
    """Stream questions batch by batch (policy in the module docstring); schema problems raise.
    ``null_id_prefix``: the input plan's (``plan_input``), so stand-ins never equal a real id.

    Input shard ``i`` is rows ``[i * shard_rows, (i + 1) * shard_rows)``; rows of ``skip_shards`` are
    not yielded (already committed) and row groups holding only such rows are not read.
    """
    pf, total = _open_questions(uri, limit)
    groups, start = [], 0
    for g in range(pf.metadata.num_row_groups):
        size = pf.metadata.row_group(g).num_rows
        shards = range(start // shard_rows, (min(start + size, total) - 1) // shard_rows + 1)
        if start < total and any(s not in skip_shards for s in shards):
            groups.append((g, start))
        start += size
    extra = check_schema(pf.schema_arrow, {}, READ_BY_ANSWER, redact(uri))
    for g, n in groups:
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=["id", "question", *extra]):
            if n >= total:
                return
            ids, not_utf8 = decoded(batch.column("id"))
            # as binary: one row of invalid UTF-8 must not fail the whole batch
            texts = pc.cast(batch.column("question"), pa.binary()).to_pylist()
            kinds, datasets = ((decoded(batch.column(c))[0] if c in extra else [None] * len(ids))
                               for c in ("kind", "dataset"))
            for i, (qid, raw, kind, dataset) in enumerate(zip(ids, texts, kinds, datasets)):
                row, n = n, n + 1
                if row >= total:
                    return
                if row // shard_rows in skip_shards or row in drop_rows:
                    continue
                yield _question(qid, raw, kind, dataset, row, row // shard_rows, max_chars, null_id_prefix,
                                "invalid UTF-8 in id" if i in not_utf8 else "null id")


def _question(qid: str | None, raw: bytes | None, kind: str | None, dataset: str | None, row: int, shard: int,
              max_chars: int, null_id_prefix: str, no_id: str = "null id") -> Question:
    def error(text: str, reason: str) -> Question:
        return Question(qid if qid is not None else _row_id(row, null_id_prefix), text, reason, shard, kind, dataset)

    if qid is None:
        return error("", no_id)
    if raw is None:
        return error("", "empty question")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return error("", "invalid UTF-8 in question")
    if len(text) > max_chars:
        return error(text[:200], f"question too long ({len(text)} chars > {max_chars})")
    text = _CONTROL.sub("", text)
    if not text.strip():
        return error(text, "empty question")
    return Question(qid, text, None, shard, kind, dataset)


def by_first_id(rows: list[dict]) -> dict:
    """Question rows by id, a repeated id's first row: the row it is answered at (the later ones are
    dropped), so its gold is that row's for every job that scores or labels answers; its gold passage
    ids without nulls and empty strings (``gold_ids``)."""
    first: dict = {}
    for r in rows:
        if r["id"] not in first and "gold_passage_ids" in r:
            r = {**r, "gold_passage_ids": gold_ids(r["gold_passage_ids"])}
        first.setdefault(r["id"], r)
    return first


def gold_ids(ids: list | None) -> list[str]:
    """A question's gold passage ids: a null or empty id names no passage (a hand-written file's gap),
    so it is no gold, for every job that scores, labels or mines against them."""
    return [i for i in ids or [] if i]


def question_columns(uri: str) -> list[str]:
    """The optional gold columns a question file carries (for evaluation)."""
    return _check_questions(open_parquet(uri).schema_arrow, QUESTION_OPTIONAL, uri)
