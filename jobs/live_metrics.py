"""A run's counters as Ray metrics (``ray.util.metrics``) while it runs: every Ray node's metrics agent
exports them in Prometheus format (``<node ip>:<metrics_export_port>/metrics``, what Prometheus scrapes
and the Ray dashboard's Metrics view charts). Ray prefixes each name with ``ray_``; every series has an
``output`` tag (the run's output directory, characters past ASCII percent-encoded) so that runs sharing a cluster stay
apart.

    ragsift_pairs_done_total             (question, strategy) pairs answered
    ragsift_pairs_todo                   pairs this run answers in all
    ragsift_tokens_total                 prompt + completion tokens computed
    ragsift_roots_in_flight              questions in flight
    ragsift_stage_queued{stage}          requests waiting for a batch
    ragsift_stage_running{stage}         requests sent to replicas, not back yet
    ragsift_stage_replicas_ready{stage}  replicas taking work (not starting, restarting or retired)
    ragsift_stage_requests_total{stage}  requests computed
    ragsift_stage_errors_total{stage}    requests that came back as errors
    ragsift_stage_busy_seconds_total{stage}
"""

from __future__ import annotations

from urllib.parse import quote

from engine.loop import Engine

# Ray takes only ASCII tag values (a run under /home/josé/ failed at its first report); printable ASCII
# stays as written, so an ASCII path's tag is the path itself, as it was before
_TAG_SAFE = "".join(chr(c) for c in range(0x20, 0x7F))


def output_tag(output: str) -> str:
    """The ``output`` tag of a run's series: its output path, characters past ASCII percent-encoded."""
    return quote(output, safe=_TAG_SAFE)


class RayMetrics:
    """``on_progress`` for the engine (beside Progress): sets the gauges, adds to the counters what
    happened since the last call."""

    def __init__(self, output: str, total: int | None = None):
        self.tags = {"output": output_tag(output)}
        self.gauges, self.counters = _metrics()
        self.total = total
        self.last: dict[tuple[str, str], float] = {}

    def _add(self, name: str, value: float, stage: str = "") -> None:
        key = (name, stage)
        delta = value - self.last.get(key, 0.0)
        if delta > 0:
            self.counters[name].inc(delta, tags={**self.tags, "stage": stage} if stage else self.tags)
            self.last[key] = value

    def __call__(self, engine: Engine) -> None:
        # every gauge is set at every report: Ray exports a gauge's value once, not until it changes
        if self.total is not None:
            self.gauges["pairs_todo"].set(self.total, tags=self.tags)
        self._add("pairs_done", engine.roots_done)
        self._add("tokens", engine.tokens)
        self.gauges["roots_in_flight"].set(engine.roots_in_flight, tags=self.tags)
        for name, stage in engine.stages.items():
            tags = {**self.tags, "stage": name}
            self.gauges["stage_queued"].set(len(stage.queue), tags=tags)
            self.gauges["stage_running"].set(stage.running, tags=tags)
            self.gauges["stage_replicas_ready"].set(
                len(stage.replicas) - len(stage.restarting | stage.retired), tags=tags)
            self._add("stage_requests", stage.stats.requests, name)
            self._add("stage_errors", stage.stats.errors, name)
            self._add("stage_busy_seconds", stage.stats.busy_s, name)


_REGISTERED: tuple[dict, dict] | None = None


def _metrics() -> tuple[dict, dict]:
    """The metric objects, made once per process: a second object of the same name (the next run of a
    sweep or a Session) would register the name again, and Ray then drops what the first one set."""
    global _REGISTERED
    if _REGISTERED is None:
        from ray.util.metrics import Counter, Gauge

        def keys(name: str) -> tuple[str, ...]:
            return ("output", "stage") if name.startswith("stage") else ("output",)

        gauges = {name: Gauge(f"ragsift_{name}", description=text, tag_keys=keys(name))
                  for name, text in (("pairs_todo", "pairs this run answers"),
                                     ("roots_in_flight", "questions in flight"),
                                     ("stage_queued", "requests waiting for a batch"),
                                     ("stage_running", "requests sent to replicas, not back yet"),
                                     ("stage_replicas_ready", "replicas taking work"))}
        counters = {name: Counter(f"ragsift_{name}", description=text, tag_keys=keys(name))
                    for name, text in (("pairs_done", "pairs answered"), ("tokens", "tokens computed"),
                                       ("stage_requests", "requests computed"),
                                       ("stage_errors", "requests that came back as errors"),
                                       ("stage_busy_seconds", "seconds replicas spent on batches"))}
        _REGISTERED = gauges, counters
    return _REGISTERED
