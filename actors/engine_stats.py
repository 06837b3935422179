"""vLLM's own per-step statistics of an async replica, summed up for the run's metrics.json.

vLLM hands every scheduler step's ``SchedulerStats`` (KV cache usage, running / waiting requests,
prefix-cache queries and hits) and ``IterationStats`` (time to first token, preemptions) to its stat
loggers; this one keeps what a person tuning a run asks about. vLLM calls these classes unstable,
so a field it no longer has reads as absent rather than failing the replica.
"""

from __future__ import annotations

from collections import deque

from vllm.v1.metrics.loggers import StatLoggerBase


class EngineStats(StatLoggerBase):
    def __init__(self, vllm_config=None, engine_index: int = 0, keep: int = 10_000):
        self.steps = 0
        self.kv_usage_sum = 0.0
        self.kv_usage_peak = 0.0
        self.running_peak = 0
        self.waiting_peak = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.ttft_s: deque[float] = deque(maxlen=keep)  # the latest ones: percentiles of the recent run

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self.steps += 1
            usage = float(getattr(scheduler_stats, "kv_cache_usage", 0.0))
            self.kv_usage_sum += usage
            self.kv_usage_peak = max(self.kv_usage_peak, usage)
            self.running_peak = max(self.running_peak, getattr(scheduler_stats, "num_running_reqs", 0))
            self.waiting_peak = max(self.waiting_peak, getattr(scheduler_stats, "num_waiting_reqs", 0))
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            if prefix is not None:
                self.prefix_queries += getattr(prefix, "queries", 0)
                self.prefix_hits += getattr(prefix, "hits", 0)
        if iteration_stats is not None:
            self.preemptions += getattr(iteration_stats, "num_preempted_reqs", 0)
            self.ttft_s.extend(getattr(iteration_stats, "time_to_first_tokens_iter", ()))

    def log_engine_initialized(self) -> None:
        pass

    def summary(self) -> dict:
        ttft = sorted(self.ttft_s)
        pct = (lambda q: round(ttft[min(len(ttft) - 1, int(q * len(ttft)))], 4)) if ttft else (lambda q: None)
        return {
            "steps": self.steps,
            "kv_cache_usage": {"mean": round(self.kv_usage_sum / self.steps, 4) if self.steps else None,
                               "peak": round(self.kv_usage_peak, 4)},
            "running_peak": self.running_peak,
            "waiting_peak": self.waiting_peak,
            "preemptions": self.preemptions,
            "prefix_cache_hit_rate": round(self.prefix_hits / self.prefix_queries, 4) if self.prefix_queries else None,
            "ttft_s": {"p50": pct(0.5), "p90": pct(0.9), "n": len(ttft)},
        }
