"""Losing a worker node mid-run, on a three-node Ray cluster on this machine (issue 21).

Starts a head (custom resource ``retrieval``: shards, encoder) and two workers (``llm``: the generator
replica) with ``ray start``, as tests/cluster/test_multi_node.py does, and submits the same answer job
twice with ``ray job submit``: once clean, once killing every process of the worker that holds the
generator replica after the first parts are committed. Reports wall time, rows lost / duplicated,
error rows, replica restarts, and how many answers the two runs share.

    python benchmarks/node_loss.py --questions 100 --out results/benchmarks/node_loss.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("RAGSIFT_NO_CACHE", "1")  # the second run must compute, not read the first one's answers
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow.parquet as pq  # noqa: E402

from tests.cluster.test_multi_node import LocalCluster  # noqa: E402
from tests.conftest import REPO, SAMPLE_CORPUS, SAMPLE_QUESTIONS  # noqa: E402

STRATEGIES = ("direct", "rag")


def submit(cluster: LocalCluster, questions: Path, index: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [cluster.env["RAY"], "job", "submit", "--address", cluster.dashboard, "--working-dir", str(REPO),
         "--runtime-env", str(REPO / "cluster" / "runtime_env.yaml"), "--",
         "python", "-m", "jobs.cli", "answer", "--questions", str(questions), "--index-dir", str(index),
         "--output", str(out), "--strategy", ",".join(STRATEGIES), "--generator", "smollm2-135m-instruct",
         "--set", "generator.cpu_kvcache_gib=1", "--set", "commit.shard_rows=10", "--set", "generator.resources={llm: 1}",
         "--set", "embedder.resources={retrieval: 1}", "--set", "retrieval.shard_resources={retrieval: 1}",
         "--set", "engine.failure_cooldown_s=0.5", "--set", "cache.enabled=false"],
        env={**cluster.env, "RAGSIFT_NO_CACHE": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(questions: Path, index: Path, out: Path, kill: bool) -> dict:
    cluster = LocalCluster()
    try:
        cluster.start_three_nodes()
        started = time.perf_counter()
        job = submit(cluster, questions, index, out)
        killed = None
        if kill:
            while not list(out.glob("*/part-*.parquet")) and job.poll() is None:
                time.sleep(1)
            killed = None
            while killed is None and job.poll() is None:  # `ray list` can fail on a busy box: ask again
                nodes = cluster.alive_nodes()
                killed = next((nodes.get(a["node_id"]) for a in cluster.ray_list("actors")
                               if a["class_name"] == "StreamingGenerator" and a["state"] == "ALIVE"), None)
            killed = {"node": killed, "at_s": round(time.perf_counter() - started, 1),
                      "parts_committed_then": len(list(out.glob("*/part-*.parquet")))}
            cluster.kill(killed["node"])
        log = job.communicate(timeout=1800)[0]
        wall = time.perf_counter() - started
    finally:
        cluster.stop()
    if job.returncode != 0:
        raise RuntimeError(log[-4000:])
    rows = [r for s in STRATEGIES for r in pq.read_table(out / s).to_pylist()]
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": round(wall, 1), "killed": killed, "rows": len(rows),
            "errors": sum(r["error"] is not None for r in rows), "replica_restarts": metrics["replica_restarts"],
            "batch_failures": metrics["batch_failures"], "exactly_once": all(c["ok"] for c in metrics["exactly_once"].values()),
            "answers": {(r["strategy"], r["id"]): r["answer"] for r in rows},
            "ids": Counter((r["strategy"], r["id"]) for r in rows)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--out", default="results/benchmarks/node_loss.json")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="node_loss_"))
    pq.write_table(pq.read_table(SAMPLE_QUESTIONS).slice(0, args.questions), tmp / "q.parquet")
    pq.write_table(pq.read_table(SAMPLE_CORPUS).slice(0, 300), tmp / "c.parquet")
    subprocess.run([sys.executable, "-m", "jobs.cli", "index", "--corpus", tmp / "c.parquet", "--index-dir", tmp / "idx",
                    "--shards", "2"], cwd=REPO, check=True, capture_output=True, env={**os.environ, "RAY_ADDRESS": ""})
    clean = run(tmp / "q.parquet", tmp / "idx", tmp / "clean", kill=False)
    lossy = run(tmp / "q.parquet", tmp / "idx", tmp / "killed", kill=True)
    expected = {(s, i) for s in STRATEGIES for i in pq.read_table(tmp / "q.parquet")["id"].to_pylist()}
    report = {"command": f"python benchmarks/node_loss.py --questions {args.questions}",
              "setup": "3 Ray nodes on one 2-core machine (head: retrieval, 2 workers: llm), SmolLM2-135M, direct + rag, "
                       "commit.shard_rows=10, ray job submit",
              "pairs": len(expected)}
    for name, r in (("clean", clean), ("worker_killed", lossy)):
        report[name] = {k: v for k, v in r.items() if k not in ("answers", "ids")}
        report[name]["lost"] = len(expected - set(r["ids"]))
        report[name]["duplicated"] = sum(n - 1 for n in r["ids"].values() if n > 1)
    report["answers_identical"] = sum(clean["answers"].get(k) == v for k, v in lossy["answers"].items())
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
