"""Engine efficiency against the raw vLLM limit and against one-at-a-time execution, for both kinds
of generator replica (``generator.serving``: async = AsyncLLM, streamed; batch = LLM.generate per
micro-batch).

On the same questions, real model, same prompts:
  1. efficiency: engine tokens/s (prompt + generated) / raw ``LLM.generate`` tokens/s on the engine's
     own prompts submitted in one call                                     (issue 19: >= 0.97, async)
  2. share of the raw batching gain kept: (engine batched / engine sequential - 1) /
     (raw batched / raw sequential - 1), tokens/s throughout               (issue 19: >= 0.8)
Each pass runs ``--repeats`` times (min / median / max). The prefix cache is reset before each pass so
every pass starts cold; model start-up is excluded (and reported). One replica kind runs at a time
(the batch kind first: its raw passes are the limit every kind is divided by), or with
``--interleave`` the batch replica stays up beside the one measured and each raw pass runs right
before the engine pass it is divided by.

    python benchmarks/engine_efficiency.py --n 30 --strategy raisf --repeats 3
    python benchmarks/engine_efficiency.py --n 30 --strategy raisf --repeats 3 --serving async --interleave
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# timings and fault counts are of computed requests, never of answers found in the disk cache
os.environ.setdefault("RAGSIFT_NO_CACHE", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spread(values: list[float]) -> dict:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def gain_kept(engine_batched: float, engine_sequential: float, raw_batched: float, raw_sequential: float) -> float:
    """The share of raw batching's gain over one-at-a-time that the engine keeps (below 0 when the
    engine's batched pass is slower than its own sequential one)."""
    return (engine_batched / engine_sequential - 1) / (raw_batched / raw_sequential - 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=30, help="questions, spread evenly over the 200-question sample")
    p.add_argument("--strategy", default="raisf")
    p.add_argument("--generator", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--serving", default="async,batch", help="replica kinds to measure the engine with")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-sequential", action="store_true")
    p.add_argument("--interleave", action="store_true",
                   help="keep the batch replica (the raw limit) beside the async one and alternate raw and engine "
                        "passes within each repeat, so that each efficiency divides two adjacent passes (a box's "
                        "drift over minutes otherwise lands on one side of the ratio); on a GPU give each replica "
                        "half the memory (--set generator.gpu_memory_utilization=0.45)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an answer config field")
    p.add_argument("--out", default="runs/bench_efficiency/report.json")
    args = p.parse_args()

    import ray

    from engine.loop import Engine
    from jobs.demo import QUESTIONS, ensure_index
    from jobs.models import ragsift_home
    from jobs.pools import build_stages
    from jobs.questions import question_rows
    from jobs.ray_session import init_ray
    from schemas.config import load_config
    from schemas.records import Generate
    from strategies.registry import AnswerConfig, make_strategy

    index_dir = ragsift_home() / "indexes" / "demo"
    ensure_index(index_dir, 2, log=lambda *a, **k: None)
    all_q = list(question_rows(str(QUESTIONS)))
    questions = all_q[:: max(1, len(all_q) // args.n)][: args.n]  # spread over all six datasets

    def config_for(serving: str):
        # interleaved, two replicas share the box: Ray's CPU count would hold the second back forever
        both = ["generator.num_cpus=0"] if args.interleave else []
        return load_config(AnswerConfig, None, [f"index.path={index_dir}", f"generator.model={args.generator}",
                                                f"generator.serving={serving}", *both, *args.set],
                           strategies=[args.strategy])

    config = config_for("batch")
    init_ray(config.ray)
    strategy = make_strategy(args.strategy, config)
    needs = set(strategy.stages)
    stages = build_stages(config, needs - {"generator", "judge"})
    if "retriever" in stages:
        ray.get(stages["retriever"].replicas[0].encode.remote(["warm up"]))

    def start_generator(serving: str):
        t = time.perf_counter()
        stage = build_stages(config_for(serving), {"generator"})["generator"]
        ray.get(stage.replicas[0].generate.remote([Generate((("user", "Say hi."),), max_tokens=2)]))
        return stage, time.perf_counter() - t

    def engine_pass(engine_config, record=None):
        for name, s in stages.items():  # stages hold their own batching policy
            s.batching = getattr(engine_config, name)
        stage = stages["generator"]
        launch = stage.launch
        if record is not None:
            stage.launch = lambda replica, batch: (record.extend(batch), launch(replica, batch))[1]
        ray.get(stage.replicas[0].reset_prefix_cache.remote())
        rows = []
        engine = Engine(stages, {args.strategy: strategy}, engine_config, rows.append)
        for s in stages.values():
            s.stats = type(s.stats)()
        t = time.perf_counter()
        engine.run(questions, [args.strategy])
        wall = time.perf_counter() - t
        stage.launch = launch
        summary = stage.stats.summary()
        print(f"engine pass: {len(rows)} questions in {wall:.1f} s", file=sys.stderr, flush=True)
        return {"wall_s": round(wall, 2), "questions": len(rows), "tokens": engine.tokens,
                "tok_s": engine.tokens / wall, "generator_calls": stage.stats.calls,
                "mean_batch": summary["batch_size"]["mean"], "first_row_s": engine.first_row_s,
                "errors": sum(r["error"] is not None for r in rows)}, rows

    def raw_pass(requests, one_call: bool):
        generator = stages["generator"].replicas[0]
        ray.get(generator.reset_prefix_cache.remote())
        t = time.perf_counter()
        if one_call:
            results = ray.get(generator.generate.remote(requests))
        else:
            results = [ray.get(generator.generate.remote([r]))[0] for r in requests]
        wall = time.perf_counter() - t
        tokens = sum(r.prompt_tokens + r.completion_tokens for r in results)
        print(f"raw pass ({'one call' if one_call else 'one at a time'}): {wall:.1f} s", file=sys.stderr, flush=True)
        return {"wall_s": round(wall, 2), "requests": len(requests), "tokens": tokens, "tok_s": tokens / wall}

    sequential = config.engine.model_copy(deep=True)
    sequential.window = 1
    for name in ("generator", "judge", "retriever"):
        getattr(sequential, name).max_batch = 1

    report = {"strategy": args.strategy, "generator": args.generator, "n_questions": len(questions),
              "repeats": args.repeats, "overrides": args.set, "startup_s": {}, "passes": {}}
    passes = report["passes"]
    prompts: list = []
    answers = {}
    def repeat(serving: str, engine_stage, raw_stage=None) -> None:
        """One repeat of ``serving``'s engine passes, each after the raw pass on ``raw_stage`` (the batch
        replica, when it is up) that it is divided by: adjacent, the box's drift stays out of the ratio."""
        for one_by_one in [False] if args.skip_sequential else [False, True]:
            if raw_stage is not None:
                stages["generator"] = raw_stage
                passes.setdefault("raw_sequential" if one_by_one else "raw_batched", []).append(
                    raw_pass(prompts, one_call=not one_by_one))
            if serving in args.serving.split(","):
                stages["generator"] = engine_stage
                result, rows = engine_pass(sequential if one_by_one else config.engine)
                passes.setdefault(f"engine_{serving}" + ("_sequential" if one_by_one else ""), []).append(result)
                if not one_by_one:
                    answers[serving] = {row["id"]: row["answer"] for row in rows}

    if args.interleave:
        kinds = args.serving.split(",")
        if len(kinds) != 1 or kinds[0] == "batch":
            raise SystemExit("--interleave compares one streaming kind with the raw limit: --serving async")
        batch_stage, report["startup_s"]["batch"] = start_generator("batch")
        stages["generator"] = batch_stage
        engine_pass(config.engine, record=prompts)  # the engine's own requests, recorded once
        other, report["startup_s"][kinds[0]] = start_generator(kinds[0])
        for _ in range(args.repeats):
            repeat(kinds[0], other, raw_stage=batch_stage)
        report["interleaved"] = True
    else:  # one replica at a time, the batch kind first: its replica is also the raw LLM.generate limit
        for serving in ["batch", *[s for s in args.serving.split(",") if s != "batch"]]:
            stage, report["startup_s"][serving] = start_generator(serving)
            stages["generator"] = stage
            if serving == "batch":
                engine_pass(config.engine, record=prompts)
            for _ in range(args.repeats):
                repeat(serving, stage, raw_stage=stage if serving == "batch" else None)
            ray.kill(stage.replicas[0])

    raw = [x["tok_s"] for x in passes["raw_batched"]]
    for serving in args.serving.split(","):
        runs = [x["tok_s"] for x in passes[f"engine_{serving}"]]
        entry = report[serving] = {"efficiency_vs_limit": spread([e / r for e, r in zip(runs, raw)])}
        if not args.skip_sequential:
            seq = [x["tok_s"] for x in passes[f"engine_{serving}_sequential"]]
            raw_seq = [x["tok_s"] for x in passes["raw_sequential"]]
            entry["engine_batched_over_sequential"] = spread([e / s for e, s in zip(runs, seq)])
            entry["raw_batched_over_sequential"] = spread([r / s for r, s in zip(raw, raw_seq)])
            entry["share_of_raw_gain_kept"] = spread([gain_kept(*x) for x in zip(runs, seq, raw, raw_seq)])
    if len(answers) == 2:
        a, b = answers.values()
        report["answers_identical_across_kinds"] = sum(a[i] == b[i] for i in a)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "passes"}, indent=2))


if __name__ == "__main__":
    main()
