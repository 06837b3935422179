"""Losing a worker node mid-run, on a three-node Ray cluster on this machine (issue 21).

Starts a head (custom resource ``retrieval``: shards, encoder) and two workers (``llm``: the generator
replica) with ``ray start``, as tests/cluster/test_multi_node.py does, and submits the same answer job
twice with ``ray job submit``: once clean, once killing every process of the worker that holds the
generator replica after the first parts are committed. Reports wall time, rows lost / duplicated,
error rows, replica restarts, and how many answers the two runs share.

Two more scenarios (``--scenarios``): ``worker_returns`` kills the generator's worker, starts it again,
then kills the other worker, so the replica can only come back on the node that returned;
``head_killed`` kills the head, where the job's driver runs (the whole cluster goes with it), starts a
new cluster and submits the same command again, which resumes from the committed parts.

    python benchmarks/node_loss.py --questions 100 --out results/benchmarks/node_loss.json
    python benchmarks/node_loss.py --questions 200 --scenarios clean worker_returns head_killed \
        --out results/benchmarks/node_loss_returns_head.json
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


def generator_node(cluster: LocalCluster, job: subprocess.Popen, other_than: str | None = None) -> str | None:
    """The node the generator replica runs on (not ``other_than``), once Ray says it is alive there."""
    while job.poll() is None:  # `ray list` can fail on a busy box: ask again
        nodes = cluster.alive_nodes()
        node = next((nodes.get(a["node_id"]) for a in cluster.ray_list("actors")
                     if a["class_name"] == "StreamingGenerator" and a["state"] == "ALIVE"
                     and nodes.get(a["node_id"]) not in (None, other_than)), None)
        if node:
            return node
        time.sleep(1)
    return None


def run(questions: Path, index: Path, out: Path, scenario: str) -> dict:
    cluster = LocalCluster()
    killed, started = [], time.perf_counter()

    def kill(node: str) -> None:
        killed.append({"node": node, "at_s": round(time.perf_counter() - started, 1),
                       "parts_committed_then": len(list(out.glob("*/part-*.parquet")))})
        cluster.kill(node)

    try:
        cluster.start_three_nodes()
        started = time.perf_counter()
        job = submit(cluster, questions, index, out)
        if scenario != "clean":
            victim = generator_node(cluster, job)
            while not list(out.glob("*/part-*.parquet")) and job.poll() is None:
                time.sleep(0.2)
            kill("head" if scenario == "head_killed" else victim)
        if scenario == "worker_returns":
            cluster.start(victim, {"llm": 1})  # the node comes back (a replaced machine, a rebooted one)
            survivor = generator_node(cluster, job, other_than=victim)
            if survivor:  # now only the node that returned has `llm` left
                kill(survivor)
                killed[-1]["replica_came_back_on"] = generator_node(cluster, job, other_than=survivor)
        if scenario == "head_killed":  # the driver died with the head: a new cluster, the same command
            job.kill()  # `ray job submit` was following the job's logs from the head
            job.communicate()
            cluster.stop()
            cluster = LocalCluster()
            cluster.start_three_nodes()
            job = submit(cluster, questions, index, out)
        log = job.communicate(timeout=1800)[0]
        wall = time.perf_counter() - started
    finally:
        cluster.stop()
    if job.returncode != 0:
        raise RuntimeError(log[-4000:])
    rows = [r for s in STRATEGIES for r in pq.read_table(out / s).to_pylist()]
    metrics = json.loads((out / "metrics.json").read_text())
    return {"wall_s": round(wall, 1), "killed": killed, "rows": len(rows), "shards_resumed": metrics["shards_resumed"],
            "errors": sum(r["error"] is not None for r in rows), "replica_restarts": metrics["replica_restarts"],
            "batch_failures": metrics["batch_failures"], "exactly_once": all(c["ok"] for c in metrics["exactly_once"].values()),
            "answers": {(r["strategy"], r["id"]): r["answer"] for r in rows},
            "ids": Counter((r["strategy"], r["id"]) for r in rows)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--out", default="results/benchmarks/node_loss.json")
    p.add_argument("--scenarios", nargs="+", default=["clean", "worker_killed"],
                   choices=["clean", "worker_killed", "worker_returns", "head_killed"])
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="node_loss_"))
    pq.write_table(pq.read_table(SAMPLE_QUESTIONS).slice(0, args.questions), tmp / "q.parquet")
    pq.write_table(pq.read_table(SAMPLE_CORPUS).slice(0, 300), tmp / "c.parquet")
    subprocess.run([sys.executable, "-m", "jobs.cli", "index", "--corpus", tmp / "c.parquet", "--index-dir", tmp / "idx",
                    "--shards", "2"], cwd=REPO, check=True, capture_output=True, env={**os.environ, "RAY_ADDRESS": ""})
    results = {name: run(tmp / "q.parquet", tmp / "idx", tmp / name, name) for name in args.scenarios}
    expected = {(s, i) for s in STRATEGIES for i in pq.read_table(tmp / "q.parquet")["id"].to_pylist()}
    report = {"command": f"python benchmarks/node_loss.py --questions {args.questions} --scenarios {' '.join(args.scenarios)}",
              "setup": "3 Ray nodes on one 2-core machine (head: retrieval, 2 workers: llm), SmolLM2-135M, direct + rag, "
                       "commit.shard_rows=10, ray job submit",
              "pairs": len(expected)}
    for name, r in results.items():
        report[name] = {k: v for k, v in r.items() if k not in ("answers", "ids")}
        report[name]["lost"] = len(expected - set(r["ids"]))
        report[name]["duplicated"] = sum(n - 1 for n in r["ids"].values() if n > 1)
        if name != "clean" and "clean" in results:
            report[name]["answers_identical_to_clean"] = sum(results["clean"]["answers"].get(k) == v
                                                             for k, v in r["answers"].items())
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
