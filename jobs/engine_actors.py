"""Several engines over one run's pools (``engine.actors`` > 1).

One process drives about 5,000 requests/s (BENCHMARKS.md, simulated cluster: 0.15-0.19 ms of CPU per
request), about 32 H100 replicas of an 8B model on RA-ISF. Past that the questions are dealt out among
engine actors, row by row (row i to actor i mod n, so every input shard is shared and none waits on
one actor): each runs the same Engine over its questions and sends its requests to the same replica
pools, with 1/n of each replica's token budget so that together they keep to it. Each actor streams its
rows back to the job's process, which alone writes and commits parts: exactly once and resumable as with
one engine. An engine actor that dies fails the run like an engine that raises; committed parts stay
and the rerun resumes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from types import SimpleNamespace

from engine.cache import RequestCache
from engine.loop import Engine
from jobs.questions import question_rows
from schemas.config import EngineConfig
from schemas.errors import StageDown, UserError

REPORT_S = 0.5  # how often an actor sends its rows and status back


class Todo:
    """Which (strategy, question) pairs still need an answer, as ``ShardedOutput.todo`` says, carried to an
    engine actor (the output itself stays with the job's process)."""

    def __init__(self, committed: set, retrying: dict):
        self.committed, self.retrying = set(committed), {k: set(v) for k, v in retrying.items()}

    def __call__(self, strategy: str, question) -> bool:
        key = (strategy, question.shard)
        if key in self.retrying:
            return question.id in self.retrying[key]
        return key not in self.committed


def status(engine: Engine) -> dict:
    """What the job's progress line and live metrics read from an engine, as plain data."""
    return {"roots_done": engine.roots_done, "tokens": engine.tokens, "roots_in_flight": engine.roots_in_flight,
            "stages": {name: {"queued": len(s.queue), "inflight": list(s.inflight), "running": s.running,
                              "restarting": sorted(s.restarting),
                              "deaths": list(s.deaths), "retired": sorted(s.retired), "replicas": len(s.replicas),
                              "requests": s.stats.requests, "errors": s.stats.errors, "busy_s": s.stats.busy_s}
                       for name, s in engine.stages.items()}}


class EngineActor:
    """One engine, in an actor of its own, over every ``n``-th question of the input."""

    def __init__(self, stages: dict, strategies: dict, config: EngineConfig, share: float, cache_path=None,
                 namespaces: dict[str, str] | None = None, max_bytes: int | None = None):
        for stage in stages.values():
            stage.share = share
        # the run's disk cache, opened here (SQLite in WAL mode takes several writers); memory is per engine
        cache = RequestCache(config.cache_size, cache_path, namespaces, max_bytes, config.cache_mb * 2**20)
        # filled on the engine's thread, emptied by the streaming call's
        self.rows: queue.Queue = queue.Queue()
        self.lines: queue.Queue = queue.Queue()
        self.engine = Engine(stages, strategies, config, self.rows.put, on_progress=self._report,
                             progress_every_s=REPORT_S, log=self.lines.put, cache=cache)
        self.status = status(self.engine)

    def _report(self, engine: Engine) -> None:
        self.status = status(engine)  # made on the engine's thread, read whole by the streaming call

    def run(self, read: dict, nth: tuple[int, int], strategy_names: list[str], todo: Todo) -> Iterator[dict]:
        """Answer questions ``nth[0]``, ``nth[0] + nth[1]``, ... of the input, streaming {rows, status, log}
        every REPORT_S and, last, the engine's metrics (with this process's CPU seconds while answering)."""
        k, n = nth
        cpu = time.process_time()
        questions = (q for i, q in enumerate(question_rows(**read)) if i % n == k)
        failure: list[BaseException] = []

        def drive():
            try:
                self.engine.run(questions, strategy_names, todo=todo)
            except BaseException as err:  # noqa: BLE001 - raised again in the streaming call, below
                failure.append(err)

        thread = threading.Thread(target=drive, name="engine", daemon=True)
        thread.start()
        while thread.is_alive() or not self.rows.empty():
            rows, deadline = [], time.monotonic() + REPORT_S
            while time.monotonic() < deadline:
                try:
                    rows.append(self.rows.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    if not thread.is_alive():
                        break
            yield {"rows": rows, "status": self.status, "log": drain(self.lines)}
        if failure:
            raise failure[0]
        yield {"rows": [], "status": status(self.engine), "log": drain(self.lines),
               "metrics": {**self.engine.metrics(), "process_cpu_s": round(time.process_time() - cpu, 3)}}


def drain(q: queue.Queue) -> list:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class View:
    """The engines' statuses summed, with the attributes Progress and RayMetrics read from an Engine."""

    def __init__(self, statuses: list[dict]):
        live = [s for s in statuses if s]
        self.roots_done = sum(s["roots_done"] for s in live)
        self.tokens = sum(s["tokens"] for s in live)
        self.roots_in_flight = sum(s["roots_in_flight"] for s in live)
        self.stages = {}
        for name in (live[0]["stages"] if live else {}):
            parts = [s["stages"][name] for s in live]
            self.stages[name] = _StageView(parts)


class _StageView:
    def __init__(self, parts: list[dict]):
        self.queue = range(sum(p["queued"] for p in parts))
        self.inflight = [sum(column) for column in zip(*(p["inflight"] for p in parts))]
        self.running = sum(p["running"] for p in parts)
        self.restarting = set().union(*(p["restarting"] for p in parts))
        self.retired = set().union(*(p["retired"] for p in parts))
        self.deaths = [max(column) for column in zip(*(p["deaths"] for p in parts))]
        self.replicas = range(parts[0]["replicas"])
        self.stats = SimpleNamespace(requests=sum(p["requests"] for p in parts), errors=sum(p["errors"] for p in parts),
                                     busy_s=max(p["busy_s"] for p in parts))  # as merge_metrics: a lower bound


def run_engines(n: int, stages: dict, strategies: dict, config, read: dict, todo: Todo, write: Callable[[dict], None],
                report: Callable, log: Callable[[str], None], cache: RequestCache | None = None,
                report_every_s: float = 10.0, mark: dict[str, int] | None = None) -> dict:
    """Answer with ``n`` engine actors, each with the disk part of ``cache`` (its path, namespaces and bound);
    ``write`` each row here; returns the merged metrics (of ``cache``'s own counts, those since ``mark``)."""
    import ray

    actor = ray.remote(EngineActor).options(num_cpus=config.engine.actor_cpus, max_restarts=0,
                                            resources=config.engine.actor_resources or None)
    disk = (cache.path, cache.namespaces, cache.max_bytes) if cache is not None else ()
    engines = [actor.remote(stages, strategies, config.engine, 1.0 / n, *disk) for _ in range(n)]
    streams = {engines[k].run.remote(read, (k, n), config.strategies, todo): k for k in range(n)}
    statuses: list[dict] = [{} for _ in range(n)]
    metrics: list[dict | None] = [None] * n
    started, first_row, reported, last = time.perf_counter(), None, float("-inf"), None
    try:
        while streams:
            ready, _ = ray.wait(list(streams), num_returns=1, timeout=REPORT_S)
            for stream in ready:
                try:
                    message = ray.get(next(stream))
                except StopIteration:
                    del streams[stream]
                    continue
                except ray.exceptions.RayTaskError as err:
                    # an error the user fixes (a stage that cannot run) is said as in one engine: its
                    # own line, not under the engine actor's traceback
                    if isinstance(err.cause, (UserError, StageDown)):
                        raise err.cause from None
                    raise
                except ray.exceptions.RayActorError as err:  # its process died (killed, out of memory, its node)
                    why = " ".join(str(err).split())[:500] or type(err).__name__  # Ray's reason is on later lines
                    # StageDown: the CLI's one line (README), not a traceback through Ray's error
                    if getattr(err, "actor_init_failed", False):
                        raise StageDown(f"engine actor {streams[stream]} of {n} could not start ({why})") from err
                    raise StageDown(f"engine actor {streams[stream]} of {n} died ({why}); the parts committed "
                                    "so far are kept: the same command answers the rest") from err
                k = streams[stream]
                for row in message["rows"]:
                    write(row)
                if message["rows"] and first_row is None:
                    first_row = time.perf_counter() - started
                for line in message["log"]:
                    log(f"engine {k}: {line}")
                statuses[k] = message["status"]
                if "metrics" in message:
                    metrics[k] = message["metrics"]
                    last = k
            if all(statuses) and time.perf_counter() - reported >= report_every_s:
                reported = time.perf_counter()
                report(View(statuses))
        report(View(statuses))
    finally:
        for e in engines:
            ray.kill(e)
    done = [m for m in metrics if m is not None]
    merged = merge_metrics(done, time.perf_counter() - started, first_row,
                           last=done.index(metrics[last]) if last is not None else None)
    # what the driver's open pruned (a shared cache's: since ``mark``), besides the engines'
    merged["request_cache"]["pruned"] += cache.counts_since(mark)["pruned"] if cache is not None else 0
    return merged


SUMMED = ("roots_done", "tokens_computed", "requests_deduped", "batch_failures", "batch_splits", "stage_tests",
          "empty_answers", "trees_capped", "parse_failures", "peak_roots_in_flight")
STAGE_SUMMED = ("calls", "requests", "errors", "rests")


def merge_metrics(parts: list[dict], wall_s: float, first_row_s: float | None, last: int | None = None) -> dict:
    """One run's metrics from its engines': counts summed, replica restarts (each engine sees every restart of
    a shared replica) the most any engine saw; each engine's own metrics kept under ``engines``."""
    merged = {key: sum(p[key] for p in parts) for key in SUMMED}
    merged.update(wall_s=round(wall_s, 3), first_row_s=None if first_row_s is None else round(first_row_s, 3),
                  tokens_per_s=round(merged["tokens_computed"] / wall_s, 2) if wall_s else 0.0,
                  replica_restarts=max((p["replica_restarts"] for p in parts), default=0))
    stages = {}
    for name in parts[0]["stages"] if parts else ():
        each = [p["stages"][name] for p in parts]
        stage = {key: round(sum(s[key] for s in each), 3) for key in STAGE_SUMMED}
        # a replica is busy while any engine has a batch on it: the union over engines, which their busy time
        # (busy_s, and busy_bins, summed over the stage's replicas) does not give (summed, one replica would
        # read busier than the run was long); the most any engine saw is the part of it that is known, a lower
        # bound
        stage["busy_s"] = round(max(s["busy_s"] for s in each), 3)
        # percentiles do not merge: each engine's are under `engines`
        stage["batch_size"] = {"mean": round(stage["requests"] / max(1, stage["calls"]), 2),
                               "max": max(s["batch_size"]["max"] for s in each)}
        stage["driver_bytes_in"] = {k: sum(s["driver_bytes_in"][k] for s in each) for k in ("total", "by_reference")}
        if any("peak_tokens_in_flight" in s for s in each):
            stage["peak_tokens_in_flight"] = max(s.get("peak_tokens_in_flight", 0) for s in each)
        prompt = sum(s.get("prompt_tokens", 0) for s in each)
        if prompt:
            cached = sum(s.get("cached_tokens", 0) for s in each)
            stage.update(prefix_cache_hit_rate=round(cached / prompt, 4), prompt_tokens=prompt, cached_tokens=cached)
        # the replicas' own counters, which every engine shares and which only grow: the read of the
        # engine that finished last (parts[last]) saw all the work
        reads = ([each[last]] if last is not None else []) + each
        vllm = next((s["vllm"] for s in reads if "vllm" in s), None)
        if vllm is not None:
            stage["vllm"] = vllm
        stages[name] = stage
    resolved = summed([p["resolved_by"] for p in parts])
    caches = [p["request_cache"] for p in parts]
    lookups = sum(c["lookups"] for c in caches)
    hits = {w: sum(c["hits"][w] for c in caches) for w in ("memory", "disk")}
    by_stage = summed([c["by_stage"] for c in caches])
    merged.update(stages=stages, resolved_by=resolved, truncated=summed([p.get("truncated", {}) for p in parts]),
                  request_cache={"path": next((c["path"] for c in caches if c["path"]), None),
                                 "disk_error": next((c["disk_error"] for c in caches if c["disk_error"]), None),
                                 "read_only": any(c.get("read_only") for c in caches),
                                 "pruned": sum(c["pruned"] for c in caches),
                                 "undecodable": sum(c["undecodable"] for c in caches),
                                 "unsaved": sum(c["unsaved"] for c in caches), "lookups": lookups,
                                 "hits": hits, "hit_rate": round(sum(hits.values()) / lookups, 4) if lookups else 0.0,
                                 "by_stage": dict(sorted(by_stage.items()))},
                  driver_bytes_in_per_root=round(sum(s["driver_bytes_in"]["total"] for s in stages.values())
                                                 / max(1, merged["roots_done"]), 1),
                  engines=parts)
    return merged


def summed(nested: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """``{outer: {inner: count}}`` added up over the engines (how each strategy's questions were resolved,
    cache lookups and hits per stage)."""
    total: dict[str, Counter] = {}
    for each in nested:
        for outer, counts in each.items():
            total.setdefault(outer, Counter()).update(counts)
    return {outer: dict(counts) for outer, counts in total.items()}
