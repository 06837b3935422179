"""Engine efficiency against the raw vLLM limit and against one-at-a-time execution.

On the same questions, real model, same prompts:
  1. engine tokens/s (prompt + generated) / raw ``LLM.generate`` tokens/s on the engine's own prompts
     submitted in one call                                                  (target >= 0.8)
  2. engine questions/s / the same strategy run one question and one call at a time, next to the
     raw engine's own batched/sequential ratio on the same prompts          (target: keep >= 0.8 of it)
The prefix cache is reset before each pass so every pass starts cold; model start-up is excluded.

    python benchmarks/engine_efficiency.py --n 50 --strategy raisf
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50, help="questions, spread evenly over the 200-question sample")
    p.add_argument("--strategy", default="raisf")
    p.add_argument("--generator", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--skip-sequential", action="store_true")
    p.add_argument("--out", default="runs/bench_efficiency/report.json")
    args = p.parse_args()

    import ray

    from engine.loop import Engine
    from jobs.demo import QUESTIONS, ensure_index
    from jobs.io import question_rows
    from jobs.models import ragsift_home
    from jobs.pools import build_stages
    from jobs.ray_session import init_ray
    from schemas.config import load_config
    from strategies.registry import AnswerConfig, make_strategy

    index_dir = ragsift_home() / "indexes" / "demo"
    ensure_index(index_dir, 2, log=lambda *a, **k: None)
    all_q = list(question_rows(str(QUESTIONS)))
    questions = all_q[:: max(1, len(all_q) // args.n)][: args.n]  # spread over all six datasets

    config = load_config(AnswerConfig, None, [f"index.path={index_dir}", f"generator.model={args.generator}"],
                         strategies=[args.strategy])
    init_ray(config.ray)
    strategy = make_strategy(args.strategy, config)
    stages = build_stages(config, set(strategy.stages))
    generator = stages["generator"].replicas[0]
    from schemas.records import Generate

    ray.get(generator.generate.remote([Generate((("user", "Say hi."),), max_tokens=2)]))  # start-up
    if "retriever" in stages:
        ray.get(stages["retriever"].replicas[0].encode.remote(["warm up"]))

    def engine_pass(engine_config, answers_dir=None):
        for name, s in stages.items():  # stages hold their own batching policy
            s.batching = getattr(engine_config, name)
        recorded = []
        stage = stages["generator"]
        launch = stage.launch
        stage.launch = lambda replica, batch: (recorded.extend(batch), launch(replica, batch))[1]
        ray.get(generator.reset_prefix_cache.remote())
        rows = []
        engine = Engine(stages, {args.strategy: strategy}, engine_config, rows.append)
        for s in stages.values():
            s.stats = type(s.stats)()
        t = time.perf_counter()
        engine.run(questions, [args.strategy])
        wall = time.perf_counter() - t
        stage.launch = launch
        if answers_dir:  # keep the batched pass's answers for evaluation
            import pyarrow as pa
            import pyarrow.parquet as pq

            from schemas.tables import ANSWERS

            os.makedirs(f"{answers_dir}/{args.strategy}", exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), f"{answers_dir}/{args.strategy}/part-00000.parquet")
        return {"wall_s": wall, "questions": len(rows), "qps": len(rows) / wall, "tokens": engine.tokens,
                "tok_s": engine.tokens / wall, "generator_calls": stage.stats.calls,
                "generator_requests": len(recorded), "mean_batch": stage.stats.summary()["batch_size"]["mean"],
                "errors": sum(r["error"] is not None for r in rows)}, recorded

    def raw_pass(requests, one_call: bool):
        ray.get(generator.reset_prefix_cache.remote())
        t = time.perf_counter()
        if one_call:
            results = ray.get(generator.generate.remote(requests))
        else:
            results = [ray.get(generator.generate.remote([r]))[0] for r in requests]
        wall = time.perf_counter() - t
        tokens = sum(r.prompt_tokens + r.completion_tokens for r in results)
        return {"wall_s": wall, "requests": len(requests), "tokens": tokens, "tok_s": tokens / wall}

    report = {"strategy": args.strategy, "generator": args.generator, "n_questions": len(questions)}
    report["engine"], prompts = engine_pass(config.engine, os.path.dirname(args.out) + "/answers")
    report["raw_batched"] = raw_pass(prompts, one_call=True)
    report["efficiency_vs_limit"] = report["engine"]["tok_s"] / report["raw_batched"]["tok_s"]
    if not args.skip_sequential:
        seq = config.engine.model_copy(deep=True)
        seq.window = 1
        for name in ("generator", "judge", "retriever"):
            getattr(seq, name).max_batch = 1
        report["engine_sequential"], _ = engine_pass(seq)
        report["raw_sequential"] = raw_pass(prompts, one_call=False)
        engine_ratio = report["engine"]["qps"] / report["engine_sequential"]["qps"]
        raw_ratio = report["raw_batched"]["tok_s"] / report["raw_sequential"]["tok_s"]
        report.update(engine_speedup_vs_sequential=engine_ratio, raw_batched_over_sequential=raw_ratio,
                      share_of_raw_speedup_kept=engine_ratio / raw_ratio)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
