"""Engine overhead at scale: driver CPU time per item node and driver peak RSS.

The model and retriever are zero-latency stubs (Ray actors that answer instantly; benchmark only),
so what is measured is the driver: reading questions from Parquet, RA-ISF state machines, request
queues and dedup, Ray dispatch, routing, writing answers to Parquet parts committed per shard, and
the final exactly-once check (the whole ``answer()`` call). Each size runs in a fresh
process so peak RSS belongs to that size.

    python benchmarks/engine_overhead.py 10000 100000 1000000
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StubGenerator:
    """Scripted answers by a hash of the prompt. RA-ISF: ~40% know, ~30% relevant passage, ~30%
    decompose. MIGRES (by its requests' steps): statements extracted and ~80% of them entailed, the
    main module answering ~60% of the time (else a new query, up to its T iterations)."""

    def generate(self, batch):
        from schemas.records import Generation, Judge, Judgment

        out = []
        for r in batch:
            user = r.messages[-1][1]
            h = zlib.crc32(user.encode()) % 10
            if isinstance(r, Judge):
                p = 0.9 if (h < 8 if r.step == "entail" else h < 4 if user.startswith("Can you") else h < 2) else 0.1
                out.append(Judgment("yes" if p > .5 else "no", {"yes": p, "no": 1 - p}, 40, 1))
            elif r.json_schema and r.step in MIGRES_SCRIPT:
                out.append(Generation(json.dumps(MIGRES_SCRIPT[r.step](h)), 200, 20))
            elif r.json_schema:
                q = user.rsplit("Question: ", 1)[-1]
                out.append(Generation(json.dumps({"sub_questions": [f"{q} part {i}" for i in (1, 2)]}), 60, 20))
            else:
                out.append(Generation(f"answer {h}", 200, 4))
        return out


MIGRES_SCRIPT = {  # MIGRES's structured steps (the others answer "answer h"): their JSON, from the prompt's hash h
    "leaf": lambda h: {"useful_information": [{"info": f"statement {h}", "support_passages": [0]}]},
    "main": lambda h: {"answer": f"answer {h}" if h < 6 else "unanswerable", "confidence": 3,
                       "explanation": "from the statements", "missing_information": f"the missing fact {h}"},
    "query": lambda h: {"queries": [f"a follow-up query {h}"]},
}


class StubRanker:
    """Every text scored, best first, falling from 0.9 (a relevance filter keeps the first few)."""

    def rank(self, batch):
        from schemas.records import Ranking

        return [Ranking(list(range(len(r.texts))), [0.9 / (i + 1) for i in range(len(r.texts))]) for r in batch]


class StubEncoder:
    def encode(self, texts, role=None):
        return texts


class StubShard:
    """Each shard holds its own passages (ids carry the shard number), like real shards."""

    def __init__(self, shard: int, filler: str = "text " * 60):
        self.shard, self.filler = shard, filler

    def search(self, queries, k):
        from schemas.records import Passage

        out = []
        for q in queries:
            ids = [f"s{self.shard}-p{(zlib.crc32(q.encode()) + 7919 * i) % 1_000_000}" for i in range(k)]
            out.append([Passage(pid, f"Title {pid}", f"passage {pid} " + self.filler, 1.0 / (i + 1))
                        for i, pid in enumerate(ids)])
        return out

    search_bm25 = search  # the same stub hits: MIGRES retrieves with BM25 by default


def write_questions(path: str, n: int) -> None:
    """``n`` synthetic questions as Parquet, written 100,000 rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("question", pa.string())]))
    for start in range(0, n, 100_000):
        ids = [f"q{i}" for i in range(start, min(n, start + 100_000))]
        writer.write_table(pa.table({"id": ids, "question": [f"synthetic question number {i}?" for i in
                                                              range(start, start + len(ids))]}))
    writer.close()


def one(n: int) -> dict:
    import pyarrow.parquet as pq
    import ray

    from engine.stages import GeneratorStage, RetrieverStage
    from jobs.answer import answer
    from strategies.registry import AnswerConfig

    tmp = tempfile.mkdtemp()
    qpath = f"{tmp}/q.parquet"
    write_questions(qpath, n)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=512 * 2**20)
    config = AnswerConfig(questions=qpath, output=f"{tmp}/out", strategies=["raisf"],
                          engine={"cache_size": int(os.environ.get("OVERHEAD_CACHE_SIZE", 100_000))})
    gen = [ray.remote(StubGenerator).options(num_cpus=0).remote()]
    enc = [ray.remote(StubEncoder).options(num_cpus=0).remote()]
    shards = [ray.remote(StubShard).options(num_cpus=0).remote(i) for i in range(2)]
    stages = {"generator": GeneratorStage(gen, config.engine.generator),
              "retriever": RetrieverStage(enc, shards, config.engine.retriever)}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu, wall = time.process_time(), time.perf_counter()
    metrics = answer(config, log=lambda *a: None, stages=stages)  # plan, engine, sharded output, exactly-once check
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    answers = pq.read_table(f"{tmp}/out/raisf", columns=["n_subquestions"])
    written, nodes = answers.num_rows, answers.num_rows + sum(answers["n_subquestions"].to_pylist())
    ray.shutdown()
    return {"questions": n, "rows_written": written, "nodes": nodes, "driver_cpu_s": round(cpu, 2),
            "wall_s": round(wall, 2), "cpu_ms_per_node": round(1000 * cpu / nodes, 4),
            "peak_rss_mb_before_run": round(rss_before / 1024),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "requests_deduped": metrics["requests_deduped"], "parts": metrics["parts_committed"],
            "exactly_once": all(c["ok"] for c in metrics["exactly_once"].values()),
            "generator_batch_mean": metrics["stages"]["generator"]["batch_size"]["mean"]}


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]))))
        sys.exit(0)
    sizes = [int(a) for a in sys.argv[1:]] or [10_000, 100_000, 1_000_000]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    print("| questions | nodes | driver CPU s | wall s | CPU ms / node | driver peak RSS MB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        proc = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True, text=True, env=env)
        if proc.returncode:
            print(proc.stderr[-3000:], file=sys.stderr)
            sys.exit(1)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"| {r['questions']:,} | {r['nodes']:,} | {r['driver_cpu_s']} | {r['wall_s']} | "
              f"{r['cpu_ms_per_node']} | {r['peak_rss_mb']} |", flush=True)
        print(json.dumps(r), file=sys.stderr)
