"""A run's progress, as a person reads it: pairs done of the total, an ETA from the rate of the last
ten minutes, pairs/min and tokens/s over the last minute, and each stage's queue. A live display on a
terminal; one plain line per interval otherwise (logs, Ray jobs)."""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text

from engine.loop import Engine

RECENT_S = 60.0  # the rates shown are measured over this much of the recent past
# The ETA's rate is measured over a longer past: with continuous batching, pairs finish in waves (a
# long Self-Reasoning trajectory holds its question while short requests stream past), and over one
# minute the rate swung between 0 ("ETA ?") and bursts, so the ETA of one 1.5B-model run read
# 10h38m, 2h39m, ? and 9h42m within half an hour.
ETA_S = 600.0


class Progress:
    """``on_progress`` for the engine. ``total``: (question, strategy) pairs this run answers."""

    def __init__(self, log, total: int | None = None, live: bool | None = None, every_s: float = 10.0):
        from rich.console import Console

        console = Console(stderr=True)
        self.log, self.total = log, total
        self.live = console.is_terminal if live is None else live
        self.every_s = 1.0 if self.live else every_s  # how often the engine reports
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, pairs done, tokens computed)
        self.display = None
        if self.live:
            from rich.live import Live

            self.display = Live(console=console, auto_refresh=False, transient=False)
            self.display.start()
        self.last_line = float("-inf")  # the first report is printed
        self.last_done = -1  # pairs done at the last line printed: the run's end is printed once

    def __call__(self, engine: Engine) -> None:
        now = time.perf_counter()
        self.samples.append((now, engine.roots_done, engine.tokens))
        while len(self.samples) > 2 and now - self.samples[1][0] >= ETA_S:
            self.samples.popleft()
        line = self.line(engine, now)
        if self.display is not None:
            # as Text: a str is rich markup, and `generator[queued=5 running=0]` lost its brackets as a tag
            self.display.update(Text(line), refresh=True)
        elif now - self.last_line >= self.every_s or (engine.roots_in_flight == 0 and engine.roots_done != self.last_done):
            self.last_line, self.last_done = now, engine.roots_done
            self.log(line)

    def line(self, engine: Engine, now: float) -> str:
        done = engine.roots_done
        pairs_s, tok_s, span = self._rates(RECENT_S, now, done, engine.tokens)
        if self.total:
            eta_rate = self._rates(ETA_S, now, done, engine.tokens)[0]
            eta = _duration((self.total - done) / eta_rate) if eta_rate > 0 else "?"
            head = f"{done}/{self.total} pairs ({100 * done / self.total:.0f}%) ETA {eta}"
        else:
            head = f"{done} pairs"
        stages = " ".join(f"{name}[queued={len(s.queue)} running={s.running}"
                          + "".join(f" {what}={n}" for what, n in _starting(s).items() if n) + "]"
                          for name, s in engine.stages.items())
        return (f"{head} | {pairs_s * 60:.0f} pairs/min, {tok_s:.0f} tok/s over the last {min(span, RECENT_S):.0f} s"
                f" | in flight {engine.roots_in_flight} | {stages}")

    def _rates(self, horizon: float, now: float, done: int, tokens: int) -> tuple[float, float, float]:
        """(pairs/s, tokens/s, span s) since the newest sample at least ``horizon`` old (the oldest one
        while the run is younger)."""
        t0, done0, tokens0 = self.samples[0]
        for t, d, k in self.samples:
            if now - t < horizon:
                break
            t0, done0, tokens0 = t, d, k
        span = now - t0
        if span <= 0:
            return 0.0, 0.0, span
        return (done - done0) / span, (tokens - tokens0) / span, span

    def close(self) -> None:
        if self.display is not None:
            self.display.stop()


def _starting(stage) -> dict[str, int]:
    """Replicas not taking work yet: starting (never died) and restarting (died in this run)."""
    restarting = sum(1 for r in stage.restarting if stage.deaths[r])
    return {"starting": len(stage.restarting) - restarting, "restarting": restarting}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
