"""A shard's passage store, shared by its FAISS and BM25 searches."""

from __future__ import annotations

from pathlib import Path

from schemas.records import Passage


class PassageStore:
    """A shard's passages (row i = index row i), kept as Arrow columns rather than Python objects."""

    def __init__(self, shard_dir: str):
        import pyarrow.parquet as pq

        self.table = pq.read_table(Path(shard_dir) / "passages.parquet", columns=["id", "title", "text"])

    def __len__(self) -> int:
        return self.table.num_rows

    def passages(self, rows: list[int], scores: list[float]) -> list[Passage]:
        if not rows:
            return []
        picked = self.table.take(rows).to_pydict()
        return [Passage(i, t or "", x, s) for i, t, x, s in zip(picked["id"], picked["title"], picked["text"], scores)]
