"""Question files and corpora in other tools' formats, read as ragsift's tables: JSON Lines (``.jsonl``,
``.json``) and CSV, local or anywhere pyarrow reaches, with other tools' field names mapped to ours:

    FlashRAG dataset   {"id", "question", "golden_answers": [...], "metadata"}   golden_answers -> answers
    FlashRAG corpus    {"id", "contents": "\\"Title\\"\\ntext"}                   contents -> title, text
    OpenAI batch input {"custom_id", "method", "url", "body": {"messages": [...]}}   custom_id -> id,
                       the last user message -> question (`ragsift export` writes the matching output)

A CSV cannot hold a list: its ``answers`` (or ``golden_answers``) cell is one answer, or several
separated by ``|``; every CSV cell is read as text (``007`` stays ``007``, an all-numeric answers
column is answers). Ids become strings, and so do answers written as numbers; a JSON column keeps one
type in every row (pyarrow's reader refuses one that changes), but for an OpenAI batch file's ``body``, read
line by line: the API lets its shapes vary. Read with pyarrow's streaming readers, a block at a time, so a
corpus larger than memory converts to Parquet in bounded memory.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.storage import filesystem, path_of, redact
from schemas.errors import UserError

SUFFIXES = (".jsonl", ".json", ".csv")


def is_foreign(uri: str) -> bool:
    """Whether ``uri`` is a JSON Lines or CSV file (read through this module) rather than Parquet."""
    return path_of(uri).lower().endswith(SUFFIXES)


def batches(uri: str, block_bytes: int = 16 << 20, mapped: bool = True) -> Iterator[pa.RecordBatch]:
    """The file's rows, a block at a time, with ragsift's column names (``mapped``; else the file's own,
    for a caller that renames them first, as ``input.columns`` does)."""
    import pyarrow.csv as pa_csv
    import pyarrow.json as pa_json

    fs, path = filesystem(uri)
    csv = path_of(uri).lower().endswith(".csv")
    try:
        # a CSV's columns are all text: pyarrow would infer numbers from the first block (ids lost their
        # leading zeros and collided, an all-numeric answers column was refused, a later block could disagree)
        convert = pa_csv.ConvertOptions(column_types=dict.fromkeys(_csv_header(fs, path), pa.string()),
                                        strings_can_be_null=True, null_values=[""], check_utf8=False) if csv else None
        stream = fs.open_input_stream(path) if is_foreign(uri) else fs.open_input_file(path)  # Parquet seeks
    except FileNotFoundError:
        raise UserError(f"{redact(uri)}: file not found") from None
    rows = 0
    with stream:
        try:
            if csv:
                # a quoted cell may hold newlines (a passage's paragraphs): without the option pyarrow splits
                # blocks at a newline inside a cell once the file is over one block, and refuses the file
                reader = pa_csv.open_csv(stream, read_options=pa_csv.ReadOptions(block_size=block_bytes),
                                         parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                                         convert_options=convert)
            elif not is_foreign(uri):  # Parquet, read here only to be converted (its ids or texts are numbers)
                reader = pq.ParquetFile(stream).iter_batches(batch_size=65_536)
            elif _is_openai_batch(fs, path):
                reader = _openai_batch_rows(stream, uri)
            else:
                reader = pa_json.open_json(stream, read_options=pa_json.ReadOptions(block_size=block_bytes))
            for batch in reader:
                yield ours(batch, csv, uri) if mapped else batch
                rows += batch.num_rows
        except pa.ArrowInvalid as err:
            # pyarrow reads a block at a time: its row numbers count from the block's start, and its columns
            # are the first block's (a field first seen later is "unexpected"); a line that is not JSON
            # is found by reading the file again, line by line, to name its line number
            json_line = not csv and is_foreign(uri) and "unexpected field" not in str(err).lower()
            line = _first_bad_json_line(fs, path) if json_line else None
            where = f"line {line}: " if line else f"after its first {rows:,} rows, " if rows else ""
            hint = (" (a field that first appears after the first block: give it in the first rows, null if need be)"
                    if "unexpected field" in str(err).lower() else "")
            raise UserError(f"{redact(uri)}: not readable as {uri.rsplit('.', 1)[-1].upper()} "
                            f"({where}{err}){hint}") from None


def _is_openai_batch(fs, path: str) -> bool:
    """Whether the file's first row is an OpenAI batch request ({"custom_id", "body"})."""
    import io

    with fs.open_input_stream(path) as raw:
        for line in io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace"):
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return False
                return isinstance(first, dict) and {"custom_id", "body"} <= first.keys()
    return False


def _openai_batch_rows(stream, uri: str, rows_per_batch: int = 10_000) -> Iterator[pa.RecordBatch]:
    """An OpenAI batch input file's requests, ``body`` kept as its JSON text. Its shapes vary from row to row as
    the API allows (a system message's content a string, the user's a list of parts; ``stop`` a string in one
    request and a list in the next), which pyarrow's reader, one type per field, refused."""
    import io

    ids, bodies = [], []

    def batch() -> pa.RecordBatch:
        try:
            custom_ids = pa.array(ids)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise UserError(f"{redact(uri)}: custom_id has one type in some requests and another in others "
                            "(numbers and text): quote them all") from None
        return pa.RecordBatch.from_pydict({"custom_id": custom_ids, "body": pa.array(bodies, pa.string())})

    lines = io.TextIOWrapper(stream, encoding="utf-8-sig")
    while True:
        try:
            line = next(lines, None)
            if line is None:
                break
            request = json.loads(line) if line.strip() else None
        except (UnicodeDecodeError, ValueError) as err:  # the caller names the line
            raise pa.ArrowInvalid(f"JSON parse error: {err}") from None
        if request is None:
            continue
        if not isinstance(request, dict):
            raise pa.ArrowInvalid("a line that is not a JSON object")
        ids.append(request.get("custom_id"))
        bodies.append(json.dumps(request.get("body")))
        if len(ids) == rows_per_batch:
            yield batch()
            ids, bodies = [], []
    if ids:
        yield batch()


def _first_bad_json_line(fs, path: str) -> int | None:
    """The number (from 1) of the first line of a JSON Lines file that is not a JSON object, if any."""
    import io
    import json

    with fs.open_input_stream(path) as raw:
        for number, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace"), 1):
            if line.strip():
                try:
                    if not isinstance(json.loads(line), dict):
                        return number
                except ValueError:
                    return number
    return None


def _csv_header(fs, path: str) -> list[str]:
    import pyarrow.csv as pa_csv

    with fs.open_input_stream(path) as head:
        try:
            return pa_csv.open_csv(head, read_options=pa_csv.ReadOptions(block_size=1 << 20)).schema.names
        except pa.ArrowInvalid:
            return []  # an empty file: the read proper says so


def ours(batch, csv: bool = False, uri: str = ""):
    """FlashRAG's names to ragsift's, ids as strings, a CSV's answers cell as a list, answers written as
    numbers as text (a RecordBatch, or a Table: a DataFrame's or a ``datasets`` table)."""
    columns = dict(zip(batch.schema.names, batch.columns))
    if {"custom_id", "body"} <= set(columns) and "question" not in columns:  # an OpenAI batch input file
        columns = {"id": columns["custom_id"], "question": pa.array(
            [last_user_message(json.loads(body) if isinstance(body, str) else body)
             for body in columns["body"].to_pylist()], pa.string())}
    if "golden_answers" in columns and "answers" not in columns:
        columns["answers"] = columns.pop("golden_answers")
    if "contents" in columns and "text" not in columns:
        if not (pa.types.is_string(columns["contents"].type) or pa.types.is_null(columns["contents"].type)):
            raise UserError(f"{redact(uri)}: `contents` holds {columns['contents'].type}, not text")
        title, text = split_contents(columns.pop("contents"))
        columns.setdefault("title", title)
        columns["text"] = text
    if "id" in columns and not pa.types.is_string(columns["id"].type):
        columns["id"] = ids_as_text(columns["id"], uri)
    if "answers" in columns:
        columns["answers"] = answers_as_lists(columns["answers"], csv, uri)
    if "gold_passage_ids" in columns:  # as answers, but a CSV cell of several ids is not split (none is promised)
        columns["gold_passage_ids"] = answers_as_lists(columns["gold_passage_ids"], False, uri)
    for name in ("id", "answers"):  # a CSV keeps invalid UTF-8 as it is: the question's row can say so, these cannot
        if name in columns:
            check_utf8(columns[name], name, uri)
    return type(batch).from_pydict(columns)


def answers_as_lists(answers, csv: bool, uri: str):
    """Gold answers as lists of text: one answer (a CSV cell: several, split at ``|``) is a list of one,
    numbers (``"answers": [1984]``) are text; other shapes are left for the schema check to name."""
    kind = answers.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type):
            return pc.cast(answers, pa.list_(pa.string()))
        return answers
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        answers, kind = pc.cast(answers, pa.string()), pa.string()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if csv:
            return pc.split_pattern(answers, "|")
        return pa.array([None if a is None else [a] for a in answers.to_pylist()], pa.list_(pa.string()))
    return answers


def check_utf8(column, name: str, uri: str) -> None:
    """Refuse, naming the row, a text column (or list of text) holding bytes that are not UTF-8: reading
    it fails later, after the models load (a question's own bad bytes are its row's error instead)."""
    kind = column.type
    nested = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    text = kind.value_type if nested else kind
    if not (pa.types.is_string(text) or pa.types.is_large_string(text)):
        return  # not text: the schema check names it
    as_bytes = pc.cast(column, pa.list_(pa.binary()) if nested else pa.binary())
    try:
        pc.cast(pc.list_flatten(as_bytes) if nested else as_bytes, pa.string())  # the cast checks the bytes
        return
    except pa.ArrowInvalid:
        pass
    for row, value in enumerate(as_bytes.to_pylist(), 1):
        for raw in (value or []) if nested else [value]:
            try:
                (raw or b"").decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{redact(uri)}: column {name!r} of row {row} is not valid UTF-8 ({raw[:40]!r})") from None


def ids_as_text(ids: pa.Array, uri: str) -> pa.Array:
    if pa.types.is_nested(ids.type):
        raise UserError(f"{redact(uri)}: ids must be text or numbers, not {ids.type}")
    if pa.types.is_floating(ids.type) and (pc.max(pc.abs(ids)).as_py() or 0) >= 2 ** 53:
        # JSON integers past int64 arrive as doubles: as text they would lose digits and collide
        raise UserError(f"{redact(uri)}: ids of 2**53 or more lose digits as JSON numbers: write them as strings")
    return pc.cast(ids, pa.string())


def last_user_message(body) -> str | None:
    """The question of an OpenAI chat request: its last user message (the strategies bring their own
    system prompts; a request without one, or not shaped as one, becomes a null question, an error row)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"] \
        if isinstance(messages, list) else []
    content = users[-1] if users else None
    if isinstance(content, list):  # content parts, as the API allows: the text parts, in order
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = "\n".join(t for t in texts if isinstance(t, str)) or None
    return content if isinstance(content, str) else None


def split_contents(contents: pa.Array) -> tuple[pa.Array, pa.Array]:
    """FlashRAG's ``contents``: the title (in quotes) on the first line, the text after it."""
    titles, texts = [], []
    for value in contents.to_pylist():
        head, sep, rest = (value or "").partition("\n")
        titles.append(head.strip().strip('"') if sep else "")
        texts.append(rest if sep else head)
    return pa.array(titles, pa.string()), pa.array(texts, pa.string())


def read(uri: str, mapped: bool = True) -> pa.Table:
    read = list(batches(uri, mapped=mapped))
    if not read:
        raise UserError(f"{redact(uri)}: no rows")
    return pa.Table.from_batches(read)


def _as_text(column: pa.Array, name: str, uri: str) -> pa.Array:
    """A corpus column as strings; invalid UTF-8 is kept as it is, for the index to skip and count."""
    if pa.types.is_nested(column.type):
        raise UserError(f"{redact(uri)}: column {name!r} holds {column.type}, not text")
    return pc.cast(column, options=pc.CastOptions(pa.string(), allow_invalid_utf8=True))


def to_parquet(uri: str, target: str, columns: list[str], required: list[str]) -> int:
    """Stream ``uri`` into the Parquet file ``target``: ``columns`` (those it has; ``required`` it must
    have), as strings. Returns the rows written."""
    fs, path = filesystem(target)
    writer, rows = None, 0
    try:
        with fs.open_output_stream(path + ".tmp") as out:
            try:
                for batch in batches(uri):
                    missing = [c for c in required if c not in batch.schema.names]
                    if missing:
                        raise UserError(f"{redact(uri)}: no column {missing} (it has {batch.schema.names})")
                    batch = pa.RecordBatch.from_pydict(
                        {c: _as_text(batch[c], c, uri) for c in columns if c in batch.schema.names})
                    writer = writer or pq.ParquetWriter(out, batch.schema, compression="zstd")
                    writer.write_batch(batch)
                    rows += batch.num_rows
            finally:  # before its stream closes (a writer left open printed a traceback when collected)
                if writer:
                    writer.close()
        if not rows:
            raise UserError(f"{redact(uri)}: no rows")
    except BaseException:  # a file that cannot be read leaves no half copy (nor, so, a folder made for it)
        with contextlib.suppress(OSError):
            fs.delete_file(path + ".tmp")
        raise
    fs.move(path + ".tmp", path)
    return rows
