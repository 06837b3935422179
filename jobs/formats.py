"""Question files and corpora in other tools' formats, read as ragsift's tables: JSON Lines (``.jsonl``,
``.json``) and CSV, local or anywhere pyarrow reaches, with other tools' field names mapped to ours:

    FlashRAG dataset   {"id", "question", "golden_answers": [...], "metadata"}   golden_answers -> answers
    FlashRAG corpus    {"id", "contents": "\\"Title\\"\\ntext"}                   contents -> title, text
    OpenAI batch input {"custom_id", "method", "url", "body": {"messages": [...]}}   custom_id -> id,
                       the last user message -> question (`ragsift export` writes the matching output)

A CSV cannot hold a list: its ``answers`` (or ``golden_answers``) cell is one answer, or several
separated by ``|``. Ids become strings. Read with pyarrow's streaming readers, a block at a time, so a
corpus larger than memory converts to Parquet in bounded memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.storage import filesystem, redact
from schemas.errors import UserError

SUFFIXES = (".jsonl", ".json", ".csv")


def is_foreign(uri: str) -> bool:
    """Whether ``uri`` is a JSON Lines or CSV file (read through this module) rather than Parquet."""
    return uri.lower().endswith(SUFFIXES)


def batches(uri: str, block_bytes: int = 16 << 20) -> Iterator[pa.RecordBatch]:
    """The file's rows, a block at a time, with ragsift's column names."""
    import pyarrow.csv as pa_csv
    import pyarrow.json as pa_json

    fs, path = filesystem(uri)
    try:
        stream = fs.open_input_stream(path)
    except FileNotFoundError:
        raise UserError(f"{redact(uri)}: file not found") from None
    with stream:
        try:
            if uri.lower().endswith(".csv"):
                reader = pa_csv.open_csv(stream, read_options=pa_csv.ReadOptions(block_size=block_bytes))
            else:
                reader = pa_json.open_json(stream, read_options=pa_json.ReadOptions(block_size=block_bytes))
            for batch in reader:
                yield ours(batch)
        except pa.ArrowInvalid as err:
            raise UserError(f"{redact(uri)}: not readable as {uri.rsplit('.', 1)[-1].upper()} ({err})") from None


def ours(batch: pa.RecordBatch) -> pa.RecordBatch:
    """FlashRAG's names to ragsift's, ids as strings, a CSV's answers cell as a list."""
    columns = dict(zip(batch.schema.names, batch.columns))
    if {"custom_id", "body"} <= set(columns) and "question" not in columns:  # an OpenAI batch input file
        columns = {"id": columns["custom_id"], "question": pa.array(
            [last_user_message(body) for body in columns["body"].to_pylist()], pa.string())}
    if "golden_answers" in columns and "answers" not in columns:
        columns["answers"] = columns.pop("golden_answers")
    if "contents" in columns and "text" not in columns:
        title, text = split_contents(columns.pop("contents"))
        columns.setdefault("title", title)
        columns["text"] = text
    if "id" in columns and not pa.types.is_string(columns["id"].type):
        columns["id"] = pc.cast(columns["id"], pa.string())
    if "answers" in columns and pa.types.is_string(columns["answers"].type):
        columns["answers"] = pc.split_pattern(columns["answers"], "|")
    return pa.RecordBatch.from_pydict(columns)


def last_user_message(body: dict | None) -> str | None:
    """The question of an OpenAI chat request: its last user message (the strategies bring their own
    system prompts; a request without one becomes a null question, an error row)."""
    users = [m.get("content") for m in (body or {}).get("messages") or [] if m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else None


def split_contents(contents: pa.Array) -> tuple[pa.Array, pa.Array]:
    """FlashRAG's ``contents``: the title (in quotes) on the first line, the text after it."""
    titles, texts = [], []
    for value in contents.to_pylist():
        head, sep, rest = (value or "").partition("\n")
        titles.append(head.strip().strip('"') if sep else "")
        texts.append(rest if sep else head)
    return pa.array(titles, pa.string()), pa.array(texts, pa.string())


def read(uri: str) -> pa.Table:
    return pa.Table.from_batches(list(batches(uri)))


def to_parquet(uri: str, target: str, columns: list[str], required: list[str]) -> int:
    """Stream ``uri`` into the Parquet file ``target``: ``columns`` (those it has; ``required`` it must
    have), as strings. Returns the rows written."""
    fs, path = filesystem(target)
    writer, rows = None, 0
    with fs.open_output_stream(path + ".tmp") as out:
        for batch in batches(uri):
            missing = [c for c in required if c not in batch.schema.names]
            if missing:
                raise UserError(f"{redact(uri)}: no column {missing} (it has {batch.schema.names})")
            batch = pa.RecordBatch.from_pydict(
                {c: pc.cast(batch[c], pa.string()) for c in columns if c in batch.schema.names})
            writer = writer or pq.ParquetWriter(out, batch.schema, compression="zstd")
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer:
            writer.close()
    if not rows:
        fs.delete_file(path + ".tmp")
        raise UserError(f"{redact(uri)}: no rows")
    fs.move(path + ".tmp", path)
    return rows
