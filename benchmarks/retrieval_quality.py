"""Retrieval quality against gold passages: recall@1/5/20 and MRR per dataset for BM25, dense,
hybrid (reciprocal rank fusion), hybrid + rerank and hybrid + rerank fused (the reranker's order and
hybrid's, RRF), on an index built by ``ragsift index``.

recall@k = mean over questions of |gold in top k| / |gold|; MRR = mean of 1 / rank of the first
gold passage (0 when none in the top 20). Only questions with gold passages count. The rerank step
rescores the hybrid top 20 with ``--reranker`` (a CrossEncoder name/path, or a bi-encoder M_rel from
``ragsift train relevance``) or, without one, with the
embedder's cosine (the labelled bi-encoder fallback; no cross-encoder weights exist offline).

    ragsift index --corpus ../shared/data/sample/sample_corpus.parquet --index-dir /tmp/idx
    python benchmarks/retrieval_quality.py --index-dir /tmp/idx \
        --questions ../shared/data/sample/sample_questions.parquet --out BENCH_retrieval.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEPTH = 20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index-dir", required=True)
    p.add_argument("--questions", required=True)
    p.add_argument("--per-dataset", type=int, default=None, help="at most this many questions per dataset")
    p.add_argument("--reranker", default=None, help="CrossEncoder name/path (default: bi-encoder cosine fallback)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args()

    import pyarrow.parquet as pq

    from actors.bm25 import BM25Shard
    from actors.encoder import Encoder
    from actors.retriever import ShardRetriever, fuse_rrf, merge_topk
    from jobs.index import read_manifest
    from jobs.models import resolve
    from schemas.config import RetrievalConfig
    from schemas.records import Rank

    manifest = read_manifest(args.index_dir)
    rows = [q for q in pq.read_table(args.questions).to_pylist() if q.get("gold_passage_ids")]
    if args.per_dataset:
        seen = defaultdict(int)
        kept = []
        for q in rows:
            seen[q["dataset"]] += 1
            if seen[q["dataset"]] <= args.per_dataset:
                kept.append(q)
        rows = kept
    texts = [q["question"] for q in rows]
    dirs = [str(Path(args.index_dir) / s["dir"]) for s in manifest["shards"]]
    encoder = Encoder(resolve(manifest["embedder"]))
    timings = {}

    started = time.perf_counter()
    vectors = encoder.encode(texts, "query")
    timings["encode_queries_per_s"] = len(texts) / (time.perf_counter() - started)
    started = time.perf_counter()
    dense = merge_topk([ShardRetriever(d).search(vectors, DEPTH) for d in dirs], DEPTH)
    timings["dense_search_s"] = time.perf_counter() - started
    started = time.perf_counter()
    bm25 = merge_topk([BM25Shard(d).search(texts, DEPTH) for d in dirs], DEPTH)
    timings["bm25_search_s"] = time.perf_counter() - started
    rc = RetrievalConfig()
    hybrid = [fuse_rrf([d, b], [rc.dense_weight, rc.bm25_weight], DEPTH, rc.rrf_k) for d, b in zip(dense, bm25)]

    if args.reranker:
        from actors.reranker import BiEncoderRanker, ranker_class

        kind = ranker_class(resolve(args.reranker))
        ranker = kind(resolve(args.reranker))
        ranker_name = f"{'bi-encoder' if kind is BiEncoderRanker else 'cross-encoder'}:{args.reranker}"
    else:
        ranker, ranker_name = encoder, f"bi-encoder-cosine:{manifest['embedder']} (fallback)"
    started = time.perf_counter()
    # passages as RA-ISF's relevance judge and `ragsift train relevance` show them: with their title
    rankings = ranker.rank([Rank(q, tuple(p.shown for p in h), len(h)) for q, h in zip(texts, hybrid)])
    timings["rerank_s"] = time.perf_counter() - started
    reranked = [[h[i] for i in r.indices] for h, r in zip(hybrid, rankings)]

    # the reranker's order fused with hybrid's (RRF, 1:1): a ranker that sees only the embedder's kind of
    # evidence (a bi-encoder) would otherwise drop what BM25 contributed to the order
    fused = [fuse_rrf([r, h], [1.0, 1.0], DEPTH, rc.rrf_k) for r, h in zip(reranked, hybrid)]
    methods = {"bm25": bm25, "dense": dense, "hybrid": hybrid, "hybrid+rerank": reranked,
               "hybrid+rerank fused": fused}
    table = []
    datasets = sorted({q["dataset"] for q in rows})
    for method, results in methods.items():
        for dataset in [*datasets, "ALL"]:
            picked = [(q, r) for q, r in zip(rows, results) if dataset in ("ALL", q["dataset"])]
            table.append({"method": method, "dataset": dataset, "n": len(picked),
                          **{f"recall@{k}": round(100 * _mean(_recall(q, r, k) for q, r in picked), 1) for k in (1, 5, 20)},
                          "mrr": round(_mean(_rr(q, r) for q, r in picked), 3)})

    print(f"index {args.index_dir}: {manifest['count']:,} passages, {len(dirs)} shards, {manifest['embedder']}; "
          f"{len(rows)} questions with gold; ranker {ranker_name}")
    print("\n| method | dataset | n | R@1 | R@5 | R@20 | MRR |\n|---|---|---|---|---|---|---|")
    for t in table:
        cells = [t[c] for c in ("method", "dataset", "n", "recall@1", "recall@5", "recall@20", "mrr")]
        print("| " + " | ".join(map(str, cells)) + " |")
    print("\n" + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"index": args.index_dir, "ranker": ranker_name, "timings": timings,
                                              "table": table}, indent=2))
    return 0


def _recall(q, results, k) -> float:
    gold = set(q["gold_passage_ids"])
    return len(gold & {p.id for p in results[:k]}) / len(gold)


def _rr(q, results) -> float:
    gold = set(q["gold_passage_ids"])
    return next((1 / rank for rank, p in enumerate(results, start=1) if p.id in gold), 0.0)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


if __name__ == "__main__":
    sys.exit(main())
