"""``ragsift index``: corpus Parquet -> embeddings -> N self-contained shards + manifest.

The corpus is streamed in record batches through encoder actors (a bounded number of batches in
flight). Shard s holds a contiguous range of corpus rows; while it fills, its vectors spill to a
memory-mapped ``vectors.npy`` and its passages to ``passages.parquet``. When the stream passes the
end of a shard, the shard is built from disk (FAISS index trained on a sample when it needs it,
added in chunks; BM25 with bm25s) and committed with ``done.json``. A rerun skips committed shards,
so a crash re-does only the unfinished one.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import shutil
import sys
import time
from collections import Counter, deque
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, field_validator

from jobs.chunks import count, part_id, passage_of, split
from jobs.cli import add_config_arguments, config_overrides, run_job
from jobs.lease import LEASE, Lease
from jobs.models import REGISTRY, encoder_roles, loadable, model_files
from jobs.storage import (
    cannot_write,
    check_kept,
    file_sha256,
    filesystem,
    hash_ids,
    open_parquet,
    read_only,
    redact,
    text_values,
    unwritable,
)
from schemas.config import EmbedderConfig, IndexConfig, RayConfig, Section, device_of, home_expanded, load_config
from schemas.errors import UserError
from schemas.tables import CORPUS_OPTIONAL, CORPUS_REQUIRED, PASSAGES, check_schema

MANIFEST = "manifest.json"
ASIDE = "_manifest.before-bm25.json"  # the manifest while shards' BM25 are rebuilt (_retokenize)
FORMAT = 2  # 2: per-shard done.json, BM25, index_factory types
ADD_CHUNK = 65_536  # vectors added to a FAISS index per call


class IndexJobConfig(Section):
    corpus: str | None = None
    index: IndexConfig = Field(default_factory=IndexConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("corpus")
    @classmethod
    def _home(cls, value):
        return home_expanded(value)


def read_manifest(index_dir: str | Path) -> dict:
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        if (Path(index_dir) / LEASE).exists():  # a build holds the folder: its manifest comes when it ends
            raise FileNotFoundError(f"no index at {index_dir} yet: a `ragsift index` build holds it ({LEASE}) and writes "
                                    f"its {MANIFEST} when done; rerun once it is (or, if that build was killed, rerun it)")
        raise FileNotFoundError(f"no index at {index_dir} ({MANIFEST} missing); run `ragsift index` first")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"{path} is damaged ({err}); rebuild the index with `ragsift index`") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise UserError(f"{path} is damaged (not a manifest: no list of shards); rebuild the index with `ragsift index`")
    return manifest


# what a rebuild of the same passages with the same settings changes by itself: the build's time, the
# corpus file (its path and bytes: a copy elsewhere, or the same passages written again, is the same corpus;
# each shard's passages_sha256 says what it holds)
# and the vectors' bytes (the embedder's float arithmetic differs in its last bits between CPUs)
REBUILD_NOISE = {"build_s", "corpus", "corpus_sha256"}
SHARD_REBUILD_NOISE = {"build_key", "index_sha256"}


def manifest_sha256(index_dir: str | Path) -> str | None:
    """A digest of what the index's manifest says decides retrieval (embedder, settings, each shard's
    passages and counts): it changes when the index holds other passages or is built another way, not
    when the same one is rebuilt (so a long run resumes against an index rebuilt on a new machine)."""
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        return None
    manifest = {k: v for k, v in read_manifest(index_dir).items() if k not in REBUILD_NOISE}
    manifest["shards"] = [{k: v for k, v in shard.items() if k not in SHARD_REBUILD_NOISE}
                          for shard in manifest.get("shards", [])]
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def index_chunks(index_dir: str | Path) -> dict | None:
    """How the index split its passages (``chunk_words``: words, overlap); None for passages as they are."""
    try:
        return read_manifest(index_dir).get("chunks")
    except (FileNotFoundError, UserError):
        return None


def embedding_text(title: str | None, text: str) -> str:
    return f"{title}\n{text}" if title else text


def factory_string(index: IndexConfig, dims: int | None, count: int) -> str:
    """The FAISS ``index_factory`` description for a shard of ``count`` vectors (``dims`` None: the
    embedder not started yet, every check but pq_m's)."""
    if index.index_type == "flat" or count == 0:
        return "Flat"
    if index.index_type == "hnsw":
        return f"HNSW{index.hnsw_m},Flat"
    trained_on = min(count, index.train_sample)  # FAISS trains on a sample: it needs a point per list / code
    nlist = min(index.nlist or max(1, int(4 * math.sqrt(count))), trained_on)
    if index.index_type == "ivf_flat":
        return f"IVF{nlist},Flat"
    if dims is not None and dims % index.pq_m:
        raise UserError(f"index.pq_m={index.pq_m} must divide the embedding dimension {dims}")
    if trained_on < 2 ** index.pq_bits:
        # only what can work for this shard: a larger sample only where the shard has more than it
        fixes = ["fewer shards"] * (index.shards > 1) + ["a larger index.train_sample"] * (
            index.train_sample < count) + [f"index.pq_bits of at most {trained_on.bit_length() - 1}"] * (
            trained_on >= 2) + ["index_type flat"]
        raise UserError(f"index.index_type=ivf_pq needs at least 2**pq_bits={2 ** index.pq_bits} passages "
                        f"per shard to train its codebooks (a shard has {count}, index.train_sample is "
                        f"{index.train_sample}); use " + (", ".join(fixes[:-1]) + " or " if fixes[:-1] else "") + fixes[-1])
    return f"IVF{nlist},PQ{index.pq_m}x{index.pq_bits}"


# whole lines now and then, not a carriage-return counter: a job's log is a file, where "\r" joins lines
PROGRESS_EVERY_S = 10.0


def corpus_parquet(uri: str, index_dir: Path, log) -> str:
    """``uri`` itself for Parquet with text columns; a JSON Lines / CSV corpus (FlashRAG's ``contents``
    too), or a Parquet one whose ids or texts are numbers, is first streamed into
    ``<index>/_corpus.parquet``, which the build then reads like any corpus."""
    from jobs.formats import is_foreign, to_parquet

    if not is_foreign(uri) and _texts(uri):
        return uri
    index_dir.mkdir(parents=True, exist_ok=True)
    target = str(index_dir / "_corpus.parquet")
    rows = to_parquet(uri, target, ["id", "text", "title"], required=["id", "text"])
    log(f"corpus {redact(uri)}: {rows:,} rows converted to {target}")
    return target


def _texts(uri: str) -> bool:
    """Whether a Parquet corpus's id / text / title columns are all text (numbers are read as text, as
    in JSON Lines and CSV: a table written from a DataFrame often has integer ids)."""
    schema = open_parquet(uri).schema_arrow
    textual = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary,
               pa.types.is_nested, pa.types.is_null)  # bytes are read as they are; a nested column is refused by the
    # schema check; an all-null column (pandas writes one so) needs no copy
    return all(any(kind(schema.field(name).type) for kind in textual)
               for name in ("id", "text", "title") if name in schema.names)


def build_index(config: IndexJobConfig, log=print, extra: dict | None = None, encoders: list | None = None) -> dict:
    """Build (or finish building) the shards and write the manifest, one build of an index folder at a
    time (two demos, or two `ragsift index`, each removed the shard the other was writing and both failed).

    ``extra`` adds fields to the manifest (e.g. a corpus checksum); ``encoders`` replaces the encoder
    actors (any actors with ``dims()``, ``encode(texts)`` and ``longer_than_read(texts)``; the scale
    benchmark uses this).
    """
    check_kept(config.index.path, "--index-dir")
    model = loadable(config.embedder.model) if encoders is None else None  # mistyped: one line, no folder made
    out = Path(config.index.path)
    fresh = not out.exists()
    if read_only(str(out)):
        # a shared index on a read-only mount (a script that builds it where it can and else finds it up to
        # date): no lease, which is a file; a build that has to write says so before Ray starts
        try:
            return _build_index(config, log, extra, encoders, model, writable=False)
        except OSError as err:  # a JSON Lines corpus's Parquet copy goes into the index folder
            if not unwritable(err):
                raise
            raise cannot_write(out, f"checking it against this corpus needs to ({err})",
                               "run `ragsift index` where it can be written") from err
    try:
        with Lease(str(out), log=log, flag="--index-dir"):
            return _build_index(config, log, extra, encoders, model)
    except BaseException:
        if fresh and out.is_dir() and not any(out.iterdir()):  # refused before anything was written
            out.rmdir()
        raise


def _build_index(config: IndexJobConfig, log, extra: dict | None, encoders: list | None, model: str | None,
                 writable: bool = True) -> dict:
    import ray

    from jobs.ray_session import init_ray

    corpus = open_parquet(corpus_parquet(config.corpus, Path(config.index.path), log))
    has = check_schema(corpus.schema_arrow, CORPUS_REQUIRED, CORPUS_OPTIONAL, config.corpus)
    total_rows = corpus.metadata.num_rows
    if total_rows == 0:
        raise UserError(f"{config.corpus}: the corpus has no rows")
    out = Path(config.index.path)
    n_shards = min(config.index.shards, total_rows)
    bounds = [total_rows * s // n_shards for s in range(n_shards + 1)]
    # the corpus's bytes, not only its path and length: a corpus rewritten in place with as many rows
    # (corrected texts) resumed on its old shards
    corpus_sha = file_sha256(*filesystem(config.corpus))  # the file given: a JSONL's Parquet copy is rewritten
    roles = bool(model) and encoder_roles(model)  # queries and passages encoded each its own way (actors/encoder.py)
    build_key = _build_key(config, total_rows, bounds, corpus_sha, roles=roles)
    # shards committed before the key left out the corpus's path carry the key with it, as it was typed
    keys = {build_key, _build_key(config, total_rows, bounds, corpus_sha, config.corpus, roles=roles)}
    done = {s: info for s in range(n_shards) if (info := _committed(out / _dir(s), keys))}
    built = [done[s] for s in range(n_shards)] if len(done) == n_shards else None
    on_disk = _current(out, built, extra, MANIFEST) if built else None
    # a BM25 refresh killed midway left its manifest aside (_retokenize): still the build's, but for BM25
    previous = on_disk or (_current(out, built, extra, ASIDE) if built else None)
    stale = _stale_bm25(out, [done[s] for s in sorted(done)]) if config.index.bm25 else []
    if not writable and not (on_disk and not stale and on_disk.get("bm25") == _bm25_settings(config.index)):
        raise cannot_write(out, "it is not up to date with this corpus and these settings",
                           "build it where it can be written")
    # shards whose BM25 another ragsift tokenized (Chinese / Japanese were one token a clause)
    if config.index.bm25:
        _retokenize(out, stale, config.index, log)
        if previous:  # every shard is now tokenized as this ragsift does (k1 and b are in the build key)
            # the manifest again, with this ragsift's BM25 settings: no Ray, no encoder (it encodes nothing)
            previous = {**previous, "bm25": _bm25_settings(config.index)}
    if previous and previous.get("bm25") == _bm25_settings(config.index):
        # BM25 refreshed now, or by a run killed midway (its manifest set aside, maybe already right but for its place)
        if on_disk != previous or not (out / MANIFEST).exists():
            (out / f"{MANIFEST}.tmp").write_text(json.dumps(previous, indent=2))
            os.replace(out / f"{MANIFEST}.tmp", out / MANIFEST)
        if (out / ASIDE).exists():  # not unlink(missing_ok): on a read-only mount that fails, the file missing or not
            (out / ASIDE).unlink()
        # nothing to build: no Ray, no encoder start, and the manifest's build_s stays the build's
        log(f"{out} is up to date: {n_shards} shards built from this corpus with these settings")
        return previous
    if done:
        log(f"resuming: {len(done)} of {n_shards} shards already built")

    # settings that cannot build a shard are refused now, before an index in place is touched or a row
    # encoded (a pq_m not dividing dims was found after a whole shard was encoded and the old one wiped),
    # on the rows each shard keeps: its raw rows passed, and the rows without text or with a repeated id
    # left it too small after the old index was gone; what needs no embedder before it starts (~20 s)
    first, parts = _first_occurrences(corpus, config.index)
    if not first.any():  # an index of nothing would answer every question from no passage
        raise UserError(f"{config.corpus}: no row of its {total_rows:,} can be indexed (no text, no id, "
                        "not UTF-8, or a repeated id)")
    kept = np.where(first, parts, 0).astype(np.int64)  # the passages each row becomes in the index
    passages = [int(kept[bounds[s]:bounds[s + 1]].sum()) for s in range(n_shards)]
    for s in range(n_shards):
        if s not in done:
            factory_string(config.index, None, passages[s])
    out.mkdir(parents=True, exist_ok=True)

    emb = config.embedder  # a local Ray is sized to place every encoder replica (one it cannot place stalls the build)
    init_ray(config.ray, emb.num_cpus * emb.replicas, {k: v * emb.replicas for k, v in emb.resources.items()},
             (emb.num_gpus,) * emb.replicas)
    if encoders is None:
        from actors.encoder import Encoder

        actor = ray.remote(Encoder).options(**encoder_options(emb))
        threads = encoder_threads(emb, len(os.sched_getaffinity(0)))  # the cores this job may use
        log(f"{emb.replicas} encoder replica(s) of {threads} thread(s)")
        # cpu unless the replica reserved a GPU: "cuda when available" encoded on a GPU Ray did not give it
        encoders = [actor.remote(model, emb.batch_size, device_of(emb), threads) for _ in range(emb.replicas)]
    dims = ray.get(encoders[0].dims.remote())
    started = time.perf_counter()
    for s in range(n_shards):  # pq_m against the embedder's dims
        if s not in done:
            factory_string(config.index, dims, passages[s])
    if len(done) < n_shards:  # until the new manifest is written, no run may read the old one over shards being rebuilt
        (out / MANIFEST).unlink(missing_ok=True)

    builders: dict[int, _ShardBuilder] = {}
    in_flight: deque = deque()  # (end row of the batch, [(shard, record)], vectors ref, cut ref), in corpus order

    def drain(limit: int) -> None:
        while len(in_flight) > limit:
            end, rows, ref, cut_ref = in_flight.popleft()
            vectors, cut = ray.get([ref, cut_ref]) if ref is not None else (None, None)
            for n, (s, record) in enumerate(rows):
                builders[s].add(record, vectors[n], cut[n])
            for s in [s for s in builders if bounds[s + 1] <= end and s not in done]:
                done[s] = builders.pop(s).finish(config.index, dims, build_key, log)

    columns = ["id", "text"] + (["title"] if "title" in has else [])
    row, shard = 0, 0
    last_line = started
    turn = itertools.count()  # encoders take batches in turn (the queue's length is 2 x replicas once full)
    for batch in corpus.iter_batches(batch_size=config.index.encode_batch_rows, columns=columns):
        data = {name: text_values(batch.column(name)) for name in batch.schema.names}
        titles = data.get("title") or [None] * batch.num_rows
        rows = []
        for pid, text, title in zip(data["id"], data["text"], titles):
            i, row = row, row + 1
            while i >= bounds[shard + 1]:
                shard += 1
            if shard in done:
                continue
            if shard not in builders:
                builders[shard] = _ShardBuilder(out / _dir(shard), passages[shard], dims)
            problem = skip_reason(pid, text, title) or ("duplicate_id" if not first[i] else None)
            if problem:
                builders[shard].skipped[problem] += 1
                continue
            if parts[i] == 1:
                rows.append((shard, {"id": pid, "title": title or "", "text": text}))
                continue
            builders[shard].split += 1
            rows.extend((shard, {"id": part_id(pid, n), "title": title or "", "text": piece})
                        for n, piece in enumerate(split(text, config.index.chunk_words, config.index.chunk_overlap)))
        texts = [embedding_text(r["title"], r["text"]) for _, r in rows]
        encoder = encoders[next(turn) % len(encoders)]
        ref, cut_ref = ((encoder.encode.remote(texts, "document"), encoder.longer_than_read.remote(texts)) if texts
                        else (None, None))
        in_flight.append((row, rows, ref, cut_ref))
        drain(2 * len(encoders))
        if time.perf_counter() - last_line >= PROGRESS_EVERY_S:
            last_line = time.perf_counter()
            log(f"read {row:,}/{total_rows:,} rows ({100 * row / total_rows:.0f}%), "
                f"{row / (last_line - started):,.0f} rows/s")
    drain(0)

    shards = [done[s] for s in range(n_shards)]
    skipped = Counter({"null_text": 0, "null_id": 0, "duplicate_id": 0, "invalid_utf8": 0})
    for s in shards:
        skipped.update(s["skipped"])
    manifest = {
        "format": FORMAT,
        "embedder": config.embedder.model,
        "dims": dims,
        # passages encoded as documents, which its queries then are not without: said only for an embedder that
        # encodes the two its own ways (a MiniLM index's manifest, and so its digest, stays as it was)
        **({"encoder_roles": True} if roles else {}),
        "metric": "inner_product",
        "normalized": True,
        "index_type": config.index.index_type,
        "bm25": _bm25_settings(config.index),
        # read from anywhere; an index folder is copied and shared: no credentials in it
        "corpus": redact(config.corpus) if "://" in config.corpus else os.path.abspath(config.corpus),
        "corpus_sha256": corpus_sha,
        "count": sum(s["count"] for s in shards),
        "skipped": dict(skipped),
        # passages the embedder read only the start of; None (unknown) if a shard was built before it was counted
        "cut_by_embedder": (None if any("cut_by_embedder" not in s for s in shards)
                            else sum(s["cut_by_embedder"] for s in shards)),
        "shards": shards,
        # absent for an index of passages as they are (an index built before chunking keeps its manifest's digest)
        **({"chunks": {"words": config.index.chunk_words, "overlap": config.index.chunk_overlap,
                       "split": sum(s.get("split", 0) for s in shards)}} if config.index.chunk_words else {}),
        "build_s": round(time.perf_counter() - started, 2),
        **(extra or {}),
    }
    # whole or not at all: a build killed while writing it left a damaged manifest no run could read
    (out / f"{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=2))
    os.replace(out / f"{MANIFEST}.tmp", out / MANIFEST)
    for old in sorted(out.glob("shard-*")):  # a rebuild into fewer shards left the old ones past them, unread
        if old.is_dir() and old.name[6:].isdigit() and int(old.name[6:]) >= n_shards:
            shutil.rmtree(old)
            log(f"removed {old.name}, a shard of the index this build replaced")
    log(f"indexed {manifest['count']:,} passages into {n_shards} shards at {out} "
        f"in {manifest['build_s']} s (skipped: {dict(skipped)})")
    if cut := manifest["cut_by_embedder"]:
        log(f"warning: {cut:,} of {manifest['count']:,} passages are longer than {config.embedder.model} reads: dense "
            "retrieval finds them by their start only, and k such passages may not fit a prompt; "
            + (f"split them smaller than --chunk-words {config.index.chunk_words} (README: long passages)"
               if config.index.chunk_words else "split them: --chunk-words 100 (README: long passages)"))
    return manifest


def _current(out: Path, shards: list[dict], extra: dict | None, name: str = MANIFEST) -> dict | None:
    """The index's manifest (``name``), when it lists exactly ``shards`` (each built with this build's key:
    corpus, embedder, settings) and holds ``extra``; None when it must be written again. (Its BM25 settings,
    whose tokenization is no setting of the build key, the caller compares.)"""
    try:
        manifest = json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    fresh = manifest.get("format") == FORMAT and manifest.get("shards") == shards
    return manifest if fresh and all(manifest.get(k) == v for k, v in (extra or {}).items()) else None


def _stale_bm25(out: Path, shards: list[dict]) -> list[dict]:
    """The committed shards whose BM25 index was tokenized otherwise than this ragsift tokenizes."""
    from actors.bm25 import TOKENIZATION, built_tokenization

    return [info for info in shards if info["count"] and built_tokenization(out / info["dir"]) != TOKENIZATION]


def _retokenize(out: Path, stale: list[dict], index: IndexConfig, log) -> None:
    """Rebuild, from its passages, the BM25 index of each ``stale`` shard (no re-encoding): such an index was
    called up to date, and a query matched none of its tokens. The manifest goes first, as for any rebuild: no
    run starts on shards being swapped, and a running one whose shard restarts stops rather than change its
    queries' tokens midway."""
    from actors.bm25 import build_bm25

    if stale and (out / MANIFEST).exists():  # aside, not deleted: a run killed midway finds the build's figures there
        os.replace(out / MANIFEST, out / ASIDE)
    for info in stale:
        shard = out / info["dir"]
        table = pq.read_table(shard / "passages.parquet", columns=["title", "text"])
        texts = [embedding_text(t, x) for t, x in zip(table["title"].to_pylist(), table["text"].to_pylist())]
        shutil.rmtree(shard / "bm25.tmp", ignore_errors=True)
        build_bm25(texts, shard / "bm25.tmp", index.bm25_k1, index.bm25_b)
        shutil.rmtree(shard / "bm25", ignore_errors=True)  # killed here: no bm25/, found stale and rebuilt next time
        (shard / "bm25.tmp").rename(shard / "bm25")
        log(f"{info['dir']}: BM25 rebuilt from its passages (it was tokenized by an earlier ragsift)")


def _dir(shard: int) -> str:
    return f"shard-{shard:03d}"


def _bm25_settings(index: IndexConfig) -> dict | None:
    from actors.bm25 import TOKENIZATION

    return {"k1": index.bm25_k1, "b": index.bm25_b, "tokenization": TOKENIZATION} if index.bm25 else None


def _build_key(config: IndexJobConfig, total_rows: int, bounds: list[int], corpus_sha: str,
               corpus_path: str | None = None, roles: bool = False) -> str:
    """What a committed shard was built from; a shard built from anything else is rebuilt. The corpus is
    its bytes: its path as typed (``./c.parquet``, an absolute path, another working folder) rebuilt the
    whole index, offline meanwhile; ``corpus_path`` gives the key shards built before that carry."""
    # the chunk settings only where set: an index built before chunking existed keeps its key
    unsplit = ("chunk_words", "chunk_overlap") if not config.index.chunk_words else ()
    what = {"corpus_sha256": corpus_sha, "rows": total_rows, "bounds": bounds,
            "embedder": config.embedder.model,
            "index": config.index.model_dump(exclude={"path", "shards", "encode_batch_rows", "nprobe", "hnsw_ef_search",
                                                      *unsplit})}
    if weights := _local_weights_sha256(config.embedder.model):
        what["embedder_sha256"] = weights
    if roles:  # shards built before its passages were encoded as documents are built again
        what["encoder_roles"] = True
    if corpus_path is not None:
        what["corpus"] = corpus_path
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _local_weights_sha256(model: str) -> str | None:
    """The content of a local model directory (a model retrained in the same place encodes differently, so
    its shards are rebuilt); None for an offline alias (pinned and verified, its name says which weights)
    or a hub name. Read once a build; symlinked folders are followed, hidden ones (a hub client's
    bookkeeping, .git) left out."""
    if model in REGISTRY or not os.path.isdir(root := os.path.expanduser(model)):
        return None
    digest = hashlib.sha256()
    for file in model_files(root):
        if not any(part.startswith(".") for part in Path(file).parts):
            digest.update(f"{file}\0{file_sha256(*filesystem(os.path.join(root, file)))}\0".encode())
    return digest.hexdigest()


def _committed(shard_dir: Path, build_keys: set[str]) -> dict | None:
    try:
        info = json.loads((shard_dir / "done.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return info if info.get("build_key") in build_keys else None


def encoder_options(embedder) -> dict:
    """Ray options of an index encoder actor. One that dies (out of memory, a lost node) is restarted
    and Ray re-runs the encode calls it had: encoding is stateless, so a retry gives the same vectors."""
    return {"num_cpus": embedder.num_cpus, "num_gpus": embedder.num_gpus, "resources": embedder.resources or None,
            "max_restarts": 3, "max_task_retries": 3}


def encoder_threads(embedder, cores: int) -> int:
    """Torch threads per encoder replica: as configured, or the machine's cores shared among them."""
    return embedder.threads or max(1, cores // embedder.replicas)


def skip_reason(pid, text, title) -> str | None:
    """Why a corpus row is skipped, if it is (a duplicate id aside), counted in the manifest. An empty id is
    none (a CSV's empty cell is read as null: the same passage from Parquet was indexed as '')."""
    return ("invalid_utf8" if bytes in (type(pid), type(text), type(title))
            else "null_id" if pid is None or not pid.strip() else "null_text" if not text or not text.strip() else None)


def _first_occurrences(corpus: pq.ParquetFile, index: IndexConfig) -> tuple[np.ndarray, np.ndarray]:
    """Mask of the rows that keep their id: the first usable row of each id (one pass over the ids and
    texts), so a skipped row (no text) does not take its id from a later row that has one; and how many
    passages each row is split into (``index.chunk_words``; 1 each without it). Splitting, an id that ends
    as a part's does (``#<n>``) is refused: scoring would take it for a part of another passage."""
    hashes, valid, parts = [], [], []
    columns = ["id", "text"] + (["title"] if "title" in corpus.schema_arrow.names else [])
    for batch in corpus.iter_batches(batch_size=65_536, columns=columns):
        ids = text_values(batch.column(0))  # an id that is not valid UTF-8 is hashed by its bytes
        texts = text_values(batch.column(1))
        titles = text_values(batch.column(2)) if len(columns) == 3 else [None] * batch.num_rows
        ok = [skip_reason(p, x, t) is None for p, x, t in zip(ids, texts, titles)]
        valid.append(np.array(ok, dtype=bool))
        hashes.append(hash_ids(["" if v is None else v for v in ids]))
        if index.chunk_words:
            if named := next((p for p, good in zip(ids, ok) if good and p != passage_of(p)), None):
                # a part is scored as the passage its id names less '#<n>': such an id would be taken for a part
                raise UserError(f"index.chunk_words: the corpus id {named!r} ends as a split passage's part id does "
                                "(<id>#<n>); give the corpus ids without '#<number>' endings to split it")
            parts.append(np.array([count(x, index.chunk_words, index.chunk_overlap) if good else 1
                                   for good, x in zip(ok, texts)], dtype=np.int32))
        else:
            parts.append(np.ones(batch.num_rows, dtype=np.int32))
    hashes, valid = np.concatenate(hashes), np.concatenate(valid)
    order = np.flatnonzero(valid)
    _, first = np.unique(hashes[order], return_index=True)
    mask = np.zeros(len(hashes), dtype=bool)
    mask[order[first]] = True
    return mask, np.concatenate(parts)


class _ShardBuilder:
    """One shard being filled: passages to Parquet, vectors to a memory-mapped spill file."""

    def __init__(self, path: Path, capacity: int, dims: int):
        shutil.rmtree(path, ignore_errors=True)  # leftovers of an interrupted build
        path.mkdir(parents=True)
        self.path, self.count, self.skipped, self.cut, self.split = path, 0, Counter(), 0, 0
        self.vectors = np.lib.format.open_memmap(path / "vectors.npy", mode="w+", dtype=np.float32,
                                                 shape=(max(capacity, 1), dims))
        self.writer = pq.ParquetWriter(path / "passages.parquet", PASSAGES, compression="zstd")
        self.rows: list[dict] = []

    def add(self, record: dict, vector: np.ndarray, cut: bool) -> None:
        self.vectors[self.count + len(self.rows)] = vector
        self.cut += bool(cut)
        self.rows.append(record)
        if len(self.rows) >= 4096:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=PASSAGES))
            self.count += len(self.rows)
            self.rows = []

    def finish(self, index_config: IndexConfig, dims: int, build_key: str, log) -> dict:
        import faiss

        self._flush()
        self.writer.close()
        vectors = self.vectors[: self.count]
        factory = factory_string(index_config, dims, self.count)
        index = faiss.index_factory(dims, factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            rng = np.random.default_rng(0)
            sample = np.sort(rng.choice(self.count, min(index_config.train_sample, self.count), replace=False))
            index.train(np.ascontiguousarray(vectors[sample]))
        for start in range(0, self.count, ADD_CHUNK):
            index.add(np.ascontiguousarray(vectors[start: start + ADD_CHUNK]))
        faiss.write_index(index, str(self.path / "index.faiss"))
        del vectors, index, self.vectors  # closes the memory map before its file goes
        (self.path / "vectors.npy").unlink()
        bm25 = False
        if index_config.bm25 and self.count:  # bm25s cannot index nothing; an empty shard finds nothing
            from actors.bm25 import build_bm25

            table = pq.read_table(self.path / "passages.parquet", columns=["title", "text"])
            texts = [embedding_text(t, x) for t, x in zip(table["title"].to_pylist(), table["text"].to_pylist())]
            del table
            bm25 = build_bm25(texts, self.path / "bm25", index_config.bm25_k1, index_config.bm25_b)
        info = {"dir": self.path.name, "count": self.count, "skipped": dict(self.skipped), "cut_by_embedder": self.cut,
                **({"split": self.split} if index_config.chunk_words else {}),  # corpus rows split into several
                "factory": factory,
                "index_sha256": file_sha256(*filesystem(str(self.path / "index.faiss"))),
                "passages_sha256": file_sha256(*filesystem(str(self.path / "passages.parquet"))), "build_key": build_key}
        (self.path / "done.json.tmp").write_text(json.dumps(info, indent=2))
        (self.path / "done.json.tmp").rename(self.path / "done.json")
        log(f"built {self.path.name}: {self.count:,} passages ({factory}{', BM25' if bm25 else ''})")
        return info


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", help="corpus (id, text[, title]): Parquet, JSON Lines or CSV (FlashRAG's id, "
                   "contents too), anywhere pyarrow reaches")
    p.add_argument("--index-dir", help="output directory (index.path)")
    p.add_argument("--shards", type=int, help="number of shards (index.shards)")
    p.add_argument("--index-type", choices=["flat", "ivf_flat", "ivf_pq", "hnsw"], help="index.index_type")
    p.add_argument("--chunk-words", type=int, help="split passages of more than this many words into passages of "
                   "this many words, ids <id>#<n> (index.chunk_words; default: index passages as they are)")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    overrides = config_overrides(args, {"index_dir": "index.path", "shards": "index.shards",
                                        "index_type": "index.index_type", "chunk_words": "index.chunk_words"})
    config = load_config(IndexJobConfig, args.config, overrides, corpus=args.corpus)
    if not config.corpus:
        raise UserError("no corpus given: pass --corpus or set `corpus` in the config")
    build_index(config, log=lambda *a, **k: print(*a, **k, file=sys.stderr))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_job("index", argv)


if __name__ == "__main__":
    sys.exit(main())
