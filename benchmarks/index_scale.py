"""Index build at scale: peak memory and wall time of ``build_index`` on synthetic corpora, and the
cost of sharding searches.

    python benchmarks/index_scale.py build 1000000 5000000   # one fresh process per size
    python benchmarks/index_scale.py shards 200000           # N = 1, 2, 4 Flat shards vs one index

``build``: a synthetic corpus of short random-word passages is written to Parquet (streamed), then
indexed as IVF-PQ shards with BM25 through the real job (``build_index``: corpus streaming, encoder
actor, memory-mapped spill, per-shard FAISS training/adding, bm25s, manifest). The encoder is a
stand-in that returns random unit vectors (benchmark only), so the figures are the index job's own
memory and time, not a model's; encoder throughput is measured separately (BENCHMARKS.md). Peak RSS
is sampled every 0.2 s over the driver and its descendants (Ray's head processes and workers; psutil).

``shards``: the same vectors in 1, 2 and 4 Flat shards; 1,000 queries searched on each shard and
merged (``merge_topk``) vs one index: the hits must be identical; the time ratio is the overhead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIMS = 384
SYLLABLES = [a + b for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "is", "on", "ul")]


class RandomEncoder:
    """Random unit vectors, one generator per batch (benchmark stand-in for a real encoder)."""

    def dims(self):
        return DIMS

    def longer_than_read(self, texts):
        return [False] * len(texts)

    def encode(self, texts, role=None):
        import zlib

        import numpy as np

        rng = np.random.default_rng(zlib.crc32(texts[0].encode()) if texts else 0)
        v = rng.standard_normal((len(texts), DIMS), dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def write_corpus(path: Path, rows: int, batch: int = 100_000) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    words = np.array([a + b + c for a in SYLLABLES for b in SYLLABLES[:40] for c in ("", "s", "x")])  # 57,600
    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])) as w:
        for start in range(0, rows, batch):
            n = min(batch, rows - start)
            picks = words[rng.integers(0, len(words), (n, 12))]
            texts = [" ".join(p) for p in picks]
            w.write_table(pa.table({"id": [f"s{start + i}" for i in range(n)], "title": [""] * n, "text": texts}))


def peak_rss_sampler(stop: threading.Event, out: dict) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        procs = [me] + me.children(recursive=True)  # Ray's head processes and workers started by this driver
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        out["driver"] = max(out.get("driver", 0), me.memory_info().rss)
        out["total"] = max(out.get("total", 0), total)
        stop.wait(0.2)


def build_one(rows: int, shards: int) -> dict:
    import ray

    from jobs.index import IndexJobConfig, build_index
    from schemas.config import load_config

    with tempfile.TemporaryDirectory(dir=os.environ.get("SCALE_TMP")) as tmp:
        corpus = Path(tmp) / "corpus.parquet"
        started = time.perf_counter()
        write_corpus(corpus, rows)
        corpus_s = time.perf_counter() - started
        config = load_config(IndexJobConfig, None, [
            f"index.path={tmp}/idx", f"index.shards={shards}", "index.index_type=ivf_pq", "index.pq_m=48",
            "index.nlist=1024", "index.encode_batch_rows=8192", "ray.num_cpus=2"], corpus=str(corpus))
        stop, peak = threading.Event(), {}
        sampler = threading.Thread(target=peak_rss_sampler, args=(stop, peak), daemon=True)
        sampler.start()
        started = time.perf_counter()
        from jobs.ray_session import init_ray

        init_ray(config.ray)
        encoder = [ray.remote(RandomEncoder).options(num_cpus=0).remote()]
        manifest = build_index(config, log=lambda *a, **k: None, encoders=encoder)
        wall = time.perf_counter() - started
        stop.set()
        sampler.join()
        disk = sum(f.stat().st_size for f in Path(tmp, "idx").rglob("*") if f.is_file())
        ray.shutdown()
    return {"rows": rows, "shards": shards, "count": manifest["count"], "index": manifest["shards"][0]["factory"],
            "wall_s": round(wall, 1), "corpus_write_s": round(corpus_s, 1),
            "peak_rss_driver_mb": round(peak["driver"] / 2**20), "peak_rss_total_mb": round(peak["total"] / 2**20),
            "index_disk_mb": round(disk / 2**20)}


def shard_overhead(rows: int, queries: int = 1000, k: int = 10) -> list[dict]:
    import faiss
    import numpy as np

    from actors.retriever import merge_topk
    from schemas.records import Passage

    rng = np.random.default_rng(1)
    xb = rng.standard_normal((rows, DIMS), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = xb[rng.integers(0, rows, queries)] + 0.1 * rng.standard_normal((queries, DIMS), dtype=np.float32)

    def search(index, offset):
        scores, ids = index.search(xq, k)
        return [[Passage(str(offset + i), "", "", float(s)) for s, i in zip(sr, ir)] for sr, ir in zip(scores, ids)]

    out, reference = [], None
    for n in (1, 2, 4):
        bounds = [rows * s // n for s in range(n + 1)]
        indexes = []
        for a, b in zip(bounds, bounds[1:]):
            index = faiss.IndexFlatIP(DIMS)
            index.add(xb[a:b])
            indexes.append((index, a))
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            merged = merge_topk([search(index, a) for index, a in indexes], k)
            best = min(best, time.perf_counter() - started)
        ids = [[p.id for p in r] for r in merged]
        reference = reference or (ids, best)
        out.append({"shards": n, "search_s": round(best, 3), "queries_per_s": round(queries / best),
                    "identical_to_one_index": ids == reference[0],
                    "overhead_pct": round(100 * (best / reference[1] - 1), 1)})
    return out


def main() -> int:
    mode, sizes = sys.argv[1], [int(x) for x in sys.argv[2:]]
    if mode == "build-one":
        print(json.dumps(build_one(sizes[0], sizes[1])))
        return 0
    for rows in sizes:
        if mode == "build":
            shards = max(1, rows // 1_250_000)
            proc = subprocess.run([sys.executable, __file__, "build-one", str(rows), str(shards)],
                                  stdout=subprocess.PIPE, text=True, check=True)
            results = [json.loads(proc.stdout.strip().splitlines()[-1])]
        else:
            results = [{"rows": rows, **r} for r in shard_overhead(rows)]
        for result in results:
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
