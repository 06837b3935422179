"""vLLM on this CPU in bfloat16 vs float32: what ``generator.dtype: auto`` decides between.

One in-process ``vllm.LLM`` per dtype (run the script once per dtype), both cores, greedy:
  rag:    32 sample questions, each after the same ~1,000-token passage, 32 new tokens
  judge:  8 short yes/no prompts, 2 new tokens (a judgment's shape: per-step cost dominates)

    python benchmarks/dtype_speed.py --dtype bfloat16
    python benchmarks/dtype_speed.py --dtype float32
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
    p.add_argument("--dtype", required=True)
    p.add_argument("--generator", default="qwen2.5-coder-0.5b-instruct")
    args = p.parse_args()
    os.environ.update(VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND=f"0-{os.cpu_count() - 1}",
                      VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS=str(os.cpu_count()))
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams

    from jobs.demo import CORPUS, QUESTIONS
    from jobs.models import loadable

    llm = LLM(model=loadable(args.generator), dtype=args.dtype, max_model_len=2048, enforce_eager=True, seed=0)
    questions = pq.read_table(QUESTIONS)["question"].to_pylist()[:32]
    passage = " ".join(pq.read_table(CORPUS)["text"].to_pylist()[:12])[:4000]
    report = {"dtype": args.dtype, "generator": args.generator}
    for name, prompts, max_tokens in (
            ("rag", [passage + "\nQuestion: " + q for q in questions], 32),
            ("judge", ["Answer yes or no. " + q for q in questions[:8]], 2)):
        messages = [[{"role": "user", "content": text}] for text in prompts]
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        llm.chat(messages[:1], params, use_tqdm=False)  # warm-up
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outs = llm.chat(messages, params, use_tqdm=False)
        wall = time.perf_counter() - t
        tokens = sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)
        report[name] = {"prompts": len(prompts), "tokens": tokens, "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 1)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
