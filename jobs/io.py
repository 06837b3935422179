"""Reading and writing tables through pyarrow's filesystems (local paths, s3://, gs://, ...)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from schemas.tables import ANSWERS, QUESTION_OPTIONAL, QUESTION_REQUIRED, SchemaError, check_schema


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, ValueError):  # a plain relative path
        return pafs.LocalFileSystem(), uri


def open_parquet(uri: str) -> pq.ParquetFile:
    fs, path = filesystem(uri)
    try:
        return pq.ParquetFile(fs.open_input_file(path))
    except FileNotFoundError:
        raise SchemaError(f"{uri}: file not found") from None
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{uri}: not a readable Parquet file ({err})") from None


def read_table(uri: str, columns: list[str] | None = None) -> pa.Table:
    return open_parquet(uri).read(columns=columns)


@dataclass
class Question:
    id: str
    question: str
    error: str | None = None  # set when the row cannot be answered (it becomes an error row)


def question_rows(uri: str, batch_rows: int = 1024, limit: int | None = None) -> Iterator[Question]:
    """Stream questions batch by batch; schema problems raise, row problems yield error rows."""
    pf = open_parquet(uri)
    check_schema(pf.schema_arrow, QUESTION_REQUIRED, {}, uri)
    n = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["id", "question"]):
        for qid, text in zip(batch.column("id").to_pylist(), batch.column("question").to_pylist()):
            if limit is not None and n >= limit:
                return
            n += 1
            if qid is None:
                qid = f"<row {n - 1}>"
                yield Question(qid, text or "", error="null id")
            elif text is None or not text.strip():
                yield Question(qid, text or "", error="empty question")
            else:
                yield Question(qid, text)


def question_columns(uri: str) -> list[str]:
    """The optional gold columns a question file carries (for evaluation)."""
    return check_schema(open_parquet(uri).schema_arrow, QUESTION_REQUIRED, QUESTION_OPTIONAL, uri)


class AnswerWriter:
    """Streams answer rows into one Parquet file per strategy, in row groups.

    Files are written under a temporary name and renamed when closed, so a finished file is complete.
    """

    def __init__(self, output_dir: str, metadata: dict, row_group: int = 256):
        self.fs, self.root = filesystem(output_dir)
        self.fs.create_dir(self.root, recursive=True)
        self.schema = ANSWERS.with_metadata({"ragsift": json.dumps(metadata, sort_keys=True)})
        self.row_group = row_group
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.streams: dict[str, pa.NativeFile] = {}
        self.buffers: dict[str, list[dict]] = {}
        self.paths: dict[str, str] = {}

    def write(self, row: dict) -> None:
        strategy = row["strategy"]
        buf = self.buffers.setdefault(strategy, [])
        buf.append(row)
        if len(buf) >= self.row_group:
            self._flush(strategy)

    def _flush(self, strategy: str) -> None:
        rows = self.buffers.get(strategy)
        if not rows:
            return
        if strategy not in self.writers:
            path = f"{self.root}/{strategy}.parquet"
            self.paths[strategy] = path
            self.streams[strategy] = self.fs.open_output_stream(path + ".tmp")
            self.writers[strategy] = pq.ParquetWriter(self.streams[strategy], self.schema, compression="zstd")
        self.writers[strategy].write_table(pa.Table.from_pylist(rows, schema=self.schema))
        rows.clear()

    def close(self) -> dict[str, str]:
        for strategy in list(self.buffers):
            self._flush(strategy)
        for strategy, writer in self.writers.items():
            writer.close()
            self.streams[strategy].close()
            self.fs.move(self.paths[strategy] + ".tmp", self.paths[strategy])
        return dict(self.paths)
