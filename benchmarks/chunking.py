"""Whole articles against the same articles split by ``index.chunk_words``: dense and BM25 recall of the
gold article, and what k passages cost a prompt.

A user's corpus is often whole documents. This builds one from the 46k corpus: every title with at least
``--min-passages`` passages becomes one article (its passages joined in corpus order, id ``art<N>``),
and DEV questions whose gold passages all lie in those articles (none of the 200-question sample or the
evaluation slice; at most ``--questions-max``) are asked against (1) the articles as they are and (2)
the articles split into parts of each ``--chunk`` words (``ragsift index --chunk-words``, real MiniLM).
recall@k = the gold article among the articles of the top k passages (a part counts as its article,
jobs/chunks.py); words@k = the words of the k passages a reader would be shown.

    python benchmarks/chunking.py --corpus ../shared/data/corpus.parquet \
        --questions ../shared/data/questions_dev.parquet --out results/chunking.json
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KS = (1, 5, 20)
HERE = Path(__file__).resolve().parent.parent


def articles(corpus: str, min_passages: int) -> tuple[list[dict], dict[str, str]]:
    """The articles, and each passage id's article id."""
    import pyarrow.parquet as pq

    rows = pq.read_table(corpus, columns=["id", "title", "text"]).to_pylist()
    by_title: dict[str, list[dict]] = {}
    for r in rows:
        by_title.setdefault(r["title"], []).append(r)
    out, article_of = [], {}
    for title, passages in by_title.items():
        if len(passages) < min_passages:
            continue
        aid = f"art{len(out)}"
        out.append({"id": aid, "title": title, "text": "\n\n".join(p["text"] for p in passages)})
        article_of.update({p["id"]: aid for p in passages})
    return out, article_of


def questions(path: str, article_of: dict[str, str], most: int) -> list[dict]:
    import pyarrow.parquet as pq

    reported = {line.strip() for name in ("eval.txt",) for line in (HERE / "results" / "slices" / name).read_text().split()}
    reported |= set(pq.read_table(HERE / "data" / "demo" / "sample_questions.parquet", columns=["id"])["id"].to_pylist())
    by_dataset: dict[str, list[dict]] = {}
    for q in pq.read_table(path, columns=["id", "question", "dataset", "gold_passage_ids"]).to_pylist():
        gold = [g for g in q["gold_passage_ids"] or [] if g]
        if q["id"] not in reported and gold and all(g in article_of for g in gold):
            by_dataset.setdefault(q["dataset"], []).append({**q, "gold_articles": sorted({article_of[g] for g in gold})})
    # in turn from each dataset, in file order: SQuAD has nearly all such questions and would be all of them
    turns = [q for qs in itertools.zip_longest(*by_dataset.values()) for q in qs if q is not None]
    return turns[:most]


def build(corpus: str, index_dir: Path, overrides: list[str]) -> tuple[dict, float]:
    from jobs.index import IndexJobConfig, build_index
    from schemas.config import load_config

    config = load_config(IndexJobConfig, None, [f"index.path={index_dir}", "index.shards=1", *overrides], corpus=corpus)
    started = time.perf_counter()
    manifest = build_index(config, log=lambda *a, **k: None)
    return manifest, time.perf_counter() - started


def scores(index_dir: Path, rows: list[dict], encoder) -> dict:
    from actors.bm25 import BM25Shard
    from actors.retriever import ShardRetriever
    from jobs.chunks import passage_of

    shard = str(index_dir / "shard-000")
    texts = [q["question"] for q in rows]
    runs = {"dense": ShardRetriever(shard).search(encoder.encode(texts, "query"), max(KS)),
            "bm25": BM25Shard(shard).search(texts, max(KS))}
    out = {}
    for method, hits in runs.items():
        for k in KS:
            found = [bool(set(q["gold_articles"]) & {passage_of(p.id) for p in h[:k]}) for q, h in zip(rows, hits)]
            out[f"{method} recall@{k}"] = round(100 * sum(found) / len(found), 1)
        out[f"{method} words@5"] = round(sum(len(p.text.split()) for h in hits for p in h[:5]) / len(hits))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", required=True)
    p.add_argument("--questions", required=True)
    p.add_argument("--min-passages", type=int, default=3)
    p.add_argument("--questions-max", type=int, default=300)
    p.add_argument("--chunk", type=int, nargs="+", default=[100])
    p.add_argument("--work", default="/tmp/ragsift-chunking")
    p.add_argument("--out")
    args = p.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from actors.encoder import Encoder
    from jobs.models import resolve
    from schemas.config import EmbedderConfig

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    docs, article_of = articles(args.corpus, args.min_passages)
    pq.write_table(pa.Table.from_pylist(docs), work / "articles.parquet")
    rows = questions(args.questions, article_of, args.questions_max)
    words = sorted(len(d["text"].split()) for d in docs)
    print(f"{len(docs):,} articles (median {words[len(words) // 2]:,} words, max {words[-1]:,}); {len(rows)} questions")
    encoder = Encoder(resolve(EmbedderConfig().model))
    table = []
    for name, overrides in [("whole articles", []), *[(f"chunk_words={c}", [f"index.chunk_words={c}"])
                                                       for c in args.chunk]]:
        manifest, seconds = build(str(work / "articles.parquet"), work / name.replace("=", "_").replace(" ", "_"),
                                  overrides)
        table.append({"index": name, "passages": manifest["count"], "cut_by_embedder": manifest["cut_by_embedder"],
                      "build_s": round(seconds, 1), **scores(work / name.replace("=", "_").replace(" ", "_"), rows, encoder)})
        print(table[-1])
    head = list(table[0])
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for t in table:
        print("| " + " | ".join(str(t[c]) for c in head) + " |")
    if args.out:
        record = {"command": " ".join(sys.argv), "articles": len(docs), "questions": len(rows),
                  "datasets": dict(collections.Counter(q["dataset"] for q in rows)),
                  "embedder": EmbedderConfig().model, "min_passages": args.min_passages, "table": table}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
