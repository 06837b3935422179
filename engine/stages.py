"""Stage pools: replicas of one actor kind plus the micro-batching policy that feeds them.

A stage turns a batch of requests into Ray object refs (``launch``) and the fetched results back
into one response per request (``combine``). The engine decides when a batch is sent.
"""

from __future__ import annotations

import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from actors.retriever import NOT_THE_SHARD, fuse_rrf, merge_topk
from schemas.config import RetrievalConfig, StageBatching
from schemas.errors import StageDown, UserError
from schemas.records import (
    Classify,
    Entail,
    Entailment,
    Generate,
    Judge,
    Judgment,
    Rank,
    Ranking,
    Request,
    Response,
    Retrieval,
    Retrieve,
    failed,
)


@dataclass
class StageStats:
    """A stage's figures for metrics.json, held in a size that does not grow with the run: a run of millions of
    questions ends tens of millions of batches (under continuous batching nearly one per request), and a
    list of each batch's size and span took ~6 GB and a quarter hour to summarise after the last row."""

    calls: int = 0
    requests: int = 0
    busy_s: float = 0.0
    batch_sizes: Counter = field(default_factory=Counter)  # batch size -> batches of that size
    errors: int = 0
    rests: int = 0  # failures after which the replica got no work for engine.failure_cooldown_s
    peak_tokens_in_flight: int = 0  # streaming stages: the most estimated tokens one replica had in flight
    prompt_tokens: int = 0  # LLM stages: prompt tokens computed, and those vLLM found in its prefix cache
    cached_tokens: int = 0
    # bytes of results the driver received (Ray's serialized object sizes), and of those the part that came
    # through the object store (too large to inline in the task's reply: pulled from the node that made it)
    bytes_in: int = 0
    bytes_in_by_reference: int = 0
    # busy replica-seconds in consecutive slices of bin_s from the run's start (utilisation over time); at
    # MAX_BINS slices, neighbours merge and bin_s doubles (from 1/256 s: a short run's 50 report slices stay exact)
    busy_bins: list[float] = field(default_factory=list)
    bin_s: float = 2.0 ** -8
    # per replica, the time from which its busy time is not counted yet: batches on one replica overlap
    # (streams, max_inflight_per_replica), and summed per batch they made busy_s exceed the wall time
    busy_from: dict[int, float] = field(default_factory=dict)

    MAX_BINS = 4096

    def batch_started(self, replica: int, now: float, inflight_before: int) -> None:
        if inflight_before == 0:
            self.busy_from[replica] = now

    def batch_ended(self, replica: int, started: float, finished: float, origin: float = 0.0) -> None:
        """Adds the time since the replica's busy time was last counted: busy_s is the union of its batches'
        spans (the replica is busy while it has one in flight), counted as each batch ends; ``origin``: the
        run's start, from which the busy time is placed in its slice."""
        since = self.busy_from.get(replica, started)
        self.busy_s += max(0.0, finished - since)
        self.busy_from[replica] = max(since, finished)
        self._add_busy(since - origin, finished - origin)

    def _add_busy(self, a: float, b: float) -> None:
        a = max(0.0, a)
        if b <= a:
            return
        while b / self.bin_s >= self.MAX_BINS:
            self.busy_bins = [sum(self.busy_bins[i:i + 2]) for i in range(0, len(self.busy_bins), 2)]
            self.bin_s *= 2
        last = int(b // self.bin_s)
        self.busy_bins.extend([0.0] * (last + 1 - len(self.busy_bins)))
        for i in range(int(a // self.bin_s), last + 1):
            self.busy_bins[i] += max(0.0, min(b, (i + 1) * self.bin_s) - max(a, i * self.bin_s))

    def summary(self, wall_s: float = 0.0, replicas: int = 1) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "requests": self.requests,
            "errors": self.errors,
            "rests": self.rests,
            "busy_s": round(self.busy_s, 3),
            "batch_size": {"mean": round(self.requests / max(1, self.calls), 2), "p50": percentile(self.batch_sizes, 0.5),
                           "p90": percentile(self.batch_sizes, 0.9), "max": max(self.batch_sizes, default=0)},
            "utilisation": utilisation(self.busy_bins, self.bin_s, wall_s, replicas),
            **({"peak_tokens_in_flight": self.peak_tokens_in_flight} if self.peak_tokens_in_flight else {}),
            **({"prefix_cache_hit_rate": round(self.cached_tokens / self.prompt_tokens, 4),
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens} if self.prompt_tokens else {}),
            "driver_bytes_in": {"total": self.bytes_in, "by_reference": self.bytes_in_by_reference,
                                "per_request": round(self.bytes_in / max(1, self.requests), 1)},
        }

    def received(self, refs: list) -> None:
        """Count what ``refs`` (results the driver has just read) weigh: Ray knows each object's size. Asked
        before the read, a reply that came through the object store was now and then not located on any node
        yet (3 of 600 here) and counted as inlined; after it, none of 2,000."""
        import ray

        for info in ray.experimental.get_object_locations(refs).values():
            size = info.get("object_size") or 0
            self.bytes_in += size
            if info.get("node_ids"):  # in a node's object store, not inlined in the reply
                self.bytes_in_by_reference += size


def percentile(counts: Counter, q: float) -> int:
    """The q-th value of the values ``counts`` counts (the value at index int(q * n) of them sorted)."""
    n = sum(counts.values())
    index, seen = min(n - 1, int(q * n)), 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > index:
            return value
    return 0


def utilisation(busy_bins: list[float], bin_s: float, wall_s: float, replicas: int, bins: int = 50) -> dict:
    """Busy fraction of the stage's replicas in each of ``bins`` equal slices of the run, from the busy
    replica-seconds counted in slices of ``bin_s`` (a replica busy while it has at least one batch in flight:
    its overlapping batches counted once)."""
    width = wall_s / bins if wall_s > 0 else 0.0
    busy = [0.0] * bins
    if width:
        for j, seconds in enumerate(busy_bins):  # spread evenly over its slice, into the report's
            a, b = j * bin_s, (j + 1) * bin_s
            for i in range(int(a // width), min(bins, int(b // width) + 1)):
                busy[i] += seconds * max(0.0, min(b, (i + 1) * width) - max(a, i * width)) / bin_s
    return {"bin_s": round(width, 3), "busy": [round(min(1.0, x / (width * replicas)), 3) if width else 0.0
                                               for x in busy]}


COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # the terminal colours Ray puts in a remote error's text


def cause_of(err: BaseException) -> str:
    """The line of a (Ray-wrapped, coloured, multi-line) error that says what went wrong: its last
    (tab-indented lines are Ray's detail under it)."""
    text = COLOURS.sub("", str(err))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("\t")]
    return lines[-1][:300] if lines else type(err).__name__


class Stage:
    name: str
    streaming = False  # True where replicas stream results back (one Ray streaming call per batch)
    share = 1.0  # of each replica's budget this engine may use (several engine actors share the replicas)
    restarts_unreadable: str | None = None  # why Ray's actor table could not be read, said once by the supervisor

    def __init__(self, replicas: list, batching: StageBatching, name: str | None = None):
        self.name = name or self.name
        if not replicas:
            raise ValueError(f"stage {self.name} needs at least one replica")
        self.replicas = replicas
        self.batching = batching
        self.queue: deque[tuple[Request, float]] = deque()
        # batches being retried after a failure: (requests, failures of that batch on its own, whether it runs
        # alone: a batch that failed more than once, or the stage test, may hold what breaks a replica)
        self.retry: deque[tuple[list[Request], int, bool]] = deque()
        self.suspects: set[Request] = set()  # requests of batches run alone, until answered: split, they still do
        self.inflight = [0] * len(replicas)  # batches (calls, streams) on each replica
        self.running = 0  # requests sent to replicas and not back yet
        self.cooling_until = [0.0] * len(replicas)  # a replica that just failed rests
        self.retired: set[int] = set()  # replicas whose actor can never start
        # replicas waiting on a readiness call (engine/supervision.py), each of them at first: Ray holds the
        # calls sent to an actor it is still creating and, when that actor is killed meanwhile (a timeout
        # counts from the call), runs them on the copy it restarts, untracked and ahead of the readiness
        # call (a hung one left the run waiting for ever); a replica slower to start than the timeout was
        # killed for it
        self.restarting: set[int] = set(range(len(replicas)))
        self.deaths = [0] * len(replicas)  # times each replica's actor died during this run
        # when each replica last returned a result (any of its calls): a replica that is returning
        # results is alive, even while a call queued behind the others waits for its first
        self.last_result = [0.0] * len(replicas)
        # requests retried alone that raised since any call of this stage last answered:
        # engine.fail_fast_after of them and the stage is tested with ``known_good`` (engine/loop.py)
        self.retries_failed_in_a_row = 0
        # when each replica last answered a request (not with an error response): a replica that raises
        # while it answers others is well, and the requests are bad
        self.answered_at = [float("-inf")] * len(replicas)
        self.known_good: Request | None = None  # a request this stage answered in this run
        # that request, asked again because requests kept failing (engine/loop.py ``_test_stage``):
        # when, after how many failures, and the replicas it failed on
        self.canary: Request | None = None
        self.canary_since = 0.0
        self.canary_after = 0
        self.canary_failed_on: set[int] = set()
        self.stats = StageStats()

    @property
    def last_answered_s(self) -> float:
        return max(self.answered_at)

    def answered_ok(self, replica: int, requests: list[Request], responses: list[Response]) -> None:
        """A call of this stage on ``replica`` came back with ``responses``: those that are not errors
        show its replicas work, whatever failed before (an error response, such as an overlong prompt
        refused before the model, shows nothing)."""
        good = next((r for r, response in zip(reversed(requests), reversed(responses))
                     if getattr(response, "error", None) is None), None)
        if good is not None:
            self.retries_failed_in_a_row = 0
            self.answered_at[replica] = time.perf_counter()
            self.known_good = good

    def is_test(self, batch: list[Request]) -> bool:
        """``batch`` is the stage test: the request answered before, asked again (``canary``)."""
        return self.canary is not None and len(batch) == 1 and batch[0] is self.canary

    def free_replica(self, now: float | None = None) -> int | None:
        """The least-loaded healthy replica that may take the next batch, or None.

        An idle replica takes any batch; a busy one only full batches or a retry (a whole batch already),
        queued behind its current work (up to ``max_inflight_per_replica``), so partial batches keep
        growing while it works. A retry that runs alone waits for the least-loaded replica to empty, which
        takes nothing new meanwhile; the others go on with the rest.
        """
        healthy = self.healthy(now)
        if not healthy:
            return None
        best = min(healthy, key=self.inflight.__getitem__)
        if self.inflight[best] == 0:
            return best
        if self.isolating():
            healthy = [r for r in healthy if r != best]  # best drains for the retry
            if not healthy:
                return None
            best = min(healthy, key=self.inflight.__getitem__)
        ready = self.full() or any(not alone for _, _, alone in self.retry)
        return best if ready and self.inflight[best] < self.batching.max_inflight_per_replica else None

    def isolating(self) -> bool:
        """A retry waits for a replica with nothing else in flight."""
        return any(alone for _, _, alone in self.retry)

    def next_retry(self, replica: int) -> tuple[list[Request], int] | None:
        """The retry ``replica`` takes: with nothing in flight, the oldest that runs alone (it was emptied for
        one), else the oldest that does not."""
        idle = self.inflight[replica] == 0
        order = [i for i, (_, _, alone) in enumerate(self.retry) if alone] if idle else []
        order += [i for i, (_, _, alone) in enumerate(self.retry) if not alone]
        if not order:
            return None
        batch, attempts, _ = self.retry[order[0]]
        del self.retry[order[0]]
        return batch, attempts

    def full(self) -> bool:
        """The queue holds a whole batch."""
        return len(self.queue) >= self.batching.max_batch

    def healthy(self, now: float | None = None) -> list[int]:
        """Replicas that may take work now: not retired, not restarting, not resting after a failure."""
        now = time.perf_counter() if now is None else now
        # the stage test goes next: not to a replica it failed on (one replica gone bad is not the stage)
        avoid = self.canary_failed_on if self.retry and self.is_test(self.retry[0][0]) else ()
        return [r for r in range(len(self.replicas)) if r not in self.retired and r not in self.restarting
                and self.cooling_until[r] <= now and r not in avoid]

    def due(self, now: float, flush: bool) -> bool:
        """A batch should go now: a retry, a full batch, its oldest request waited long enough, or a flush."""
        if self.retry:
            return True
        if not self.queue:
            return False
        return flush or self.full() or now - self.queue[0][1] >= self.batching.max_wait_s

    def next_deadline(self) -> float | None:
        """When a waiting batch can go: a partial batch becomes due or a resting replica is back."""
        if not self.queue and not self.retry:
            return None
        now = time.perf_counter()
        if self.free_replica(now) is None:
            resting = [t for r, t in enumerate(self.cooling_until) if r not in self.retired and t > now]
            return min(resting) if resting and not any(self.inflight) else None
        return now if self.retry else self.queue[0][1] + self.batching.max_wait_s

    def take_for(self, replica: int) -> tuple[list[Request], int]:
        """The next batch for ``replica`` and how often it already failed on its own."""
        return self.next_retry(replica) or self.take()

    def take(self) -> tuple[list[Request], int]:
        """The next batch of queued requests (and 0: none failed yet)."""
        n = min(len(self.queue), self.batching.max_batch)
        return [self.queue.popleft()[0] for _ in range(n)], 0

    def pending(self) -> bool:
        return bool(self.queue or self.retry)

    def retire(self, replica: int, err: BaseException, why: str = "its actors cannot start") -> None:
        """Stop using a replica whose actor cannot start or restart; with none left the run cannot go on."""
        actor_ids = [getattr(r, "_actor_id", None) for r in self.replicas]
        failed = getattr(err, "actor_id", None)
        failed = failed.hex() if isinstance(failed, bytes) else failed
        if failed is not None and failed in {a.hex() for a in actor_ids if a is not None}:
            self.retired.add(replica)
            if len(self.retired) < len(self.replicas):
                return
        # an index rebuilt under the run: its cause says what to do, and a rerun would be refused
        raise StageDown(f"stage {self.name}: {why} ({cause_of(err)})" + (
            "" if NOT_THE_SHARD in str(err) else "; fix the cause and rerun the same command to resume"))

    def probe(self, replica: int):
        """A call a replica answers once it is ready (its constructor has run)."""
        return self.replicas[replica].__ray_ready__.remote()

    def ready(self, replica: int, answer: Any) -> None:
        """A replica answered ``probe`` with ``answer``."""

    def sent(self, replica: int, batch: list[Request]) -> None:
        """``batch`` went to ``replica``."""
        self.running += len(batch)

    def returned(self, replica: int, requests: list[Request]) -> None:
        """``requests`` sent to ``replica`` were answered or failed."""
        self.running -= len(requests)

    def died_elsewhere(self, err) -> bool:
        """Whether ``err`` (a RayActorError) is the death of an actor this stage calls besides its replicas (a
        retriever's shard): not its replica's death, and counted as that actor's own by the watch."""
        return False

    def stuck_elsewhere(self, launched: Launched) -> list[int]:
        """Actors besides its replica that an overdue batch waits on and that answered nothing of it while their
        peers did (a retriever's shards): they, not the replica, are restarted. None here."""
        return []

    def ray_restarts(self, replica: int) -> int | None:
        """How often Ray restarted a replica's actor, or None where Ray cannot say (not a Ray actor)."""
        return self._restarts_of(self.replicas[replica])

    def _restarts_of(self, actor) -> int | None:
        try:
            return actor_restarts(actor)
        except Exception as err:  # noqa: BLE001 - Ray's private table (a Ray upgrade may change it): the run goes on
            self.restarts_unreadable = f"{type(err).__name__}: {err}"
            return None

    def restart(self, replica: int) -> None:
        """Kill a stuck replica so Ray restarts it (its actor has ``max_restarts``)."""
        import ray

        ray.kill(self.replicas[replica], no_restart=False)

    def launch(self, replica: int, batch: list[Request]) -> list:
        raise NotImplementedError

    def combine(self, batch: list[Request], results: list) -> list[Response]:
        raise NotImplementedError

    def failed(self, batch: list[Request], error: str) -> list[Response]:
        raise NotImplementedError


class GeneratorStage(Stage):
    name = "generator"

    def launch(self, replica, batch: list[Generate]):
        return [self.replicas[replica].generate.remote(batch)]

    def combine(self, batch, results):
        return results[0]

    def failed(self, batch, error):
        # each request type gets its own failure: a failed judgment is an error, never a judgment
        return [failed(r, error) for r in batch]


class StreamingGeneratorStage(GeneratorStage):
    """Replicas are vLLM async engines (actors/streaming_generator.py): continuous batching.

    A batch is one Ray streaming call whose results come back in chunks as each sequence finishes,
    so a replica never waits for the longest sequence of a batch and the driver hands new requests
    over while others run. Backpressure is by tokens in flight per replica (prompt estimate plus
    completion budget), up to ``max_tokens_in_flight`` or, by default, twice the replica's KV cache
    (asked once when it is ready): the engine's own queue never runs dry while the driver refills it,
    and no more work leaves the driver than the replica can soon start.
    """

    streaming = True
    # a replica ready before the others takes only its share of a burst while they start, for up to this
    # long after the first was ready (endpoint replicas start within seconds; a vLLM one may take minutes)
    startup_hold_s = 10.0

    def __init__(self, replicas: list, batching, name: str | None = None, default_max_tokens: int = 48):
        super().__init__(replicas, batching, name)
        self.default_max_tokens = default_max_tokens
        self.budget: list[int | None] = [batching.max_tokens_in_flight] * len(replicas)
        self.tokens_in_flight = [0] * len(replicas)
        self.last_sent = [0.0] * len(replicas)  # when each replica got its latest batch
        self.never_ready = set(range(len(replicas)))
        self.first_ready_at: float | None = None

    def cost(self, request: Generate | Judge) -> int:
        """Tokens a request may hold in the KV cache: its prompt (about 4 characters a token) and completion."""
        chars = sum(len(text) for _, text in request.messages)
        return chars // 4 + request.budget(self.default_max_tokens)

    def probe(self, replica):
        return self.replicas[replica].kv_capacity.remote()

    def ready(self, replica, answer):
        limit = self.batching.max_tokens_in_flight or 2 * int(answer)
        self.budget[replica] = max(1, int(limit * self.share))
        self.never_ready.discard(replica)
        if self.first_ready_at is None:
            self.first_ready_at = time.perf_counter()

    def n_starting(self, now: float | None = None) -> int:
        """Replicas not ready yet since the run's first one was, within ``startup_hold_s`` of it."""
        now = time.perf_counter() if now is None else now
        if self.first_ready_at is None or now >= self.first_ready_at + self.startup_hold_s:
            return 0
        return len((self.never_ready & self.restarting) - self.retired)

    def next_deadline(self):
        deadline = super().next_deadline()
        if self.pending() and self.n_starting():  # the held back part of a burst goes when the hold ends
            end = self.first_ready_at + self.startup_hold_s
            deadline = end if deadline is None else min(deadline, end)
        return deadline

    def sent(self, replica, batch):
        super().sent(replica, batch)
        self.last_sent[replica] = time.perf_counter()
        self.tokens_in_flight[replica] += sum(map(self.cost, batch))
        self.stats.peak_tokens_in_flight = max(self.stats.peak_tokens_in_flight, self.tokens_in_flight[replica])

    def returned(self, replica, requests):
        super().returned(replica, requests)
        self.tokens_in_flight[replica] -= sum(map(self.cost, requests))

    def free_replica(self, now=None):
        """The healthy replica with the fewest tokens in flight, if it has room. Among equally loaded ones,
        the one that got work longest ago: when the driver cannot keep every replica busy, the work still
        spreads over all of them instead of piling on the first ones. A retry that runs alone goes to a
        replica with nothing else in flight, as on the batch path: the least-loaded one takes nothing new
        until it is empty, and the others go on with the rest (a replica's death fails each of its hundreds
        of streams on its own; run alone one by one, each waited for a replica to drain, and a pool of 8
        answered 5-16 requests in 30 s where it had answered 3,000)."""
        healthy = self.healthy(now)
        if not healthy:
            return None
        if self.isolating():
            best = min(healthy, key=self.tokens_in_flight.__getitem__)
            if self.inflight[best] == 0:
                return best
            healthy = [r for r in healthy if r != best]  # best drains for the retry
            if not healthy or not (self.queue or any(not alone for _, _, alone in self.retry)):
                return None
        best = min(healthy, key=lambda r: (self.tokens_in_flight[r], self.last_sent[r]))
        if self.tokens_in_flight[best] and self.n_starting(now):
            return None  # the rest of the burst is the starting replicas' share
        return best if self.tokens_in_flight[best] < (self.budget[best] or 0) else None

    def take_for(self, replica: int) -> tuple[list[Request], int]:
        """The next batch that fits ``replica``'s room (at least one request)."""
        if (retry := self.next_retry(replica)) is not None:
            return retry
        room = (self.budget[replica] or 0) - self.tokens_in_flight[replica]
        # a burst is shared with the other idle replicas and those still starting: a replica's room is twice
        # its KV cache, so one took a small run's 20 requests (and each burst's first max_batch) while three
        # others sat idle, or had not answered their readiness call yet
        idle = sum(self.tokens_in_flight[r] == 0 for r in self.healthy()) + self.n_starting()
        most = min(self.batching.max_batch, -(-len(self.queue) // idle) if idle else self.batching.max_batch)
        batch: list[Request] = []
        while self.queue and len(batch) < most:
            cost = self.cost(self.queue[0][0])
            if batch and cost > room:
                break
            batch.append(self.queue.popleft()[0])
            room -= cost
        return batch, 0

    def launch(self, replica, batch):
        return [self.replicas[replica].stream.options(num_returns="streaming").remote(batch)]

    def engine_stats(self) -> list[dict]:
        """Each replica's vLLM statistics (KV cache usage, preemptions, time to first token)."""
        import ray

        out = []
        for i, replica in enumerate(self.replicas):
            if i in self.restarting:  # still starting (a run answered from the cache ends before vLLM is up):
                out.append({"error": "no figures: the replica had not started"})  # its call waited for it, 30 s
                continue
            try:
                out.append(ray.get(replica.engine_stats.remote(), timeout=30))
            except Exception as err:  # noqa: BLE001 - a replica gone at the end costs its figures, not the run
                out.append({"error": f"{type(err).__name__}: {str(err)[:200]}"})
        return out


class RankerStage(Stage):
    """Replicas rank texts against a query: CrossEncoder actors, or encoder actors (bi-encoder cosine)."""

    name = "ranker"

    def full(self) -> bool:
        limit = getattr(self.batching, "max_texts", None)
        return super().full() or bool(limit and sum(len(r.texts) for r, _ in self.queue) >= limit)

    def take(self) -> tuple[list[Request], int]:
        """As many requests as fit ``max_texts`` (at least one): a call's time is its texts, not its requests."""
        limit, texts, batch = getattr(self.batching, "max_texts", None), 0, []
        while self.queue and len(batch) < self.batching.max_batch:
            size = len(self.queue[0][0].texts)
            if batch and limit and texts + size > limit:
                break
            batch.append(self.queue.popleft()[0])
            texts += size
        return batch, 0

    def launch(self, replica, batch: list[Rank]):
        return [self.replicas[replica].rank.remote(batch)]

    def combine(self, batch, results):
        return results[0]

    def failed(self, batch, error):
        return [Ranking(error=error) for _ in batch]


class KnowStage(Stage):
    """Replicas score questions with a trained self-knowledge classifier (actors/know.py)."""

    name = "know"

    def launch(self, replica, batch: list[Classify]):
        return [self.replicas[replica].classify.remote(batch)]

    def combine(self, batch, results):
        return results[0]

    def failed(self, batch, error):
        return [Judgment("", error=error) for _ in batch]


class NLIStage(Stage):
    """Replicas score (premise, hypothesis) pairs with an NLI cross-encoder (actors/nli.py)."""

    name = "nli"

    def launch(self, replica, batch: list[Entail]):
        return [self.replicas[replica].entail.remote(batch)]

    def combine(self, batch, results):
        return results[0]

    def failed(self, batch, error):
        return [Entailment(error=error) for _ in batch]


def actor_restarts(actor) -> int | None:
    """How often Ray restarted ``actor``, or None where Ray cannot say (not a Ray actor); raises where
    Ray's actor table cannot be read."""
    actor_id = getattr(actor, "_actor_id", None)
    if actor_id is None:
        return None
    from ray._private import state  # Ray's GCS actor table; ray.util.state needs the dashboard

    return int(state.actors(actor_id.hex()).get("NumRestarts", 0))


class RetrieverStage(Stage):
    """Replicas are query encoders; a batch is searched on every shard and the hits merged.

    Dense requests go to the shards' FAISS indexes with the encoder's output ref, so vectors never
    visit the driver; BM25 requests go to their BM25 indexes as text; hybrid requests search both (to
    ``fusion_candidates`` each) and fuse the two rankings by reciprocal rank.
    """

    name = "retriever"

    def __init__(self, encoders: list, shards: list, batching: StageBatching, bm25: bool = False,
                 retrieval: RetrievalConfig | None = None):
        super().__init__(encoders, batching)
        self.shards, self.bm25, self.retrieval = shards, bm25, retrieval or RetrievalConfig()
        self.shard_deaths = [0] * len(shards)  # Ray's restart count of each shard actor, as last seen
        self.shards_killed: set[int] = set()  # restarted as stuck and not heard from since: not killed again

    def shard_restarts(self, shard: int) -> int | None:
        return self._restarts_of(self.shards[shard])

    def stuck_elsewhere(self, launched: Launched) -> list[int]:
        """The shards an overdue batch still waits on where others answered it: a hung shard (or one reloading
        its index after a death) timed every encoder's batches out, and each encoder was killed in turn while
        the shard kept them all waiting. With every shard waiting, the encoder may be what hangs: none."""
        import ray

        if len(self.shards) < 2:
            return []
        _, waiting = ray.wait(launched.refs, num_returns=len(launched.refs), timeout=0)
        stuck = sorted({i % len(self.shards) for i, ref in enumerate(launched.refs) if ref in waiting})
        return stuck if len(stuck) < len(self.shards) else []

    def restart_shard(self, shard: int) -> None:
        """Kill a stuck shard so Ray restarts it: every call queued at it fails (and is retried), blaming no encoder.
        Until a batch is answered again it is not killed again: reloading its index may take longer than a batch's
        timeout."""
        import ray

        self.shards_killed.add(shard)
        ray.kill(self.shards[shard], no_restart=False)

    def answered_ok(self, replica, requests, responses):
        super().answered_ok(replica, requests, responses)
        self.shards_killed.clear()  # every shard answered this batch

    def died_elsewhere(self, err) -> bool:
        dead = getattr(err, "actor_id", None)
        return dead is not None and dead in {a.hex() for s in self.shards if (a := getattr(s, "_actor_id", None))}

    def _plan(self, batch: list[Retrieve]):
        methods = [r.method or self.retrieval.method for r in batch]
        for m in methods:
            if m not in ("dense", "bm25", "hybrid"):
                raise ValueError(f"unknown retrieval method {m!r} (dense, bm25 or hybrid)")
            if m != "dense" and not self.bm25:
                raise UserError(f"{m} retrieval needs an index built with BM25 (index.bm25=true)")
        dense = [i for i, m in enumerate(methods) if m != "bm25"]
        sparse = [i for i, m in enumerate(methods) if m != "dense"]
        depth = max(max(r.k, self.retrieval.fusion_candidates) if m == "hybrid" else r.k
                    for r, m in zip(batch, methods))
        return methods, dense, sparse, depth

    def launch(self, replica, batch: list[Retrieve]):
        _, dense, sparse, depth = self._plan(batch)
        refs = []
        if dense:
            vectors = self.replicas[replica].encode.remote([batch[i].query for i in dense], "query")
            refs += [shard.search.remote(vectors, depth) for shard in self.shards]
        if sparse:
            refs += [shard.search_bm25.remote([batch[i].query for i in sparse], depth) for shard in self.shards]
        return refs

    def combine(self, batch, results):
        methods, dense, sparse, depth = self._plan(batch)
        n_dense = len(self.shards) if dense else 0
        dense_hits = dict(zip(dense, merge_topk(results[:n_dense], depth))) if dense else {}
        sparse_hits = dict(zip(sparse, merge_topk(results[n_dense:], depth))) if sparse else {}
        out, rc = [], self.retrieval
        for i, (r, m) in enumerate(zip(batch, methods)):
            if m == "hybrid":  # at least k from each ranking (as _plan fetched), or the fusion returns fewer than k
                take = max(r.k, rc.fusion_candidates)
                hits = fuse_rrf([dense_hits[i][:take], sparse_hits[i][:take]],
                                [rc.dense_weight, rc.bm25_weight], r.k, rc.rrf_k)
            else:
                hits = (dense_hits if m == "dense" else sparse_hits)[i][: r.k]
            out.append(Retrieval(hits))
        return out

    def failed(self, batch, error):
        return [Retrieval(error=error) for _ in batch]


@dataclass
class Launched:
    """A batch sent to a replica, waiting for all of its refs (or, streaming, for its chunks)."""

    stage: Stage
    replica: int
    batch: list[Request]
    refs: list
    attempts: int = 0  # earlier failures: a single request's tries, or 1 for a suspect batch (retry_plan)
    started: float = field(default_factory=time.perf_counter)
    pending: int = 0
    answered: set[int] = field(default_factory=set)  # streaming: positions in ``batch`` already answered

    def remaining(self) -> list[Request]:
        return [r for i, r in enumerate(self.batch) if i not in self.answered]

    def deadline(self) -> float | None:
        """When this batch is overdue (None: never)."""
        timeout = self.stage.batching.timeout_s
        # its replica's last result counts too: vLLM serves requests first come, first served, so a call
        # sent behind a long one gets nothing until that one's sequences end. Timed alone it ran out its
        # timeout while the replica streamed the other call, and the restart threw both away (a 1.5B model
        # on 2 cores, Self-Reasoning trajectories of minutes: killed every 30 min, no pair finished)
        return None if timeout is None else max(self.started, self.stage.last_result[self.replica]) + timeout

    def overdue(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now > deadline
