"""Faults with the real model: what is lost or duplicated when replicas or the driver die mid-run.

Runs ``answer`` on the first N sample questions (direct + rag, SmolLM2 by default, the demo index)
undisturbed, then with the generator actor killed, with a retriever shard killed, and with the
driver process killed (SIGKILL) and the same command rerun. Each disturbed run is compared with the
undisturbed one: rows lost, rows duplicated, answers identical. Prints a Markdown table.

    python benchmarks/chaos.py [--questions 40] [--generator smollm2-135m-instruct] [--faults generator,...]

Also prints the generator stage's calls and mean batch in each in-process run: after a restart the
stage must return to full batches (issue 22: mean batch within 80% of the reference run).
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

# timings and fault counts are of computed requests, never of answers found in the disk cache
os.environ.setdefault("RAGSIFT_NO_CACHE", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KILL_AFTER_PARTS = 2


def rows(output: str) -> list[tuple]:
    import pyarrow.parquet as pq

    out = []
    for strategy in ("direct", "rag"):
        out += [(strategy, r["id"], r["answer"], r["error"]) for r in pq.read_table(f"{output}/{strategy}").to_pylist()]
    return out


def compare(calm: list[tuple], disturbed: list[tuple]) -> dict:
    keys = [(s, i) for s, i, _, _ in disturbed]
    calm_by = {(s, i): (a, e) for s, i, a, e in calm}
    got_by = {(s, i): (a, e) for s, i, a, e in disturbed}
    return {"rows": len(disturbed), "lost": len(set(calm_by) - set(got_by)), "duplicated": len(keys) - len(set(keys)),
            "errors": sum(e is not None for *_, e in disturbed),
            "identical": sum(got_by.get(k) == v for k, v in calm_by.items())}


def wait_parts(output: str, n: int, timeout: float = 900) -> None:
    deadline = time.time() + timeout
    while len(glob.glob(f"{output}/rag/part-*.parquet")) < n and time.time() < deadline:
        time.sleep(0.05)


def in_process(config, kill=None) -> dict:
    import ray

    from jobs.answer import answer
    from jobs.pools import build_stages

    stages = build_stages(config, {"generator", "retriever"})
    if kill:
        def chaos():
            wait_parts(config.output, KILL_AFTER_PARTS)
            ray.kill(kill(stages), no_restart=False)
        threading.Thread(target=chaos, daemon=True).start()
    return answer(config, log=lambda *a: None, stages=stages)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--questions", type=int, default=40)
    p.add_argument("--generator", default="smollm2-135m-instruct")
    p.add_argument("--faults", default="generator,retriever,driver", help="which faults to run, after the reference")
    args = p.parse_args()
    faults = set(args.faults.split(","))

    import pyarrow.parquet as pq
    import ray

    from jobs.demo import QUESTIONS
    from jobs.models import ragsift_home
    from jobs.ray_session import init_ray
    from schemas.config import load_config
    from strategies.registry import AnswerConfig

    tmp = tempfile.mkdtemp(prefix="ragsift-chaos-")
    qpath = f"{tmp}/q.parquet"
    pq.write_table(pq.read_table(QUESTIONS).slice(0, args.questions), qpath)
    index = str(ragsift_home() / "indexes" / "demo")
    flags = [f"index.path={index}", f"generator.model={args.generator}", "commit.shard_rows=10",
             "engine.generator.max_batch=8"]

    def config(name):
        return load_config(AnswerConfig, None, flags, questions=qpath, output=f"{tmp}/{name}",
                           strategies=["direct", "rag"])

    def batches(metrics):
        generator = metrics["stages"]["generator"]
        return {"calls": generator["calls"], "mean_batch": generator["batch_size"]["mean"]}

    init_ray(config("calm").ray)
    t = time.perf_counter()
    metrics = in_process(config("calm"))
    calm = rows(f"{tmp}/calm")
    report = [("none (reference run)", {**compare(calm, calm), **batches(metrics)}, time.perf_counter() - t)]
    for name, kill in [("generator actor killed (ray.kill)", lambda s: s["generator"].replicas[0]),
                       ("retriever shard killed (ray.kill)", lambda s: s["retriever"].shards[0])]:
        if name.split()[0] not in faults:
            continue
        t = time.perf_counter()
        metrics = in_process(config(name.split()[0]), kill)
        report.append((name, {**compare(calm, rows(f"{tmp}/{name.split()[0]}")), **batches(metrics),
                              "batch_failures": metrics["batch_failures"]}, time.perf_counter() - t))
    ray.shutdown()
    if "driver" in faults:
        report.append(driver_killed(qpath, flags, f"{tmp}/driver", calm))
    print(f"{args.questions} questions x (direct, rag), {args.generator}, greedy, shards of 10 questions")
    print("| fault | rows | lost | duplicated | error rows | answers identical to the reference "
          "| generator calls | mean batch | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r, wall in report:
        print(f"| {name} | {r['rows']} | {r['lost']} | {r['duplicated']} | {r['errors']} | "
              f"{r['identical']} / {len(calm)} | {r.get('calls', '-')} | {r.get('mean_batch', '-')} | {wall:.0f} |")


def driver_killed(qpath: str, flags: list[str], out: str, calm: list[tuple]):
    cmd = [sys.executable, "-m", "jobs.answer", "--questions", qpath, "--output", out, "--strategy", "direct,rag",
           *[a for f in flags for a in ("--set", f)]]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_parts(out, KILL_AFTER_PARTS)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = len(glob.glob(f"{out}/rag/part-*.parquet"))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (f"driver SIGKILLed after {committed} rag parts, rerun", compare(calm, rows(out)), time.perf_counter() - t)


if __name__ == "__main__":
    main()
