"""Stage pools: replicas of one actor kind plus the micro-batching policy that feeds them.

A stage turns a batch of requests into Ray object refs (``launch``) and the fetched results back
into one response per request (``combine``). The engine decides when a batch is sent.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from actors.retriever import merge_topk
from schemas.config import StageBatching
from schemas.records import Generate, Generation, Request, Response, Retrieval, Retrieve


@dataclass
class StageStats:
    calls: int = 0
    requests: int = 0
    busy_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    errors: int = 0

    def summary(self) -> dict[str, Any]:
        sizes = sorted(self.batch_sizes)
        pct = (lambda q: sizes[min(len(sizes) - 1, int(q * len(sizes)))]) if sizes else (lambda q: 0)
        return {
            "calls": self.calls,
            "requests": self.requests,
            "errors": self.errors,
            "busy_s": round(self.busy_s, 3),
            "batch_size": {"mean": round(self.requests / max(1, self.calls), 2), "p50": pct(0.5),
                           "p90": pct(0.9), "max": sizes[-1] if sizes else 0},
        }


class Stage:
    name: str

    def __init__(self, replicas: list, batching: StageBatching, name: str | None = None):
        self.name = name or self.name
        if not replicas:
            raise ValueError(f"stage {self.name} needs at least one replica")
        self.replicas = replicas
        self.batching = batching
        self.queue: deque[tuple[Request, float]] = deque()
        self.inflight = [0] * len(replicas)
        self.stats = StageStats()

    def free_replica(self) -> int | None:
        """The least-loaded replica that may take the next batch, or None.

        An idle replica takes any batch; a busy one only full batches, queued behind its current
        work (up to ``max_inflight_per_replica``), so partial batches keep growing while it works.
        """
        best = min(range(len(self.replicas)), key=self.inflight.__getitem__)
        if self.inflight[best] == 0:
            return best
        full = len(self.queue) >= self.batching.max_batch
        return best if full and self.inflight[best] < self.batching.max_inflight_per_replica else None

    def due(self, now: float, flush: bool) -> bool:
        """A batch should go now: full, its oldest request waited long enough, or a flush."""
        if not self.queue:
            return False
        return (flush or len(self.queue) >= self.batching.max_batch
                or now - self.queue[0][1] >= self.batching.max_wait_s)

    def next_deadline(self) -> float | None:
        """When a waiting partial batch becomes due; None if nothing could be sent then anyway."""
        if not self.queue or self.free_replica() is None:
            return None
        return self.queue[0][1] + self.batching.max_wait_s

    def take(self) -> list[Request]:
        n = min(len(self.queue), self.batching.max_batch)
        return [self.queue.popleft()[0] for _ in range(n)]

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
        return [Generation("", error=error) for _ in batch]


class RetrieverStage(Stage):
    """Replicas are query encoders; every batch is searched on all shards and merged.

    The encoder's output ref is passed straight to the shard actors, so vectors never visit the driver.
    """

    name = "retriever"

    def __init__(self, encoders: list, shards: list, batching: StageBatching):
        super().__init__(encoders, batching)
        self.shards = shards

    def launch(self, replica, batch: list[Retrieve]):
        vectors = self.replicas[replica].encode.remote([r.query for r in batch])
        k = max(r.k for r in batch)
        return [shard.search.remote(vectors, k) for shard in self.shards]

    def combine(self, batch, results):
        merged = merge_topk(results, max(r.k for r in batch))
        return [Retrieval(hits[: r.k]) for r, hits in zip(batch, merged)]

    def failed(self, batch, error):
        return [Retrieval(error=error) for _ in batch]


@dataclass
class Launched:
    """A batch sent to a replica, waiting for all of its refs."""

    stage: Stage
    replica: int
    batch: list[Request]
    refs: list
    started: float = field(default_factory=time.perf_counter)
    pending: int = 0
