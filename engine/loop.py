"""The engine: drives many items through pure strategies and micro-batched stage pools.

The driver keeps a window of roots in flight. Each strategy step's requests join their stage's
queue (identical requests share one computation); a stage sends a batch when it is full, when its
oldest request has waited ``max_wait_s``, or when nothing else is running; the loop reacts to
whichever batch finishes first and resumes the items waiting on it. It never waits on one item.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, get_args

import ray
from ray.exceptions import RayActorError, RayTaskError

from engine.cache import RequestCache
from engine.stages import COLOURS, Launched, Stage, cause_of
from engine.steps import Ask, Done, Item, Spawn, Strategy
from engine.supervision import KILL_POLL_S, Supervisor, death_cause
from schemas.config import EngineConfig
from schemas.errors import StageDown
from schemas.records import Generation, Judgment, Question, Request, Response, utf8

REQUEST_TYPES = get_args(Request)


@dataclass
class Root:
    question: Question
    strategy: Strategy
    started: float = field(default_factory=time.perf_counter)
    counters: dict[str, int] = field(
        default_factory=lambda: dict(n_llm_calls=0, n_retrievals=0, prompt_tokens=0, completion_tokens=0,
                                     n_subquestions=0, depth=0, n_parse_failures=0,
                                     n_truncated=0)
    )
    nodes: int = 1
    step_tokens: dict[str, int] = field(default_factory=dict)  # prompt + completion tokens by request step
    capped: bool = False  # a sub-question of this tree was not run (engine caps)


@dataclass
class Node:
    item: Item
    root: Root
    parent: Node | None = None
    index: int = 0  # position among its parent's children
    slots: list[Any] = field(default_factory=list)  # responses or child results being collected
    # each spawned child's trace entry and the passages it read, by its index, once it has finished
    finished: list[tuple[dict, list] | None] = field(default_factory=list)
    sub_read: list = field(default_factory=list)  # passages its sub-questions read, in the order they were spawned
    asked: list[Request] = field(default_factory=list)  # the requests the slots answer (empty for children)
    missing: int = 0


def read_by(node: Node) -> list:
    """Every passage a question read, each once: its own retrieval first, then its sub-questions' (a row's
    retrieved_ids, which its citations are among; a question answered by sub-queries alone read theirs)."""
    first = {}
    for passage in [*node.item.passages, *node.sub_read]:
        first.setdefault(passage.id, passage)
    return list(first.values())


class Engine:
    def __init__(self, stages: dict[str, Stage], strategies: dict[str, Strategy],
                 config: EngineConfig, on_row: Callable[[dict], None],
                 on_progress: Callable[[Engine], None] | None = None, progress_every_s: float = 10.0,
                 aliases: dict[str, str] | None = None, log: Callable[[str], None] | None = None,
                 cache: RequestCache | None = None):
        self.stages = stages
        self.supervisor = Supervisor(stages, log or (lambda line: None))
        # a request for a stage that has no pool of its own runs on the aliased pool (judge -> generator)
        self.routes = {**{a: stages[t] for a, t in (aliases or {"judge": "generator"}).items() if t in stages},
                       **stages}
        self.strategies = strategies
        self.config = config
        self.on_row = on_row
        self.on_progress = on_progress
        self.progress_every_s = progress_every_s
        # responses already computed: this run's (memory) and, with a path, earlier runs' (disk)
        self.cache = cache if cache is not None else RequestCache(config.cache_size, memory_bytes=config.cache_mb * 2**20)
        self.cache_lookups: dict[str, int] = {}  # by request stage
        self.cache_hits: dict[str, dict[str, int]] = {}  # by request stage, then "memory" / "disk"
        self.waiters: dict[Request, list[tuple[Node, int]]] = {}
        self.launched: dict[Any, Launched] = {}  # ref -> its batch
        self.roots_in_flight = 0
        self.peak_in_flight = 0
        self.roots_done = 0
        self.requests_deduped = 0
        self.batch_failures = 0
        self.batch_splits = 0
        self.stage_tests = 0  # a request answered before, sent again after failures in a row (_test_stage)
        self.empty_answers = 0
        self.trees_capped = 0
        self.parse_failures = 0
        self.truncated: dict[str, dict[str, int]] = {}  # generations cut off at max_tokens, by strategy and step
        self.resolved: dict[str, dict[str, int]] = {}
        self.tokens = 0  # computed by the stages (a deduplicated request counts once)
        self.started = time.perf_counter()
        self.first_row_s: float | None = None  # when the first answer row went to the writer

    # --- driving -------------------------------------------------------------------------------

    def run(self, questions: Iterable[Question], strategy_names: list[str],
            todo: Callable[[str, Question], bool] | None = None) -> None:
        """Answer every (question, strategy) pair, or those ``todo`` accepts (resume)."""
        try:
            self._run(questions, strategy_names, todo)
        except BaseException:
            # the stages outlive this run (a Session's next call): what it left on them would hold their
            # replicas busy for good and its requests queued for nobody
            self._abandon()
            try:  # what was computed before the failure is kept for the rerun, and the failure is the error
                self.cache.flush()
            except Exception as err:  # noqa: BLE001 - a full disk must not hide why the run stopped
                self.supervisor.log(f"could not save the request cache: {_describe(err)}")
            raise
        self.cache.flush()

    def _abandon(self) -> None:
        for launched in {id(b): b for b in self.launched.values()}.values():
            self._drop(launched)
        for stage in self.stages.values():
            stage.queue.clear()
            stage.retry.clear()
            stage.suspects.clear()
            stage.canary = None
        self.waiters.clear()

    def _run(self, questions: Iterable[Question], strategy_names: list[str],
             todo: Callable[[str, Question], bool] | None) -> None:
        pending = ((q, s) for q in questions for s in strategy_names if todo is None or todo(s, q))
        self.supervisor.probe_restarting()
        exhausted = False
        last_progress = 0.0
        while True:
            while not exhausted and self.roots_in_flight < self.config.window:
                nxt = next(pending, None)
                if nxt is None:
                    exhausted = True
                else:
                    self._start_root(*nxt)
            if exhausted and self.roots_in_flight == 0:
                self._drop_stage_tests()
            self.supervisor.probe_killed(time.perf_counter())
            self._dispatch(flush=not self.launched)
            if exhausted and self.roots_in_flight == 0 and not self.launched:
                break  # a replica still starting does not hold up a run that needs nothing more (all cached)
            if not self.launched and not self.supervisor.probes:
                if not any(s.pending() for s in self.stages.values()):
                    raise RuntimeError("engine stalled: items wait but no request is queued or running")
                self._rest()
                continue
            self._wait_and_route()
            now = time.perf_counter()
            self.supervisor.watch(now)
            self.cache.flush_if_due()  # a batch's responses all arrive at once: put() alone would hold its tail
            if self.on_progress and now - last_progress >= self.progress_every_s:
                self.on_progress(self)
                last_progress = now
        # a replica that died and came back since the last look (a short run may never get to one) is
        # counted too, so replica_restarts covers the whole run
        self.supervisor.watch(time.perf_counter(), force=True)
        if self.on_progress:
            self.on_progress(self)

    def _dispatch(self, flush: bool) -> None:
        now = time.perf_counter()
        for stage in self.stages.values():
            while stage.due(now, flush):
                replica = stage.free_replica(now)
                if replica is None:
                    break
                batch, attempts = stage.take_for(replica)
                try:
                    refs = stage.launch(replica, batch)
                except Exception as err:  # noqa: BLE001 - a dead actor must not end the run
                    self._batch_failed(stage, replica, batch, attempts, err)
                    continue
                stage.stats.batch_started(replica, time.perf_counter(), stage.inflight[replica])
                stage.inflight[replica] += 1
                stage.sent(replica, batch)
                launched = Launched(stage, replica, batch, refs, attempts, pending=len(refs))
                for ref in refs:
                    self.launched[ref] = launched

    def _rest(self) -> None:
        """Nothing runs and every replica that could take the queued work rests after a failure."""
        wake = [d for s in self.stages.values() if (d := s.next_deadline()) is not None]
        rest = min(1.0, max(0.0, min(wake) - time.perf_counter())) if wake else 0.05
        time.sleep(min(rest, KILL_POLL_S) if self.supervisor.killed else rest)

    def _wait_and_route(self) -> None:
        now = time.perf_counter()
        deadlines = [d for s in self.stages.values() if (d := s.next_deadline()) is not None]
        # the same deadline overdue() keeps: a batch past started + timeout whose replica still answers
        # is not overdue, and waking for it would spin the driver at a timeout of 0
        deadlines += [d for b in self.launched.values() if (d := b.deadline()) is not None]
        timeout = max(0.0, min(deadlines) - now) if deadlines else 1.0
        if self.on_progress:  # wake up to report even while one long batch runs
            timeout = min(timeout, self.progress_every_s)
        if self.supervisor.killed:  # and to probe a killed replica once it restarts
            timeout = min(timeout, KILL_POLL_S)
        refs = [*self.launched, *self.supervisor.probes]
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # take everything else that is done too
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in self.supervisor.probes:
                self.supervisor.answered(ref)
                continue
            if ref not in self.launched:  # a readiness call that a death read before it made stale (died())
                continue
            if self.launched[ref].stage.streaming:
                self._stream_chunk(ref)
                continue
            launched = self.launched.pop(ref)
            launched.pending -= 1
            if launched.pending == 0:
                self._finish_batch(launched)
        now = time.perf_counter()
        # one restart per replica, blaming its oldest overdue batch: the restart takes the others off it
        # (retried as queued behind that one), so restarting for them too would kill it twice and fail
        # a batch already queued again
        overdue: dict[tuple[int, int], Launched] = {}
        for b in self.launched.values():
            if b.overdue(now):
                overdue.setdefault((id(b.stage), b.replica), b)
        for launched in overdue.values():
            self._restart_replica(launched)

    def _restart_replica(self, overdue: Launched) -> None:
        """Restart the replica of an overdue batch; the batch failed, the ones queued behind it did not. Where
        other actors it waits on are the stuck ones (a retriever's shard), they are restarted instead."""
        stage, replica = overdue.stage, overdue.replica
        if stuck := stage.stuck_elsewhere(overdue):
            self._drop(overdue)
            for shard in stuck:
                if shard in stage.shards_killed:  # restarting (in this pass or before): given its time
                    continue
                self.supervisor.log(f"{stage.name} shard {shard}: no result for {stage.batching.timeout_s} s while the "
                                    "other shards answered, killed to restart it")
                stage.restart_shard(shard)  # the batches queued at it fail with its death and are retried
            self._batch_failed(stage, replica, overdue.remaining(), overdue.attempts,
                               TimeoutError(f"shards {stuck} gave no result in {stage.batching.timeout_s} s"),
                               blameless=True)
            return
        on_replica = {id(b): b for b in self.launched.values() if b.stage is stage and b.replica == replica}
        for launched in on_replica.values():
            self._drop(launched)
            if launched is not overdue:
                remaining = launched.remaining()  # blameless, but a suspect stays one
                stage.retry.appendleft((remaining, launched.attempts, any(r in stage.suspects for r in remaining)))
        restarts = stage.ray_restarts(replica)
        stage.restart(replica)
        self.supervisor.died(stage, replica, f"no result for {stage.batching.timeout_s} s, killed to restart it",
                             restarts_before_kill=restarts)
        waited = "waited for a result" if stage.streaming else "ran"
        self._batch_failed(stage, replica, overdue.remaining(), overdue.attempts,
                           TimeoutError(f"batch of {len(overdue.batch)} {waited} over {stage.batching.timeout_s} s"))

    def _finish_batch(self, launched: Launched) -> None:
        stage = launched.stage
        self._result_from(stage, launched.replica)
        self._drop(launched)
        self._account(launched)
        try:
            results = ray.get(launched.refs)
            stage.stats.received(launched.refs)  # after the get: the owner may not know a new object's node before
            responses = stage.combine(launched.batch, results)
            if len(responses) != len(launched.batch):  # zip would leave the unanswered ones waiting forever
                raise RuntimeError(f"replica answered {len(responses)} of {len(launched.batch)} requests")
        except Exception as err:  # noqa: BLE001 - retried, isolated, at worst error rows
            self._batch_failed(stage, launched.replica, launched.batch, launched.attempts, err, launched.started)
            return
        stage.answered_ok(launched.replica, launched.batch, responses)
        self._deliver_batch(stage, launched.batch, responses)

    def _stream_chunk(self, stream) -> None:
        """The next chunk of a streaming batch is ready (or its stream ended, or failed)."""
        launched = self.launched[stream]
        stage = launched.stage
        try:
            ref = next(stream)
            chunk = ray.get(ref)
            stage.stats.received([ref])
        except StopIteration:
            chunk = None
        except Exception as err:  # noqa: BLE001 - what is not answered yet is retried, isolated, at worst error rows
            self._drop(launched)
            self._account(launched)
            self._batch_failed(stage, launched.replica, launched.remaining(), launched.attempts, err, launched.started)
            return
        if chunk is None:
            self._drop(launched)
            self._account(launched)
            if launched.remaining():  # a replica must answer every request of a call; retry what it did not
                self._batch_failed(stage, launched.replica, launched.remaining(), launched.attempts,
                                   RuntimeError(f"stream ended with {len(launched.remaining())} requests unanswered"))
            return
        self._result_from(stage, launched.replica)
        requests = [launched.batch[i] for i, _ in chunk]
        responses = [response for _, response in chunk]
        stage.stats.requests += len(requests)  # live, not only when the stream ends
        stage.answered_ok(launched.replica, requests, responses)
        launched.answered.update(i for i, _ in chunk)
        stage.returned(launched.replica, requests)
        self._deliver_batch(stage, requests, responses)

    def _result_from(self, stage: Stage, replica: int) -> None:
        """A result from ``replica``'s actor: every stage it serves counts it (a batch's timeout runs from the
        actor's last result). The ranker shares the retriever's serial query encoders: a retriever batch queued
        behind the ranker's calls saw none of their results and was killed as stuck, with the ranker's calls."""
        now = time.perf_counter()
        for peer, r in self.supervisor.same_actor(stage, replica):
            peer.last_result[r] = now

    def _drop(self, launched: Launched) -> None:
        """``launched`` no longer runs on its replica (finished, failed or abandoned)."""
        for ref in launched.refs:
            self.launched.pop(ref, None)
        launched.stage.inflight[launched.replica] -= 1
        launched.stage.returned(launched.replica, launched.remaining())

    def _account(self, launched: Launched) -> None:
        stats = launched.stage.stats
        stats.calls += 1
        stats.requests += len(launched.remaining())  # a stream's answered ones counted as they came
        stats.batch_sizes[len(launched.batch)] += 1
        stats.batch_ended(launched.replica, launched.started, time.perf_counter(), origin=self.started)

    def _batch_failed(self, stage: Stage, replica: int, batch: list[Request], attempts: int,
                      err: BaseException, started: float | None = None, blameless: bool = False) -> None:
        """Retry a failed batch on a healthy replica (see ``retry_plan``); a request that failed
        ``max_attempts`` times on its own becomes an error response. ``blameless``: neither the replica nor the
        batch failed (an actor it waited on did): the replica does not rest and the batch is no suspect."""
        stage.stats.errors += 1
        self.batch_failures += 1
        cause = err.cause if isinstance(err, RayTaskError) else err
        if getattr(cause, "stops_the_stage", False):  # an endpoint's 401 / 403 / 404: a setting, not a request
            raise StageDown(f"stage {stage.name}: {cause_of(cause)}; fix the setting and rerun the same command "
                            "to resume")
        if isinstance(err, RayActorError) and err.actor_init_failed:
            stage.retire(replica, err)  # raises when the stage has no replica left
        elif isinstance(err, RayActorError) and not stage.died_elsewhere(err):  # the batch may be blameless
            self.supervisor.died(stage, replica, death_cause(err))  # its actor died or is restarting
        # a replica that raised while it answers other calls is well, and the requests are bad: resting
        # it would add a cooldown to every failure of isolating them (10% bad questions: 400 took
        # 100-250 s at 2 s). Rest it after a death or a timeout, or when it has answered nothing since
        # the call started nor within a cooldown (an outage, or a replica gone bad: give it time, and
        # the retries to the others)
        now = time.perf_counter()
        answering = stage.answered_at[replica] > min(started if started is not None else now,
                                                     now - self.config.failure_cooldown_s)
        if not (isinstance(err, RayTaskError) and answering) and not blameless:
            stage.cooling_until[replica] = now + self.config.failure_cooldown_s
            stage.stats.rests += 1
        if not batch:  # a stream that failed once it had answered all it was asked: nothing to run again
            return
        if stage.is_test(batch):
            self._stage_test_failed(stage, replica, err)
            return
        # a retried call that raised again: its requests are bad, or everything fails. Once the stage has
        # answered in this run only requests retried alone count: with a third of the requests bad most
        # halves hold one. Before, every retry counts: an error every request hits stops in ~1 min, not
        # after each of a window of batches was split down to single requests (~10 min at 2 s cooldowns)
        # a call that got no result within the stage's timeout counts as one that raised: restarting never
        # mends a hung server (an endpoint's), and with only raised calls counted it was killed, restarted
        # and retried for as long as the input lasted
        if (attempts and not blameless and (len(batch) == 1 or stage.known_good is None)
                and isinstance(err, (RayTaskError, TimeoutError))):
            stage.retries_failed_in_a_row += 1
            if self.config.fail_fast_after and stage.retries_failed_in_a_row >= self.config.fail_fast_after:
                self._test_stage(stage, err)
        # blameless: whole, and not made a suspect, but a try all the same (a shard that never answers again ends)
        plan = ([(batch, attempts + 1)] if attempts + 1 < self.config.max_attempts else None) if blameless \
            else retry_plan(batch, attempts, self.config.max_attempts)
        if plan is None:
            error = f"{stage.name} failed {attempts + 1} times: {_describe_failure(err)}"
            self._deliver_batch(stage, batch, stage.failed(batch, error))
            return
        self.batch_splits += len(plan) > 1
        # a first failure is most likely the replica's: it goes again beside other work; after that it may
        # hold what breaks a replica, and it and its halves run alone
        alone = (attempts > 0 and not blameless) or any(r in stage.suspects for r in batch)
        if alone:
            stage.suspects.update(batch)
        stage.retry.extend((part, n, alone) for part, n in plan)

    def _test_stage(self, stage: Stage, err: BaseException) -> None:
        """Requests keep failing alone and nothing answers between: are they bad, or is the stage broken?

        Isolating every request at a cooldown per failure would take hours over a large input, so a
        broken stage stops the run. But failures in a row also happen where only bad requests are left
        (the good ones of the window answered first, the bad ones were still being isolated): so the
        stage is asked again a request it answered in this run. Answered, the run goes on; raising, or
        with nothing ever answered in this run, it stops."""
        if stage.canary is not None:
            return  # already asked
        if stage.known_good is None:
            raise StageDown(f"stage {stage.name}: {stage.retries_failed_in_a_row} retried calls raised in a row and "
                            f"none of its calls answered in this run ({cause_of(err)}); fix the cause "
                            "and rerun the same command to resume (or, if those requests are bad, set "
                            "engine.fail_fast_after=0 to make each an error row)")
        stage.canary, stage.canary_since = stage.known_good, time.perf_counter()
        stage.canary_after, stage.canary_failed_on = stage.retries_failed_in_a_row, set()
        self.stage_tests += 1
        stage.retry.appendleft(([stage.canary], 0, True))

    def _drop_stage_tests(self) -> None:
        """Every row is done: a stage test still queued answers nothing anyone waits for."""
        for stage in self.stages.values():
            queued = deque(item for item in stage.retry if not stage.is_test(item[0]))
            if len(queued) < len(stage.retry):  # (one being asked comes back as a test)
                stage.retry, stage.canary = queued, None

    def _stage_test_failed(self, stage: Stage, replica: int, err: BaseException) -> None:
        """The request asked again failed on ``replica``: the stage stops only when it failed on every
        replica it has, none of its calls answering meanwhile (one replica gone bad is not the stage)."""
        if self.roots_in_flight == 0 or stage.last_answered_s > stage.canary_since:
            stage.canary = None  # nothing waits on the test, or the stage answers: the failures were bad requests
            return
        stage.canary_failed_on.add(replica)  # (a request that answered before, now killing or hanging it: broken too)
        if set(range(len(stage.replicas))) - stage.retired <= stage.canary_failed_on:
            raise StageDown(f"stage {stage.name}: {stage.canary_after} requests retried alone raised in a row, "
                            f"and a request it had answered in this run failed too ({cause_of(err)}); fix "
                            "the cause and rerun the same command to resume")
        stage.retry.appendleft(([stage.canary], 0, True))  # to a replica it has not failed on (Stage.healthy)

    def _deliver_batch(self, stage: Stage, batch: list[Request], responses: list[Response]) -> None:
        canary = stage.is_test(batch)
        if canary:
            stage.canary = None  # it answered (answered_ok reset the count)
        stage.suspects.difference_update(batch)
        for request, response in zip(batch, responses):
            if isinstance(response, (Generation, Judgment)) and not response.error:  # a refused prompt computed nothing
                self.tokens += response.prompt_tokens + response.completion_tokens
                stage.stats.prompt_tokens += response.prompt_tokens
                stage.stats.cached_tokens += response.cached_tokens
            if not canary:  # its answer is cached already
                self.cache.put(request, response)
            for node, slot in self.waiters.pop(request, []):
                self._fill(node, slot, response)

    # --- items -----------------------------------------------------------------------------------

    def _start_root(self, question: Question, strategy_name: str) -> None:
        root = Root(question, self.strategies[strategy_name])
        self.roots_in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.roots_in_flight)
        node = Node(Item(question.question, kind=question.kind, dataset=question.dataset), root)
        if question.error:
            self._finish(node, Done("", "error", error=question.error))
            return
        self._step(node, self._call_strategy(node, "start"))

    def _step(self, node: Node, step) -> None:
        # Iterative so that chains of cache hits never recurse deeply.
        while True:
            if isinstance(step, Done):
                self._finish(node, step)
                return
            if isinstance(step, Spawn):
                questions, dropped = self._within_caps(node, step.questions)
                # sub-questions past a cap come back failed, in their places: the parent decides
                node.slots, node.missing = [None] * len(questions) + dropped, len(questions)
                node.finished = [None] * len(questions)
                if not questions:
                    step = self._resume(node)
                    continue
                root = node.root
                root.counters["n_subquestions"] += len(questions)
                root.counters["depth"] = max(root.counters["depth"], node.item.depth + 1)
                root.nodes += len(questions)
                for index, question in enumerate(questions):
                    child = Node(Item(question, depth=node.item.depth + 1), root, node, index)
                    self._step(child, self._call_strategy(child, "start"))
                return
            node.slots, node.missing, node.asked = [None] * len(step.requests), len(step.requests), step.requests
            for slot, request in enumerate(step.requests):
                self._count_request(node.root, request)
                cached, where = self.cache.get(request)
                self.cache_lookups[request.stage] = self.cache_lookups.get(request.stage, 0) + 1
                if cached is not None:
                    hits = self.cache_hits.setdefault(request.stage, {"memory": 0, "disk": 0})
                    hits[where] += 1
                    self.requests_deduped += 1
                    node.slots[slot] = cached
                    node.missing -= 1
                elif request in self.waiters:
                    self.requests_deduped += 1
                    self.waiters[request].append((node, slot))
                else:
                    self.waiters[request] = [(node, slot)]
                    self.routes[request.stage].queue.append((request, time.perf_counter()))
            if node.missing:
                return
            step = self._resume(node)

    def _within_caps(self, node: Node, questions: list[str]) -> tuple[list[str], list[Done]]:
        """The sub-questions that may run, and a failed result for each one past the caps."""
        if node.item.depth + 1 > self.config.max_depth:
            reason, room = "depth_cap", 0
        else:
            reason, room = "node_cap", max(0, self.config.max_nodes_per_root - node.root.nodes)
        if len(questions) <= room:
            return questions, []
        node.item.trace.append({"engine": reason, "dropped": questions[room:]})
        if not node.root.capped:
            node.root.capped = True
            self.trees_capped += 1
        field = "max_depth" if reason == "depth_cap" else "max_nodes_per_root"
        return questions[:room], [Done("", reason, error=f"not run: past engine.{field}") for _ in questions[room:]]

    def _resume(self, node: Node):
        responses, node.slots = node.slots, []
        asked, node.asked = node.asked, []
        # a spawn's children are gathered in their order, not in the order they finished: rows are alike run to run
        for entry, read in filter(None, node.finished):
            node.item.trace.append(entry)
            node.sub_read += read
        node.finished = []
        for request, r in zip(asked, responses):
            if getattr(r, "error", None):  # the row's trace accounts for every request it made
                node.item.trace.append({"step": request.step, "error": r.error})
            elif isinstance(r, (Generation, Judgment)):
                node.root.counters["prompt_tokens"] += r.prompt_tokens
                node.root.counters["completion_tokens"] += r.completion_tokens
                tokens = node.root.step_tokens
                tokens[request.step] = tokens.get(request.step, 0) + r.prompt_tokens + r.completion_tokens
                if getattr(r, "finish_reason", None) == "length":  # cut off: a step that may have lost its end
                    node.root.counters["n_truncated"] += 1
                    steps = self.truncated.setdefault(node.root.strategy.name, {})
                    steps[request.step] = steps.get(request.step, 0) + 1
        return self._call_strategy(node, "resume", responses)

    def _call_strategy(self, node: Node, method: str, *args):
        where = f"strategy {node.root.strategy.name}.{method}"
        try:
            step = getattr(node.root.strategy, method)(node.item, *args)
        except Exception as err:  # noqa: BLE001 - a strategy bug fails one question, not the run
            return Done("", "error", error=f"{where}: {_describe(err)}")
        if not isinstance(step, (Ask, Done, Spawn)):  # e.g. a solve() that ends without returning a Done
            return Done("", "error", error=f"{where} returned {type(step).__name__}, not Ask / Spawn / Done")
        wrong = self._invalid(step)
        return Done("", "error", error=f"{where}: {wrong}") if wrong else step

    def _invalid(self, step) -> str | None:
        """What in an Ask or a Spawn the engine cannot carry out: checked before anything is queued, so a
        strategy's mistake (a list where a request holds tuples, a stage this run has no pool for) fails
        its question and not the run."""
        if isinstance(step, Spawn):
            if isinstance(step.questions, str) or not all(isinstance(q, str) for q in step.questions):
                return "spawned something other than a list of question strings"
        if not isinstance(step, Ask):
            return None
        if not isinstance(step.requests, (list, tuple)):
            return f"asked {type(step.requests).__name__}, not a list of requests"
        for request in step.requests:
            if not isinstance(request, REQUEST_TYPES):
                return f"asked {type(request).__name__}, not a request ({', '.join(t.__name__ for t in REQUEST_TYPES)})"
            try:
                hash(request)
            except TypeError as err:
                return f"asked a {type(request).__name__} that cannot be hashed ({err}): its fields take tuples, not lists"
            if request.stage not in self.routes:
                return f"asked the {request.stage} stage, which this run has no pool for"
        return None

    def _fill(self, node: Node, slot: int, response: Response) -> None:
        node.slots[slot] = response
        node.missing -= 1
        if node.missing == 0:
            self._step(node, self._resume(node))

    def _count_request(self, root: Root, request: Request) -> None:
        if request.stage in ("generator", "judge"):
            root.counters["n_llm_calls"] += 1
        elif request.stage == "retriever":
            root.counters["n_retrievals"] += 1

    def _finish(self, node: Node, done: Done) -> None:
        node.root.counters["n_parse_failures"] += node.item.counts.get("parse_failures", 0)
        # sub-questions a strategy solved inline (least-to-most), besides the children it spawned
        node.root.counters["n_subquestions"] += node.item.counts.get("subquestions", 0)
        if node.item.counts.get("subquestions"):  # one level below the node that solved them (a row's depth)
            node.root.counters["depth"] = max(node.root.counters["depth"], node.item.depth + 1)
        self.parse_failures += node.item.counts.get("parse_failures", 0)
        if node.parent is not None:
            parent = node.parent
            entry = {"child": node.item.question, "answer": done.answer, "resolved_by": done.resolved_by,
                     **({"error": done.error} if done.error else {}), "trace": node.item.trace}
            parent.finished[node.index] = (entry, read_by(node))
            self._fill(parent, node.index, done)
            return
        root = node.root
        self.roots_in_flight -= 1
        self.roots_done += 1
        if self.first_row_s is None:
            self.first_row_s = time.perf_counter() - self.started
        by = self.resolved.setdefault(root.strategy.name, {})
        by[done.resolved_by] = by.get(done.resolved_by, 0) + 1
        if not done.answer and not done.error:  # the model said nothing usable: kept, and counted
            self.empty_answers += 1
        passages = read_by(node)
        self.on_row({
            "id": root.question.id,
            "question": root.question.question,
            "strategy": root.strategy.name,
            "answer": utf8(done.answer),
            "resolved_by": done.resolved_by,
            "retrieved_ids": [p.id for p in passages],
            "retrieved_scores": [p.score for p in passages],
            "citations": done.citations,
            **root.counters,
            "step_tokens": root.step_tokens,
            "latency_s": time.perf_counter() - root.started,
            "trace": utf8(json.dumps(node.item.trace, ensure_ascii=False)),
            "error": utf8(done.error),
            "_shard": root.question.shard,  # for the writer, not a column
        })

    # --- reporting -------------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        return {
            "roots_done": self.roots_done,
            "peak_roots_in_flight": self.peak_in_flight,
            "wall_s": round(wall, 3),
            "first_row_s": None if self.first_row_s is None else round(self.first_row_s, 3),
            "tokens_computed": self.tokens,
            "tokens_per_s": round(self.tokens / wall, 2) if wall else 0.0,
            "requests_deduped": self.requests_deduped,
            "batch_failures": self.batch_failures,
            "batch_splits": self.batch_splits,
            "stage_tests": self.stage_tests,
            "replica_restarts": self.supervisor.restarts,
            "empty_answers": self.empty_answers,
            "trees_capped": self.trees_capped,
            "parse_failures": self.parse_failures,
            "truncated": self.truncated,
            "stages": {name: {**s.stats.summary(wall, len(s.replicas)),
                              **({"vllm": s.engine_stats()} if hasattr(s, "engine_stats") else {})}
                       for name, s in self.stages.items()},
            "resolved_by": self.resolved,
            "request_cache": self.cache_summary(),
            "driver_bytes_in_per_root": round(sum(s.stats.bytes_in for s in self.stages.values())
                                              / max(1, self.roots_done), 1),
        }

    def cache_summary(self) -> dict[str, Any]:
        """Requests asked, and those answered from this run's memory or an earlier run's disk cache."""
        lookups = sum(self.cache_lookups.values())
        hits = {w: sum(h[w] for h in self.cache_hits.values()) for w in ("memory", "disk")}
        return {"path": str(self.cache.path) if self.cache.path else None, "disk_error": self.cache.disk_error,
                "read_only": self.cache.read_only, "pruned": self.cache.pruned, "undecodable": self.cache.undecodable,
                # dropped while the file stayed locked, or still waiting for it when the run ended
                "unsaved": self.cache.unsaved + len(self.cache.pending),
                "lookups": lookups, "hits": hits,
                "hit_rate": round(sum(hits.values()) / lookups, 4) if lookups else 0.0,
                "by_stage": {stage: {"lookups": n, **self.cache_hits.get(stage, {"memory": 0, "disk": 0})}
                             for stage, n in sorted(self.cache_lookups.items())}}


def retry_plan(batch: list, attempts: int, max_attempts: int) -> list[tuple[list, int]] | None:
    """What to run again after ``batch`` failed ``attempts`` times before (None: give up).

    A batch that fails for the first time runs again whole: most failures are the replica's (killed,
    frozen, restarted), and shredding a big batch into small ones would cost the run its batching.
    A batch that fails twice probably holds a request that breaks replicas: it is split in halves
    (already suspect, so they split again on their next failure) until that request is alone, so it
    cannot take the others down; alone, it gets ``max_attempts`` tries.
    """
    if not batch:
        return []
    if len(batch) == 1:
        return [(batch, attempts + 1)] if attempts + 1 < max_attempts else None
    if attempts == 0:
        return [(batch, 1)]
    half = len(batch) // 2
    return [(part, 1 if len(part) > 1 else 0) for part in (batch[:half], batch[half:])]


def _describe_failure(err: BaseException) -> str:
    """A failed call's error, for its rows: of an error a replica raised, its type and message on one line
    (Ray's header, the actor's pid and the remote traceback ran past the cut, before the message)."""
    if not isinstance(err, RayTaskError):
        return _describe(err)
    cause = err.cause if isinstance(err.cause, BaseException) else None
    if cause is None:  # an exception that does not unpickle here: the last line of Ray's text names it
        return cause_of(err)
    return f"{type(cause).__name__}: {' '.join(COLOURS.sub('', str(cause)).split())[:500]}"


def _describe(err: BaseException) -> str:
    # without Ray's terminal colours (escape codes in every row's error)
    return f"{type(err).__name__}: {COLOURS.sub('', str(err))[:500]}"
