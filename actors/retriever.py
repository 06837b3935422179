"""Retriever replica: one FAISS shard with its passage store; query vectors in, top-k out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas.records import Passage


class ShardRetriever:
    def __init__(self, shard_dir: str):
        import faiss
        import pyarrow.parquet as pq

        self.index = faiss.read_index(str(Path(shard_dir) / "index.faiss"))
        self.index = _to_gpu_if_available(faiss, self.index)
        table = pq.read_table(Path(shard_dir) / "passages.parquet")
        self.ids = table.column("id").to_pylist()
        self.titles = table.column("title").to_pylist()
        self.texts = table.column("text").to_pylist()

    def size(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int) -> list[list[Passage]]:
        scores, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return [
            [Passage(self.ids[r], self.titles[r], self.texts[r], float(s))
             for s, r in zip(srow, rrow) if r >= 0]
            for srow, rrow in zip(scores, rows)
        ]


def merge_topk(per_shard: list[list[list[Passage]]], k: int) -> list[list[Passage]]:
    """Global top-k per query across shards (higher score first; ties keep shard order)."""
    merged = []
    for per_query in zip(*per_shard):
        candidates = [p for shard_hits in per_query for p in shard_hits]
        merged.append(sorted(candidates, key=lambda p: -p.score)[:k])
    return merged


def _to_gpu_if_available(faiss, index):
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        return faiss.index_cpu_to_all_gpus(index)
    return index
