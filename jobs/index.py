"""``ragsift index``: corpus Parquet -> embeddings -> N FAISS shards with passage stores + manifest.

The corpus is streamed in record batches through encoder actors (a bounded number of batches in
flight); each shard holds a contiguous range of rows and is written as ``shard-NNN/`` with
``index.faiss`` and ``passages.parquet`` (row i of the index is row i of the store).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import deque
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from jobs.cli import add_config_arguments, config_overrides, run_job
from jobs.io import open_parquet
from schemas.config import EmbedderConfig, IndexConfig, RayConfig, Section, load_config
from schemas.tables import CORPUS_OPTIONAL, CORPUS_REQUIRED, PASSAGES, check_schema

MANIFEST = "manifest.json"


class IndexJobConfig(Section):
    corpus: str | None = None
    index: IndexConfig = Field(default_factory=IndexConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    ray: RayConfig = Field(default_factory=RayConfig)


def read_manifest(index_dir: str | Path) -> dict:
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"no index at {index_dir} ({MANIFEST} missing); run `ragsift index` first")
    return json.loads(path.read_text())


def passage_text(title: str | None, text: str) -> str:
    return f"{title}\n{text}" if title else text


def build_index(config: IndexJobConfig, log=print, extra: dict | None = None) -> dict:
    """Build the shards and write the manifest (``extra`` adds fields to it, e.g. a corpus checksum)."""
    import faiss
    import ray

    from actors.encoder import Encoder
    from jobs.ray_session import init_ray

    corpus = open_parquet(config.corpus)
    has = check_schema(corpus.schema_arrow, CORPUS_REQUIRED, CORPUS_OPTIONAL, config.corpus)
    total_rows = corpus.metadata.num_rows
    if total_rows == 0:
        raise ValueError(f"{config.corpus}: the corpus has no rows")
    out = Path(config.index.path)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = min(config.index.shards, total_rows)
    bounds = [total_rows * s // n_shards for s in range(n_shards + 1)]

    init_ray(config.ray)
    emb = config.embedder
    EncoderActor = ray.remote(Encoder).options(num_cpus=emb.num_cpus, num_gpus=emb.num_gpus)
    encoders = [EncoderActor.remote(emb.model, emb.batch_size, emb.device) for _ in range(emb.replicas)]
    dims = ray.get(encoders[0].dims.remote())

    started = time.perf_counter()
    shards = [_ShardWriter(out / f"shard-{s:03d}", faiss.IndexFlatIP(dims)) for s in range(n_shards)]
    skipped = {"null_text": 0, "null_id": 0, "duplicate_id": 0}
    seen: set[str] = set()
    in_flight: deque = deque()  # (rows, vectors ref), in corpus order
    row = 0

    def drain(limit: int) -> None:
        while len(in_flight) > limit:
            rows, ref = in_flight.popleft()
            vectors = ray.get(ref)
            for (i, rec), vec in zip(rows, vectors):
                shards[_shard_of(i, bounds)].add(rec, vec)

    columns = ["id", "text"] + (["title"] if "title" in has else [])
    for batch in corpus.iter_batches(batch_size=config.index.encode_batch_rows, columns=columns):
        data = batch.to_pydict()
        titles = data.get("title") or [None] * batch.num_rows
        rows = []
        for pid, text, title in zip(data["id"], data["text"], titles):
            i, row = row, row + 1
            problem = ("null_id" if pid is None else "null_text" if not text or not text.strip()
                       else "duplicate_id" if pid in seen else None)
            if problem:
                skipped[problem] += 1
                continue
            seen.add(pid)
            rows.append((i, {"id": pid, "title": title or "", "text": text}))
        if rows:
            texts = [passage_text(r["title"], r["text"]) for _, r in rows]
            in_flight.append((rows, encoders[len(in_flight) % len(encoders)].encode.remote(texts)))
        drain(2 * len(encoders))
        log(f"indexed {row:,}/{total_rows:,} rows", end="\r")
    drain(0)
    shard_entries = [s.close() for s in shards]

    manifest = {
        "format": 1,
        "embedder": emb.model,
        "dims": dims,
        "metric": "inner_product",
        "normalized": True,
        "index_type": config.index.index_type,
        "corpus": config.corpus,
        "count": sum(s["count"] for s in shard_entries),
        "skipped": skipped,
        "shards": shard_entries,
        "build_s": round(time.perf_counter() - started, 2),
        **(extra or {}),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    log(f"indexed {manifest['count']:,} passages into {n_shards} shards at {out} "
        f"in {manifest['build_s']} s (skipped: {skipped})")
    return manifest


def _shard_of(row: int, bounds: list[int]) -> int:
    for s in range(len(bounds) - 1):
        if row < bounds[s + 1]:
            return s
    return len(bounds) - 2


class _ShardWriter:
    def __init__(self, path: Path, index):
        path.mkdir(parents=True, exist_ok=True)
        self.path, self.index, self.rows, self.vectors, self.count = path, index, [], [], 0
        self.writer = pq.ParquetWriter(path / "passages.parquet", PASSAGES, compression="zstd")

    def add(self, record: dict, vector) -> None:
        self.rows.append(record)
        self.vectors.append(vector)
        if len(self.rows) >= 4096:
            self._flush()

    def _flush(self) -> None:
        import numpy as np

        if self.rows:
            self.index.add(np.stack(self.vectors))
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=PASSAGES))
            self.count += len(self.rows)
            self.rows, self.vectors = [], []

    def close(self) -> dict:
        import faiss

        self._flush()
        self.writer.close()
        faiss.write_index(self.index, str(self.path / "index.faiss"))
        digest = hashlib.sha256((self.path / "index.faiss").read_bytes()).hexdigest()
        return {"dir": self.path.name, "count": self.count, "index_sha256": digest}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", help="corpus Parquet (id, text[, title]); any pyarrow/fsspec URI")
    p.add_argument("--index-dir", help="output directory (index.path)")
    p.add_argument("--shards", type=int, help="number of FAISS shards (index.shards)")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    overrides = config_overrides(args, {"index_dir": "index.path", "shards": "index.shards"})
    config = load_config(IndexJobConfig, args.config, overrides, corpus=args.corpus)
    if not config.corpus:
        raise ValueError("no corpus given: pass --corpus or set `corpus` in the config")
    build_index(config, log=lambda *a, **k: print(*a, **k, file=sys.stderr))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_job("index", argv)


if __name__ == "__main__":
    sys.exit(main())
