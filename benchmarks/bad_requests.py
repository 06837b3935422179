"""Bad requests in density: how long the engine takes to isolate them, and when it stops instead.

A scripted generator (tests/engine/fakes.py: a batch holding a 'POISON' question raises) on local
Ray, 2 replicas, both replica kinds (one call per micro-batch, and streamed results as vLLM's async
engine gives). Every ``--every``-th question is bad (1 = all of them). Reports wall time, error rows,
failed calls, splits, stage tests (a request answered before, asked again after failures in a row)
or the StageDown that stopped the run. The cost measured is the engine's isolation alone: each
failure is instant, so wall time is cooldowns and round trips, not model time.

    python benchmarks/bad_requests.py --questions 400 --every 10 3 2 1 --out results/benchmarks/bad_requests.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one(n: int, every: int, kind: str, cooldown: float, window: int) -> dict:
    import ray

    from schemas.errors import StageDown
    from schemas.records import Question
    from tests.engine.fakes import FakeGenerator
    from tests.engine.test_faults import run

    questions = [Question(f"q{i}", f"POISON {i}" if i % every == 0 else f"question {i}") for i in range(n)]
    started = time.perf_counter()
    out = {"every": every, "kind": kind, "questions": n, "bad": len(range(0, n, every))}
    try:
        _, rows, engine = run(ray, questions, strategy="direct", generator=FakeGenerator, kind=kind,
                              failure_cooldown_s=cooldown, window=window)
        out.update(rows=len(rows), error_rows=sum(r["error"] is not None for r in rows),
                   failed_calls=engine.batch_failures, splits=engine.batch_splits, stage_tests=engine.stage_tests)
    except StageDown as err:
        out["stopped"] = str(err).split(" (")[0]
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--questions", type=int, default=400)
    p.add_argument("--every", type=int, nargs="+", default=[10, 3, 2, 1])
    p.add_argument("--kinds", nargs="+", default=["batch", "async"])
    p.add_argument("--cooldown", type=float, default=2.0, help="engine.failure_cooldown_s (the default)")
    p.add_argument("--window", type=int, default=256, help="engine.window (the default)")
    p.add_argument("--out")
    args = p.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = []
    print("| bad | kind | wall s | error rows | failed calls | splits | stage tests | stopped |")
    print("|---|---|---|---|---|---|---|---|")
    for every in args.every:
        for kind in args.kinds:
            r = one(args.questions, every, kind, args.cooldown, args.window)
            results.append(r)
            print(f"| {r['bad']}/{r['questions']} | {kind} | {r['wall_s']} | {r.get('error_rows', '-')} | "
                  f"{r.get('failed_calls', '-')} | {r.get('splits', '-')} | {r.get('stage_tests', '-')} | "
                  f"{r.get('stopped', '-')} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "cooldown_s": args.cooldown, "window": args.window,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
