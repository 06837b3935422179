"""A dead async replica's streams, retried: how much of the pool keeps answering (issue: a retry waited for a
replica with nothing in flight, and the rest of the pool for the retry).

The engine's own dispatch rules (engine/stages.py StreamingGeneratorStage, engine/loop.py _dispatch and
_batch_failed) on a simulated clock: ``--replicas`` async replicas held at ``--budget`` tokens in flight each by a
backlog of ~1,000-token requests whose sequences take 5-60 s; at ``--death-s`` replica 0 dies with its streams in
flight (each fails on its own and is retried) and comes back ``--restart-s`` later. No Ray, no model: it measures the
scheduling, not a GPU. Run it on another commit's engine by running that commit's copy of this script.

    python benchmarks/dead_replica_retries.py --out results/benchmarks/dead_replica_retries.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.loop import Engine  # noqa: E402
from engine.stages import StreamingGeneratorStage  # noqa: E402
from schemas.config import EngineConfig, LLMBatching  # noqa: E402
from schemas.records import Generate  # noqa: E402


def simulate(replicas: int, budget: int, death_s: float, restart_s: float, end_s: float, step_s: float = 0.05,
             seed: int = 0) -> dict:
    rng = random.Random(seed)
    stage = StreamingGeneratorStage([object()] * replicas, LLMBatching(max_tokens_in_flight=budget))
    stage.restarting.clear()
    engine = Engine({"generator": stage}, {}, EngineConfig(), lambda row: None, log=lambda line: None)
    ends: list[tuple[float, int, int]] = []  # (finish time, stream, request number): a heap
    streams: dict[int, tuple[int, dict[int, Generate]]] = {}  # stream -> (replica, its requests not finished)
    done, asked, t, back_at, streams_made = [], 0, 0.0, None, 0
    retried = 0
    while t < end_s:
        while len(stage.queue) < 2000:  # a backlog: the driver always has work to send
            asked += 1
            stage.queue.append((Generate(((("user", f"{asked} " + "x" * 3800),)), max_tokens=48), t))
        while ends and ends[0][0] <= t:
            _, sid, n = heapq.heappop(ends)
            if sid not in streams or n not in streams[sid][1]:
                continue  # its stream failed before it finished
            replica, open_ = streams[sid]
            stage.returned(replica, [open_.pop(n)])
            done.append(t)
            if not open_:
                stage.inflight[replica] -= 1
                del streams[sid]
        if back_at is None and death_s <= t < death_s + step_s:
            for sid in [s for s, (r, _) in streams.items() if r == 0]:  # each stream fails on its own
                _, open_ = streams.pop(sid)
                stage.inflight[0] -= 1
                stage.returned(0, list(open_.values()))
                engine._batch_failed(stage, 0, list(open_.values()), 0, TimeoutError("replica 0 died"))
                retried += 1
            stage.cooling_until[0] = t + engine.config.failure_cooldown_s  # (set on the real clock, not this one)
            stage.restarting.add(0)
            back_at = t + restart_s
        if back_at is not None and t >= back_at:
            stage.restarting.discard(0)
            back_at = float("inf")
        while stage.due(t, False):  # Engine._dispatch
            replica = stage.free_replica(t)
            if replica is None:
                break
            batch, _ = stage.take_for(replica)
            stage.inflight[replica] += 1
            stage.sent(replica, batch)
            streams_made += 1
            streams[streams_made] = (replica, dict(enumerate(batch)))
            for n in range(len(batch)):
                heapq.heappush(ends, (t + rng.uniform(5, 60), streams_made, n))
        t += step_s
    per_30s = [sum(1 for d in done if a <= d < a + 30) for a in range(0, int(end_s), 30)]
    before = per_30s[int(death_s // 30) - 3: int(death_s // 30)]
    steady = sum(before) / len(before)
    after = per_30s[int(death_s // 30) + 1:]
    recovered = next((30 * (int(death_s // 30) + 1 + i) - death_s for i, n in enumerate(after) if n >= 0.9 * steady), None)
    return {"replicas": replicas, "budget_tokens": budget, "death_s": death_s, "restart_s": restart_s, "end_s": end_s,
            "streams_retried": retried, "done_per_30s_before_death": round(steady, 1),
            "done_per_30s_lowest_after": min(after), "back_to_90pct_after_s": recovered,
            "retries_pending_at_end": len(stage.retry), "done_per_30s": per_30s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--budget", type=int, default=400_000, help="tokens in flight per replica")
    p.add_argument("--death-s", type=float, default=300.0)
    p.add_argument("--restart-s", type=float, default=120.0)
    p.add_argument("--end-s", type=float, default=1500.0)
    p.add_argument("--out")
    args = p.parse_args()
    result = simulate(args.replicas, args.budget, args.death_s, args.restart_s, args.end_s)
    print(json.dumps({k: v for k, v in result.items() if k != "done_per_30s"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
