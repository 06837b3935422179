"""Which replicas may take work. A replica takes none until it answers a readiness call, at a run's start
and after its actor died, and a death that no call saw (an actor killed while it starts or idles) is
found by asking Ray how often each actor restarted."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from engine.stages import Stage, cause_of

WATCH_S = 5.0  # how often Ray is asked how many times each replica's actor restarted
KILL_POLL_S = 0.2  # how often Ray is asked whether a replica the engine killed is restarting
KILL_WAIT_S = 10.0  # a killed replica is probed after this long even if Ray has not counted its restart


class Supervisor:
    def __init__(self, stages: dict[str, Stage], log: Callable[[str], None]):
        self.stages = stages
        self.log = log  # what a person should know at once (a replica died, and why)
        self.probes: dict[Any, tuple[Stage, int]] = {}  # ref of a readiness call -> the replica it waits for
        self.restarts = 0
        self.last_watch = 0.0
        # replicas the engine killed, probed once Ray counts their restart: (stage, replica, restarts awaited, deadline)
        self.killed: list[tuple[Stage, int, int, float]] = []
        self.last_kill_poll = 0.0
        self.said_unreadable = False

    def probe_restarting(self) -> None:
        """At the start of a run: replicas not yet ready (new ones, or left restarting by an earlier run) take
        work once they answer."""
        probing = {*self.probes.values(), *((stage, replica) for stage, replica, _, _ in self.killed)}
        for stage in self.stages.values():
            for replica in sorted(stage.restarting - {r for s, r in probing if s is stage}):
                self._probe(stage, replica)

    def died(self, stage: Stage, replica: int, why: str, restarts_before_kill: int | None = None) -> None:
        """Send a restarting replica nothing until it answers a readiness call. A call to a restarting
        actor fails at once, so batches sent meanwhile would count as failing again: split, run alone,
        and the stage would lose its batching for the rest of the run.

        ``restarts_before_kill``: Ray's restart count of a replica the engine has just killed, read before
        the kill. ``ray.kill`` returns before the actor is dead, and the copy being killed answers a
        readiness call sent at once when it is idle (an async replica is): its work then went to the
        restarting actor and failed there, a second death counted and a retry spent. It is probed once Ray
        counts the restart."""
        if replica in stage.restarting:
            return
        self.restarts += 1
        deaths = stage.deaths[replica] + 1
        self.log(f"{stage.name} replica {replica} died ({why}); it takes no work until Ray has restarted it "
                 f"(death {deaths} of this replica in this run)")
        for peer, r in self.same_actor(stage, replica):
            peer.deaths[r] = deaths
            # a peer's earlier readiness call may have been answered before this death and not yet read:
            # it would send the peer work that fails and counts this death again
            self._forget_probes(peer, r)
            if restarts_before_kill is None:
                self._probe(peer, r)
            else:
                peer.restarting.add(r)
                self.killed.append((peer, r, restarts_before_kill + 1, time.perf_counter() + KILL_WAIT_S))

    def probe_killed(self, now: float) -> None:
        """Probe each replica the engine killed once Ray counts its restart (or when Ray cannot say, or
        after ``KILL_WAIT_S``)."""
        if not self.killed or now - self.last_kill_poll < KILL_POLL_S:
            return
        self.last_kill_poll = now
        waiting = []
        for stage, replica, awaited, deadline in self.killed:
            restarts = stage.ray_restarts(replica)
            if restarts is None or restarts >= awaited or now >= deadline:
                self._probe(stage, replica)
            else:
                waiting.append((stage, replica, awaited, deadline))
        self.killed = waiting

    def answered(self, ref) -> None:
        """A readiness call returned: the replica is back, still restarting, or gone for good."""
        stage, replica = self.probes.pop(ref)
        stage.restarting.discard(replica)
        try:
            stage.ready(replica, ray.get(ref))
        except ActorUnavailableError:  # still restarting; each try takes Ray ~2 s to answer
            self._probe(stage, replica)
        except RayActorError as err:  # dead for good (out of restarts, or its constructor fails)
            why = ("its actors cannot start" if err.actor_init_failed
                   else "its actors died and are out of restarts (engine.replica_max_restarts)")
            stage.retire(replica, err, why)  # raises when the stage has no replica left

    def watch(self, now: float, force: bool = False) -> None:
        """Count the deaths no call saw, every ``WATCH_S`` (or now, with ``force``)."""
        if not force and now - self.last_watch < WATCH_S:
            return
        self.last_watch = now
        for stage in self.stages.values():
            for replica in range(len(stage.replicas)):
                self._count_deaths(stage, replica)
            for shard in range(len(getattr(stage, "shards", ()))):
                self._count_shard_deaths(stage, shard)
        why = next((stage.restarts_unreadable for stage in self.stages.values() if stage.restarts_unreadable), None)
        if why and not self.said_unreadable:  # it was swallowed in silence: the watch was off and nobody knew
            self.said_unreadable = True
            self.log(f"warning: Ray's actor table cannot be read ({why}): a replica that dies while it starts or "
                     "idles is noticed only when a call to it fails or times out (engine.*.batching.timeout_s)")

    def _count_shard_deaths(self, stage, shard: int) -> None:
        """A retriever shard actor (its FAISS and BM25 indexes) is no replica of the stage, but it dies as one
        does (out of memory: it holds its index) and Ray restarts it: said and counted as a replica's death."""
        restarts = stage.shard_restarts(shard)
        if restarts is None or restarts <= stage.shard_deaths[shard]:
            return
        self.restarts += restarts - stage.shard_deaths[shard]
        stage.shard_deaths[shard] = restarts
        self.log(f"{stage.name} shard {shard} died (death {restarts} of this shard in this run); Ray restarts it and it "
                 "loads its index again, calls to it wait meanwhile. Ray gave no reason: its raylet.out says whether "
                 "it killed the shard for memory")

    def _count_deaths(self, stage: Stage, replica: int) -> None:
        """Ray holds the calls to an actor that dies while it starts and runs them once it is back, so a
        replica killed at every start (out of memory) would leave the run waiting in silence."""
        restarts = stage.ray_restarts(replica)
        if restarts is None or restarts <= stage.deaths[replica]:
            return
        self.restarts += restarts - stage.deaths[replica]
        for peer, r in self.same_actor(stage, replica):
            peer.deaths[r] = restarts
            # it takes no work until it answers, as after a failed call: and the call it was running fails
            # next, which must not count this death a second time (died() skips a replica restarting)
            if r not in peer.restarting and r not in peer.retired:
                self._forget_probes(peer, r)
                self._probe(peer, r)
        self.log(f"{stage.name} replica {replica} died while starting or idle (death {restarts} of this replica in "
                 "this run); Ray restarts it. No call failed, so Ray gave no reason: its raylet.out says whether it "
                 "killed the replica for memory")

    def same_actor(self, stage: Stage, replica: int) -> list[tuple[Stage, int]]:
        """Every (stage, replica) served by this replica's actor: the ranker shares the retriever's query
        encoders when no cross-encoder is configured, and one death is one restart, seen by both."""
        actor = stage.replicas[replica]
        return [(s, r) for s in self.stages.values() for r, a in enumerate(s.replicas) if a == actor]

    def _forget_probes(self, stage: Stage, replica: int) -> None:
        """Drop the replica's readiness calls: one answered before its death would say it is ready."""
        self.probes = {ref: waiting for ref, waiting in self.probes.items() if waiting != (stage, replica)}

    def _probe(self, stage: Stage, replica: int) -> None:
        stage.restarting.add(replica)
        self.probes[stage.probe(replica)] = (stage, replica)


def death_cause(err: BaseException) -> str:
    """Why a replica's actor died, in a few words (Ray's message runs to many lines)."""
    text = str(err)
    if "low on memory" in text or "memory pressure" in text:
        return ("Ray killed it because the machine ran low on memory: use fewer or smaller replicas, a smaller "
                "KV cache (generator.cpu_kvcache_gib / gpu_memory_utilization) or a bigger machine")
    return cause_of(err)
