"""The index job against plain encoding (issue 19: index build within 10% of plain encode).

For each thread count T: ``SentenceTransformer.encode`` of the corpus in this process with T torch
threads (title + text as the index shows them, batch 64), then ``ragsift index`` over the same corpus
in a subprocess whose encoder actor runs T threads (``--set embedder.threads=T``; one replica, the
index's default 2 shards + BM25). Without the setting the job uses every core of the machine.
The ratio is the index job's throughput over plain encoding's; the job's figure is its own
``build_s`` (from the first batch read to the manifest, Ray start-up excluded).

    python benchmarks/index_speed.py --threads 1 2 [--corpus data/demo/sample_corpus.parquet] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plain_encode_s(texts: list[str], threads: int) -> float:
    import torch
    from sentence_transformers import SentenceTransformer

    from jobs.models import resolve

    torch.set_num_threads(threads)
    model = SentenceTransformer(resolve("all-minilm-l6-v2"), device="cpu")
    model.encode(texts[:64], batch_size=64)  # warm-up: first-call allocations are not encoding
    started = time.perf_counter()
    model.encode(texts, batch_size=64, normalize_embeddings=True)
    return time.perf_counter() - started


def index_job_s(corpus: str, threads: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "jobs.cli", "index", "--corpus", corpus, "--index-dir", out,
                        "--set", f"embedder.threads={threads}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        return json.loads((Path(out) / "manifest.json").read_text())["build_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(ROOT / "data/demo/sample_corpus.parquet"))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out")
    args = p.parse_args()
    import pyarrow.parquet as pq

    from jobs.index import embedding_text

    texts = [embedding_text(r["title"], r["text"]) for r in pq.read_table(args.corpus, columns=["title", "text"]).to_pylist()]
    rows = []
    for threads in args.threads:
        plain, job = plain_encode_s(texts, threads), index_job_s(args.corpus, threads)
        rows.append({"threads": threads, "passages": len(texts), "plain_encode_s": round(plain, 1),
                     "index_job_s": round(job, 1), "plain_per_s": round(len(texts) / plain, 1),
                     "index_per_s": round(len(texts) / job, 1), "ratio": round(plain / job, 3)})
        print(rows[-1], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"corpus": args.corpus, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
