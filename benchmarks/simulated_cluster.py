"""A simulated GPU cluster (benchmark only, never a default): how many vLLM replicas one driver keeps busy.

The replicas are Ray actors that answer like vLLM's async engine (``actors/streaming_generator.py``'s
``kv_capacity`` and ``stream``) and take as long as an H100 serving Llama-3-8B with continuous
batching would (``H100Llama8B``, derived below); they answer with scripted texts
(``engine_overhead.StubGenerator``: RA-ISF about 40% of questions known, 30% answered from a relevant
passage, 30% decomposed; MIGRES a statement extracted per query and the main module answering about
60% of the time, else another iteration). Everything else is the product: ``jobs.answer.answer`` with
the real engine, the real strategies (``--strategies raisf,migres``: every question answered by both,
the mix issue 19 names), the streaming generator stage's token backpressure, real Ray streaming
calls, answers committed as Parquet parts per shard and the exactly-once check. Retrieval (dense and
BM25) and MIGRES's ranker are instant stubs (their own pools in a real cluster; not what this measures).

Measured: each replica's busy fraction (time with at least one sequence scheduled, on the
simulated clock, over the span from the first request to the last result), the driver's CPU time
per request, and throughput. The driver shares this machine's cores with the replica processes and
Ray, so its figures here are a lower bound of what a head node with its own cores does.

    python benchmarks/simulated_cluster.py --replicas 8 32 64 --questions 100000

The step-time model (``H100Llama8B.step_s``), from public figures:
- H100 SXM: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3 (NVIDIA's datasheet); 80 GB.
- Llama-3-8B: 8.03e9 parameters (16.06 GB in BF16), 32 layers, 8 KV heads of 128 dims (grouped-query
  attention): 2 x 32 x 8 x 128 x 2 bytes = 128 KiB of KV cache per token.
- A step runs the linear layers once for all scheduled tokens: memory-bound below ~200 tokens
  (every weight read once: 16.06 GB / (3.35 TB/s x 0.8) = 6.0 ms), compute-bound above
  (2 x 8.03e9 FLOP per token / (989 TFLOP/s x 0.5 MFU) = 32.5 us per token); plus reading the
  decoding sequences' KV cache (context tokens x 128 KiB / (3.35 TB/s x 0.8) = 0.049 us per token),
  plus 1 ms of scheduling, sampling and detokenising per step. Prefill attention's quadratic
  term (~2% of a 1k-token prompt's FLOPs) and prefix caching are left out.
- Checks against published behaviour: one sequence decodes at 7.0 ms a token (143 tokens/s; vLLM
  reports 120-150 for Llama-3-8B on one H100); a full 16,384-token prefill step runs at ~30k
  tokens/s (the 25-40k range reported for 8B models on H100).
- vLLM's scheduler defaults on an H100 for offline use (vllm/engine/arg_utils.py): 16,384 tokens and
  1,024 sequences per step, chunked prefill. KV cache: 0.9 of 80 GB, less the weights and ~4 GB of
  activations and CUDA graphs: 51.9 GB = 396k tokens.
- Completions by step (``COMPLETION``): judgments 1 token, answers 12, decompositions 40 (RA-ISF's
  short outputs), MIGRES's extraction, main module and knowledge 60, its queries 25; prompt tokens are
  estimated as characters / 4 (no tokenizer).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import resource
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class H100Llama8B:
    """Step time of vLLM continuous batching, Llama-3-8B in BF16 on one H100 SXM (derivation above)."""

    peak_flops: float = 989e12
    hbm_bytes_per_s: float = 3.35e12
    params: float = 8.03e9
    kv_bytes_per_token: int = 2 * 32 * 8 * 128 * 2
    mfu: float = 0.5
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.001
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 1024
    kv_cache_bytes: float = 0.9 * 80e9 - 2 * 8.03e9 - 4e9
    time_scale: float = 1.0  # >1 slows the simulated GPU down (a smaller machine can then drive it)

    @property
    def kv_capacity(self) -> int:
        return int(self.kv_cache_bytes // self.kv_bytes_per_token)

    def step_s(self, tokens: int, context_tokens: int) -> float:
        """One forward step over ``tokens`` scheduled tokens while decoding sequences hold ``context_tokens``."""
        bandwidth = self.hbm_bytes_per_s * self.bandwidth_efficiency
        weights = 2 * self.params / bandwidth
        compute = 2 * self.params * tokens / (self.peak_flops * self.mfu)
        kv = context_tokens * self.kv_bytes_per_token / bandwidth
        return (self.step_overhead_s + max(weights, compute) + kv) * self.time_scale


@dataclass
class Seq:
    index: int
    call: asyncio.Queue
    prompt: int
    completion: int
    result: object
    prefill_left: int = 0
    started: int = 0  # step at which it began decoding


@dataclass
class ReplicaStats:
    steps: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    requests: int = 0
    first_request: float | None = None
    last_result: float = 0.0
    max_lag_s: float = 0.0  # how far the simulated clock fell behind the wall clock (a starved process)
    peak_running: int = 0
    running_sum: int = 0  # sequences scheduled, summed over steps


# completion tokens by the request's step: RA-ISF's short outputs (judgments 1 token, answers 12,
# decompositions 40); MIGRES's JSON steps under their max_tokens (leaf 200, main 160, query 120,
# knowledge 96): a statement or two, an answer with a one-line explanation, one query
COMPLETION = {"answer": 12, "decompose": 40, "leaf": 60, "main": 60, "query": 25, "knowledge": 60}  # judgments: 1


class SimulatedReplica:
    """A vLLM async engine replica without a model (benchmark only): answers as a script says, when
    the step model says the sequence would have finished."""

    def __init__(self, model: dict | None = None, chunk_s: float = 0.01):
        from engine_overhead import StubGenerator

        self.model = H100Llama8B(**(model or {}))
        self.script = StubGenerator()
        self.chunk_s = chunk_s
        self.waiting: deque[Seq] = deque()  # admitted or not, prompt not fully computed yet
        self.finishing: list[tuple[int, int, Seq]] = []  # (step it ends at, tiebreak, seq)
        self.decoding = 0
        self.running = 0
        self.context = 0
        self.kv_used = 0
        self.step_no = 0
        self.order = 0
        self.stats = ReplicaStats()
        self.wake: asyncio.Event | None = None
        self.loop_task = None

    def kv_capacity(self) -> int:
        return self.model.kv_capacity

    def report(self) -> dict:
        return asdict(self.stats)

    async def stream(self, requests: list):
        from actors.streaming_generator import finished_chunks

        if self.loop_task is None:
            self.wake = asyncio.Event()
            self.loop_task = asyncio.get_running_loop().create_task(self._run())
        now = time.perf_counter()
        if self.stats.first_request is None:
            self.stats.first_request = now
        done: asyncio.Queue = asyncio.Queue()
        for i, request in enumerate(requests):
            result = self._answer(request)
            self.waiting.append(Seq(i, done, result.prompt_tokens, result.completion_tokens, result,
                                    prefill_left=result.prompt_tokens))
        self.stats.requests += len(requests)
        self.wake.set()
        async for chunk in finished_chunks(done, len(requests), self.chunk_s):
            yield chunk

    def _answer(self, request):
        from schemas.records import Judge

        [result] = self.script.generate([request])
        result.prompt_tokens = max(1, sum(len(text) for _, text in request.messages) // 4)
        result.completion_tokens = (1 if isinstance(request, Judge) else
                                    COMPLETION.get(request.step, COMPLETION["decompose" if request.json_schema else "answer"]))
        return result

    async def _run(self) -> None:
        m, s = self.model, self.stats
        clock = time.perf_counter()
        while True:
            if not self.waiting and not self.decoding and not self.finishing:
                self.wake.clear()
                await self.wake.wait()
                clock = time.perf_counter()
                continue
            budget = m.max_num_batched_tokens - self.decoding
            prefill, ended, promoted = 0, [], []
            while self.waiting and budget > 0:
                seq = self.waiting[0]
                if seq.prefill_left == seq.prompt:  # not admitted yet: room for one more sequence and its KV?
                    if self.running >= m.max_num_seqs or self.kv_used + seq.prompt + seq.completion > m.kv_capacity:
                        break
                    self.running += 1
                    self.kv_used += seq.prompt + seq.completion
                take = min(budget, seq.prefill_left)
                seq.prefill_left -= take
                budget -= take
                prefill += take
                if seq.prefill_left:
                    break
                self.waiting.popleft()
                if seq.completion <= 1:  # its one token comes with the prefill step
                    ended.append(seq)
                else:
                    promoted.append(seq)
            decode = self.decoding
            dt = m.step_s(prefill + decode, self.context)
            clock += dt
            s.steps += 1
            s.busy_s += dt
            s.prefill_tokens += prefill
            s.decode_tokens += decode
            s.running_sum += self.running
            s.peak_running = max(s.peak_running, self.running)
            wait = clock - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                s.max_lag_s = max(s.max_lag_s, -wait)
                await asyncio.sleep(0)  # let calls arrive even while catching up
            self.context += decode  # each decoding sequence grew by a token
            while self.finishing and self.finishing[0][0] <= self.step_no:
                seq = heapq.heappop(self.finishing)[2]
                self.decoding -= 1
                self.context -= seq.prompt + (self.step_no - seq.started + 1)
                ended.append(seq)
            for seq in promoted:  # prefill done, first token out: decodes from the next step on
                seq.started = self.step_no + 1
                self.order += 1
                heapq.heappush(self.finishing, (self.step_no + seq.completion - 1, self.order, seq))
                self.decoding += 1
                self.context += seq.prompt
            for seq in ended:
                self.running -= 1
                self.kv_used -= seq.prompt + seq.completion
                seq.call.put_nowait((seq.index, seq.result))
            if ended:
                s.last_result = time.perf_counter()
            self.step_no += 1


def one(replicas: int, questions: int, window: int, time_scale: float, engines: int = 1,
        strategies: tuple[str, ...] = ("raisf",)) -> dict:
    import ray
    from engine_overhead import StubEncoder, StubRanker, StubShard, write_questions

    from engine.stages import RankerStage, RetrieverStage, StreamingGeneratorStage
    from jobs.answer import answer
    from strategies.registry import AnswerConfig

    tmp = tempfile.mkdtemp()
    qpath = f"{tmp}/q.parquet"
    write_questions(qpath, questions)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=1024 * 2**20)
    # the same roots in flight whatever the number of engines
    config = AnswerConfig(questions=qpath, output=f"{tmp}/out", strategies=list(strategies),
                          engine={"window": window // engines, "cache_size": 0, "actors": engines, "actor_cpus": 0})
    model = {"time_scale": time_scale}
    gen = [ray.remote(SimulatedReplica).options(num_cpus=0, max_concurrency=1000).remote(model)
           for _ in range(replicas)]
    ray.get([g.__ray_ready__.remote() for g in gen])
    enc = [ray.remote(StubEncoder).options(num_cpus=0).remote() for _ in range(2)]
    # Wikipedia-sized passages (about 100 words, 14 sentences: MIGRES ranks them one by one)
    shards = [ray.remote(StubShard).options(num_cpus=0).remote(i, "Some words of text in one sentence. " * 14)
              for i in range(2)]
    stages = {"generator": StreamingGeneratorStage(gen, config.engine.generator, "generator"),
              "retriever": RetrieverStage(enc, shards, config.engine.retriever, bm25=True)}
    if "migres" in strategies:  # its passage and sentence filter: a cross-encoder pool, instant here like retrieval
        stages["ranker"] = RankerStage([ray.remote(StubRanker).options(num_cpus=0).remote() for _ in range(2)],
                                       config.engine.ranker)
    cpu, wall = time.process_time(), time.perf_counter()
    metrics = answer(config, log=lambda *a: None, stages=stages)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    # with engine actors the driving is theirs: their processes' CPU, plus the job's process (reads, writes)
    engine_cpu = [e["process_cpu_s"] for e in metrics.get("engines", [])]
    job_cpu, cpu = cpu, cpu + sum(engine_cpu)
    reports = ray.get([g.report.remote() for g in gen])
    ray.shutdown()
    span = max(r["last_result"] for r in reports) - min(r["first_request"] for r in reports if r["first_request"])
    busy = [r["busy_s"] / span for r in reports]
    requests = sum(r["requests"] for r in reports)
    g = metrics["stages"]["generator"]
    return {
        "replicas": replicas, "questions": questions, "strategies": list(strategies), "window": window,
        "time_scale": time_scale,
        "engines": engines, "job_process_cpu_s": round(job_cpu, 1), "engine_actor_cpu_s": engine_cpu,
        "wall_s": round(wall, 1), "answer_span_s": round(span, 1),
        "questions_per_s": round(questions / wall, 1), "answers_per_s": round(questions * len(strategies) / wall, 1),
        "requests": requests,
        "requests_per_s": round(requests / span, 1),
        "utilisation": {"mean": round(sum(busy) / len(busy), 3), "min": round(min(busy), 3), "max": round(max(busy), 3)},
        "mean_running_seqs_per_step": round(sum(r["running_sum"] for r in reports) / max(1, sum(r["steps"] for r in reports)), 1),
        "prefill_tokens": sum(r["prefill_tokens"] for r in reports),
        "decode_tokens": sum(r["decode_tokens"] for r in reports),
        "max_simulator_lag_s": round(max(r["max_lag_s"] for r in reports), 3),
        "driver_cpu_s": round(cpu, 1), "driver_cpu_share": round(cpu / wall, 3),
        "driver_cpu_ms_per_request": round(1000 * cpu / requests, 4),
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "generator_calls": g["calls"], "requests_per_call": g["batch_size"]["mean"],
        "peak_tokens_in_flight": g.get("peak_tokens_in_flight"),
        "batch_failures": metrics["batch_failures"], "replica_restarts": metrics["replica_restarts"],
        "resolved_by": metrics["resolved_by"], "parse_failures": metrics["parse_failures"],
        "requests_per_replica": sorted(r["requests"] for r in reports),
        "exactly_once": all(c["ok"] for c in metrics["exactly_once"].values()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--questions", type=int, default=100_000)
    p.add_argument("--window", type=int, default=8192, help="engine.window (roots in flight)")
    p.add_argument("--time-scale", type=float, default=1.0, help="slow the simulated GPUs down by this factor")
    p.add_argument("--out", help="append each result as a JSON line here")
    p.add_argument("--engines", type=int, nargs="+", default=[1], help="engine.actors values to run (1 = the "
                   "engine in this process)")
    p.add_argument("--strategies", default="raisf", help="comma-separated; each question is answered by each "
                   "(raisf,migres: the mix issue 19 names)")
    args = p.parse_args()
    for n, engines in ((n, e) for n in args.replicas for e in args.engines):
        r = one(n, args.questions, args.window, args.time_scale, engines, tuple(args.strategies.split(",")))
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
