"""Retriever replica: one shard's passage store with its FAISS index (query vectors in, top-k out)
and, when built, its BM25 index (query texts in, top-k out)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from actors.passages import PassageStore
from schemas.config import IndexConfig
from schemas.records import Passage

# the config's search-time defaults, not FAISS's own (nprobe 1, efSearch 16), for callers without a
# config (training pair mining, benchmarks): an IVF shard searched at nprobe 1 returned 5 of 30 hits
SEARCH_DEFAULTS = IndexConfig()


class ShardRetriever:
    def __init__(self, shard_dir: str, nprobe: int | None = SEARCH_DEFAULTS.nprobe,
                 ef_search: int | None = SEARCH_DEFAULTS.hnsw_ef_search, bm25: bool = False,
                 built: str | None = None, embedder: str | None = None, gpu: bool = False):
        """``built`` / ``embedder``: the passages_sha256 the run's manifest recorded for this shard, and the
        embedder it names. Ray restarts a dead shard actor from its folder: an index rebuilt in place from
        other passages, or by another embedder of the same dimension, since the run started would be read
        silently, and the run would answer its later questions from another corpus or from vectors its
        queries are not comparable with. (The vectors' bytes are not compared: a rebuild of the same passages
        by the same embedder on another CPU differs in them, and the run resumes on it, as its identity does.)
        ``gpu``: search on the GPU this actor reserved (its pool's ``num_gpus``), never on one merely visible."""
        import faiss

        from actors.bm25 import BM25Shard

        if built is not None:
            check_built(shard_dir, built, embedder)

        index = faiss.read_index(str(Path(shard_dir) / "index.faiss"))
        if nprobe is not None and _is_ivf(faiss, index):
            faiss.extract_index_ivf(index).nprobe = nprobe
        if ef_search is not None and hasattr(index, "hnsw"):
            index.hnsw.efSearch = ef_search
        self.index = _on_gpu(faiss, index) if gpu else index
        self.store = PassageStore(shard_dir)
        self.bm25 = BM25Shard(shard_dir, self.store) if bm25 else None

    def size(self) -> int:
        return self.index.ntotal

    def search(self, queries: np.ndarray, k: int) -> list[list[Passage]]:
        scores, rows = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        out = []
        for srow, rrow in zip(scores, rows):
            # equal scores (the same text under two ids) in row order, i.e. corpus order: FAISS returns
            # them reversed, so a search of depth 3 put another passage first than one of depth 1, and the
            # shards' merge kept other passages than one index did. Exact for Flat and IVF, which scan
            # rows in order; HNSW's choice among ties at the k-th place stays the graph's
            hits = sorted(((int(r), float(s)) for s, r in zip(srow, rrow) if r >= 0), key=lambda h: (-h[1], h[0]))
            out.append(self.store.passages([r for r, _ in hits], [s for _, s in hits]))
        return out

    def search_bm25(self, queries: list[str], k: int) -> list[list[Passage]]:
        if self.bm25 is None:
            raise RuntimeError("this shard was opened without BM25")
        return self.bm25.search(queries, k)


NOT_THE_SHARD = "is not the shard this run started with"  # the engine tells a user no resume can follow


def check_built(shard_dir: str, built: str, embedder: str | None = None) -> None:
    import json

    try:
        found = (json.loads((Path(shard_dir) / "done.json").read_text())["passages_sha256"],
                 json.loads((Path(shard_dir).parent / "manifest.json").read_text())["embedder"] if embedder else None)
    except (OSError, ValueError, KeyError, TypeError):
        found = None  # a shard or manifest being rebuilt: not the index the run started with either
    if found != (built, embedder):  # the marker and the advice first: the engine shows a cause's first 300 characters
        raise RuntimeError(f"the index was rebuilt, or is being rebuilt, in place (other passages, embedder or settings): "
                           f"{NOT_THE_SHARD}; "
                           "its committed rows are kept, a resume cannot follow: answer into a new --output, or "
                           f"restore the index the run started with ({shard_dir}: its done.json differs or is missing)")


def merge_topk(per_shard: list[list[list[Passage]]], k: int) -> list[list[Passage]]:
    """Global top-k per query across shards (higher score first; ties keep shard order, and within a
    shard row order: corpus order, as one index gives)."""
    merged = []
    for per_query in zip(*per_shard):
        candidates = [p for shard_hits in per_query for p in shard_hits]
        merged.append(sorted(candidates, key=lambda p: -p.score)[:k])
    return merged


def fuse_rrf(rankings: list[list[Passage]], weights: list[float], k: int, rrf_k: int = 60) -> list[Passage]:
    """Reciprocal rank fusion: score(p) = sum_i w_i / (rrf_k + rank_i(p)), rank from 1; top k."""
    scores: dict[str, float] = {}
    first: dict[str, Passage] = {}
    for ranking, w in zip(rankings, weights):
        for rank, p in enumerate(ranking, start=1):
            scores[p.id] = scores.get(p.id, 0.0) + w / (rrf_k + rank)
            first.setdefault(p.id, p)
    best = sorted(scores, key=lambda pid: -scores[pid])[:k]
    return [Passage(first[pid].id, first[pid].title, first[pid].text, scores[pid]) for pid in best]


def _is_ivf(faiss, index) -> bool:
    try:
        faiss.extract_index_ivf(index)
        return True
    except RuntimeError:
        return False


def _on_gpu(faiss, index):
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        raise RuntimeError(f"retrieval.num_gpus_per_shard > 0, but this FAISS ({faiss.__version__}) sees no GPU "
                           "(faiss-cpu, or no CUDA device visible): install the `.[gpu]` extra, or set it to 0")
    # the device Ray gave this actor is the first it sees (CUDA_VISIBLE_DEVICES); the resources live as long as it
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
