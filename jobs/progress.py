"""A run's progress line, every ``progress_every_s`` seconds while the engine works."""

from __future__ import annotations

from engine.loop import Engine


def progress_printer(log):
    def show(engine: Engine) -> None:
        stages = " ".join(
            f"{name}[queued={len(s.queue)} running={sum(s.inflight)} calls={s.stats.calls} "
            f"batch={s.stats.requests / max(1, s.stats.calls):.1f}]"
            for name, s in engine.stages.items()
        )
        m = engine.metrics()
        log(f"done={engine.roots_done} in_flight={engine.roots_in_flight} {stages} "
            f"tok/s={m['tokens_per_s']}")
    return show
