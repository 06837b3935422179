"""The engine's driver with Ray stubbed: batch timeouts, a run that fails, token accounting."""

import time

import pytest

from engine import loop
from engine.loop import Engine
from engine.stages import GeneratorStage, Launched
from schemas.config import EngineConfig, StageBatching
from schemas.records import Generate


def request(i: int) -> Generate:
    return Generate(((("user", f"question {i}"),)))


@pytest.fixture
def engine(monkeypatch):
    """An engine over one generator replica (timeout 5 s, two calls in flight) whose Ray is stubbed:
    nothing is ready, kills and readiness probes are recorded, ``waits`` has each wait's timeout."""
    stage = GeneratorStage(["replica"], StageBatching(max_batch=1, timeout_s=5.0, max_inflight_per_replica=2))
    eng = Engine({"generator": stage}, {}, EngineConfig(), lambda row: None)
    eng.kills, eng.waits = [], []
    monkeypatch.setattr(stage, "restart", eng.kills.append)
    monkeypatch.setattr(eng.supervisor, "_probe", lambda stage, replica: stage.restarting.add(replica))
    stage.restarting.clear()  # the replica answered its first readiness call

    def wait(refs, num_returns, timeout):
        eng.waits.append(timeout)
        return [], refs

    monkeypatch.setattr(loop.ray, "wait", wait)
    return eng


def launch(eng: Engine, i: int, started: float) -> Launched:
    stage = eng.stages["generator"]
    launched = Launched(stage, 0, [request(i)], [f"ref{i}"], started=started, pending=1)
    stage.inflight[0] += 1
    eng.launched[launched.refs[0]] = launched
    return launched


def test_two_overdue_batches_on_one_replica_restart_it_once_and_each_request_is_queued_again_once(engine):
    long_ago = time.perf_counter() - 60
    first, second = launch(engine, 0, long_ago), launch(engine, 1, long_ago + 0.001)
    engine._wait_and_route()
    stage = engine.stages["generator"]
    assert engine.kills == [0] and engine.batch_failures == 1 and engine.supervisor.restarts == 1
    queued = [r for batch, _, _ in stage.retry for r in batch]
    assert sorted(queued, key=str) == sorted([*first.batch, *second.batch], key=str)
    assert not engine.launched and stage.inflight == [0]


def test_the_driver_sleeps_until_a_batch_is_overdue_even_past_its_own_start_plus_timeout(engine, monkeypatch):
    # the replica answered another call a second ago: this batch, sent 10 s ago, is not overdue for 4 s
    now = 1000.0
    monkeypatch.setattr("engine.loop.time.perf_counter", lambda: now)  # the driver's clock, stopped
    launch(engine, 0, now - 10)
    engine.stages["generator"].last_result[0] = now - 1
    engine._wait_and_route()
    assert engine.kills == [] and engine.waits == [4.0]


def test_a_run_that_fails_leaves_its_stages_idle_for_the_next_run_and_its_own_error_not_the_caches(engine, monkeypatch):
    # a Session keeps its stages across calls: batches and queues left by an aborted run kept the
    # replica "busy" for good, and the next call waited forever
    from schemas.errors import StageDown

    stage = engine.stages["generator"]
    launch(engine, 0, time.perf_counter())
    stage.queue.append((request(1), time.perf_counter()))
    stage.retry.append(([request(2)], 1, True))

    def fails(*args):
        raise StageDown("the generator stage is down")

    def disk_full():
        raise OSError("No space left on device")

    monkeypatch.setattr(engine, "_run", fails)
    monkeypatch.setattr(engine.cache, "flush", disk_full)
    logged = []
    monkeypatch.setattr(engine.supervisor, "log", logged.append)
    with pytest.raises(StageDown, match="the generator stage is down"):
        engine.run([], ["direct"])
    assert stage.inflight == [0] and not stage.queue and not stage.retry and not engine.launched
    assert "No space left on device" in logged[0]


def test_a_prompt_refused_before_the_model_counts_no_computed_tokens(engine):
    from schemas.records import Generation

    stage = engine.stages["generator"]
    engine._deliver_batch(stage, [request(0), request(1)],
                          [Generation("", 900, error="prompt of 900 tokens leaves no room"), Generation("Paris", 50, 2)])
    assert engine.tokens == 52 and stage.stats.prompt_tokens == 50


def shared_encoders(monkeypatch):
    """Without a cross-encoder the ranker ranks with the retriever's query encoders: one actor, two stages.
    Readiness calls are recorded, never answered."""
    from engine.stages import RankerStage, RetrieverStage
    from engine.supervision import Supervisor

    encoders = [object(), object()]
    retriever = RetrieverStage(encoders, ["shard"], StageBatching())
    ranker = RankerStage(encoders, StageBatching())
    for stage in (retriever, ranker):
        monkeypatch.setattr(stage, "probe", lambda replica: object())
        stage.restarting.clear()  # both replicas answered their first readiness call
    return retriever, ranker, Supervisor({"retriever": retriever, "ranker": ranker}, log=lambda line: None)


def test_an_encoder_shared_by_the_retriever_and_the_ranker_that_dies_once_counts_one_restart(monkeypatch):
    retriever, ranker, supervisor = shared_encoders(monkeypatch)
    supervisor.died(retriever, 1, "killed")
    supervisor.died(ranker, 1, "its batch failed on the same dead actor")
    for stage in (retriever, ranker):  # Ray then says that actor restarted once
        monkeypatch.setattr(stage, "ray_restarts", lambda r: 1 if r == 1 else 0)
    supervisor.watch(0.0, force=True)

    assert supervisor.restarts == 1
    assert retriever.deaths == ranker.deaths == [0, 1]
    assert retriever.restarting == ranker.restarting == {1}  # neither sends it work until it answers
    assert sorted(stage.name for stage, _ in supervisor.probes.values()) == ["ranker", "retriever"]


def test_a_shared_encoder_that_died_while_idle_counts_one_restart(monkeypatch):
    retriever, ranker, supervisor = shared_encoders(monkeypatch)
    for stage in (retriever, ranker):  # no call failed: only Ray's restart count says it
        monkeypatch.setattr(stage, "ray_restarts", lambda r: 1 if r == 1 else 0)
    supervisor.watch(0.0, force=True)
    assert supervisor.restarts == 1 and retriever.deaths == ranker.deaths == [0, 1]


def test_a_death_the_watch_saw_first_is_not_counted_again_when_the_replicas_call_fails(monkeypatch):
    """Before, a killed replica counted two restarts when the watch's poll read Ray's count before the failed
    call came back ("died while starting or idle", then "died (its batch failed)")."""
    retriever, ranker, supervisor = shared_encoders(monkeypatch)
    for stage in (retriever, ranker):
        monkeypatch.setattr(stage, "ray_restarts", lambda r: 1 if r == 1 else 0)
    supervisor.watch(0.0, force=True)
    assert retriever.restarting == ranker.restarting == {1}  # no work for it until it answers a readiness call
    supervisor.died(retriever, 1, "its batch failed")
    supervisor.died(ranker, 1, "its batch failed on the same dead actor")
    assert supervisor.restarts == 1 and retriever.deaths == ranker.deaths == [0, 1]


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_a_retriever_shard_that_died_is_said_and_counted_as_a_replicas_death_is(ray_session):
    """Ray's memory monitor killed a shard actor and the run said nothing of it (only its encoders were watched)."""
    from engine.stages import RetrieverStage, actor_restarts
    from engine.supervision import Supervisor
    from tests.engine.fakes import FakeEncoder, FakeShard

    shards = [ray_session.remote(FakeShard).options(num_cpus=0, max_restarts=1).remote(n) for n in ("a", "b")]
    stage = RetrieverStage([ray_session.remote(FakeEncoder).options(num_cpus=0).remote()], shards, StageBatching())
    said = []
    supervisor = Supervisor({"retriever": stage}, log=said.append)
    supervisor.watch(0.0, force=True)
    assert said == [] and supervisor.restarts == 0
    ray_session.kill(shards[1], no_restart=False)
    deadline = time.time() + 60
    while actor_restarts(shards[1]) != 1 and time.time() < deadline:
        time.sleep(0.2)
    supervisor.watch(0.0, force=True)
    supervisor.watch(0.0, force=True)  # one death, said once
    assert supervisor.restarts == 1 and stage.shard_deaths == [0, 1]
    assert len(said) == 1 and said[0].startswith("retriever shard 1 died (death 1 of this shard in this run)")


def test_a_second_death_makes_every_stage_on_that_actor_wait_for_a_new_readiness_call(monkeypatch):
    retriever, ranker, supervisor = shared_encoders(monkeypatch)
    supervisor.died(retriever, 1, "killed")
    stale = next(ref for ref, (stage, _) in supervisor.probes.items() if stage is ranker)
    back = next(ref for ref, (stage, _) in supervisor.probes.items() if stage is retriever)
    supervisor.probes.pop(back)  # the retriever's call was answered: it takes work again
    retriever.restarting.discard(1)
    supervisor.died(retriever, 1, "died again")  # the ranker's call, answered before this, would say "ready"
    supervisor.died(ranker, 1, "its batch failed on the same dead actor")
    assert stale not in supervisor.probes and ranker.restarting == {1}
    assert supervisor.restarts == 2 and retriever.deaths == ranker.deaths == [0, 2]


def test_a_replica_still_starting_when_a_run_ends_gives_no_figures_without_being_waited_for():
    """A run answered from the cache ended in a second and then waited 30 s per vLLM replica still starting
    for its statistics."""
    from engine.stages import StreamingGeneratorStage

    class Replica:
        @property
        def engine_stats(self):
            raise AssertionError("a replica still starting was asked for its figures")

    from schemas.config import LLMBatching

    stage = StreamingGeneratorStage([Replica()], LLMBatching())
    assert stage.engine_stats() == [{"error": "no figures: the replica had not started"}]



def test_a_ray_whose_actor_table_cannot_be_read_is_said_once_and_the_run_goes_on(monkeypatch):
    """Ray's private actor table (a Ray upgrade may move it) failed in silence: the watch for replicas that
    die while starting was off and nothing said so."""
    from types import SimpleNamespace

    import ray._private.state

    retriever, ranker, _ = shared_encoders(monkeypatch)
    said = []
    from engine.supervision import Supervisor

    supervisor = Supervisor({"retriever": retriever, "ranker": ranker}, log=said.append)
    retriever.replicas = ranker.replicas = [SimpleNamespace(_actor_id=bytes.fromhex("ab"))] * 2

    def unreadable(actor_id):
        raise KeyError("NumRestarts moved")

    monkeypatch.setattr(ray._private.state, "actors", unreadable)
    supervisor.watch(0.0, force=True)
    supervisor.watch(10.0, force=True)
    assert supervisor.restarts == 0 and len(said) == 1
    assert said[0].startswith("warning: Ray's actor table cannot be read (KeyError: 'NumRestarts moved')")


def test_a_readiness_call_made_stale_by_a_death_read_in_the_same_pass_is_skipped_not_a_crash(monkeypatch):
    """An encoder shared by the retriever and the ranker: a retriever batch on it failed (the actor died
    again) and the ranker's readiness call to it was ready in the same pass. died() forgot that call, and the
    driver then looked it up among the batches: a KeyError that ended the run."""
    from ray.exceptions import RayActorError

    from engine.stages import RankerStage, RetrieverStage
    from schemas.records import Retrieve

    encoders = [object(), object()]
    retriever, ranker = RetrieverStage(encoders, ["shard"], StageBatching()), RankerStage(encoders, StageBatching())
    eng = Engine({"retriever": retriever, "ranker": ranker}, {}, EngineConfig(failure_cooldown_s=0), lambda row: None)
    for stage in (retriever, ranker):
        monkeypatch.setattr(stage, "probe", lambda replica: object())
        monkeypatch.setattr(stage, "ray_restarts", lambda replica: None)
        stage.restarting.clear()
    stale = object()  # the ranker's readiness call to encoder 1, answered and not yet read
    ranker.restarting.add(1)
    eng.supervisor.probes[stale] = (ranker, 1)
    asked = Retrieve("q", 3)
    eng.waiters[asked] = []
    eng.launched["b"] = Launched(retriever, 1, [asked], ["b"], started=time.perf_counter(), pending=1)
    retriever.inflight[1] += 1
    monkeypatch.setattr(loop.ray, "wait", lambda refs, num_returns, timeout: (list(refs), []))  # the batch first

    def get(refs):
        raise RayActorError()
    monkeypatch.setattr(loop.ray, "get", get)
    eng._wait_and_route()
    assert stale not in eng.supervisor.probes and 1 in ranker.restarting  # it waits for a new readiness call
    assert [r for batch, _, _ in retriever.retry for r in batch] == [asked]


def test_a_shard_that_died_under_a_retriever_batch_is_not_said_to_be_its_encoder_nor_counted_twice(monkeypatch):
    """Before, the batch's failure said "retriever replica 0 died", and the watch then counted the shard's
    death too: two restarts for one, and the encoder's count one ahead of Ray's, so its next real death
    while idle went unnoticed."""
    from ray.exceptions import RayActorError

    from engine.stages import RetrieverStage
    from schemas.records import Retrieve

    class Shard:
        def __init__(self, hex_id):
            self._actor_id = type("ActorID", (), {"hex": lambda _self: hex_id})()

    shards = [Shard("s0"), Shard("s1")]
    stage = RetrieverStage([object()], shards, StageBatching())
    monkeypatch.setattr(stage, "probe", lambda replica: object())
    monkeypatch.setattr(stage, "_restarts_of", lambda actor: 1 if actor is shards[1] else 0)
    stage.restarting.clear()
    said = []
    eng = Engine({"retriever": stage}, {}, EngineConfig(failure_cooldown_s=0), lambda row: None, log=said.append)
    asked = Retrieve("q", 3)
    eng.waiters[asked] = []
    batch = Launched(stage, 0, [asked], ["a", "b"], started=time.perf_counter(), pending=2)
    stage.inflight[0] += 1
    eng.launched.update(a=batch, b=batch)
    monkeypatch.setattr(loop.ray, "wait", lambda refs, num_returns, timeout: (list(refs), []))

    def get(refs):
        raise RayActorError(actor_id="s1", error_msg="The actor died unexpectedly")
    monkeypatch.setattr(loop.ray, "get", get)
    eng._wait_and_route()
    eng.supervisor.watch(0.0, force=True)
    assert eng.supervisor.restarts == 1 and stage.deaths == [0] and stage.shard_deaths == [0, 1]
    assert not any("replica 0 died" in line for line in said) and any("shard 1 died" in line for line in said)
    assert [r for b, _, _ in stage.retry for r in b] == [asked]


def test_a_stream_that_fails_after_answering_everything_queues_no_empty_retry(engine):
    """Before, its empty remainder was queued again (split in two empty halves on a second failure), each
    resting a replica and counting a failure."""
    stage = engine.stages["generator"]
    engine._batch_failed(stage, 0, [], 1, RuntimeError("the stream broke after its last chunk"))
    assert not stage.retry


def test_a_retriever_batch_queued_behind_the_rankers_calls_on_their_shared_encoder_is_not_killed_as_stuck(monkeypatch):
    """The encoder answers one call at a time: a retriever batch sent behind the ranker's long calls got
    none of their results, passed its timeout and had the encoder killed, the ranker's calls with it."""
    from engine.stages import RankerStage, RetrieverStage
    from schemas.records import Rank, Ranking, Retrieve

    encoders = [object()]
    batching = StageBatching(timeout_s=5.0)
    retriever, ranker = RetrieverStage(encoders, ["shard"], batching), RankerStage(encoders, batching)
    eng = Engine({"retriever": retriever, "ranker": ranker}, {}, EngineConfig(), lambda row: None)
    kills = []
    for stage in (retriever, ranker):
        monkeypatch.setattr(stage, "restart", kills.append)
        monkeypatch.setattr(stage, "probe", lambda replica: object())
        monkeypatch.setattr(stage, "ray_restarts", lambda replica: None)
        stage.restarting.clear()
    now = time.perf_counter()
    queued, ranked = Retrieve("q", 3), Rank("q", ("a", "b"), 1)
    eng.waiters[queued], eng.waiters[ranked] = [], []
    eng.launched["r"] = Launched(retriever, 0, [queued], ["r"], started=now - 6, pending=1)  # past its 5 s
    eng.launched["k"] = Launched(ranker, 0, [ranked], ["k"], started=now - 6, pending=1)
    retriever.inflight[0] += 1
    ranker.inflight[0] += 1
    monkeypatch.setattr(loop.ray, "wait", lambda refs, num_returns, timeout: (["k"], [r for r in refs if r != "k"]))
    monkeypatch.setattr(loop.ray, "get", lambda refs: [None])
    monkeypatch.setattr(ranker, "combine", lambda batch, results: [Ranking([0], [1.0])])
    monkeypatch.setattr(ranker.stats, "received", lambda refs: None)  # Ray's object table: no Ray here
    eng._wait_and_route()  # the ranker's call answers: the encoder is working through its queue
    assert kills == [] and "r" in eng.launched


def test_a_first_failure_is_retried_beside_other_work_and_a_second_one_runs_alone(engine):
    """retry_plan: most first failures are the replica's; a batch that fails again may hold what breaks one."""
    from ray.exceptions import RayTaskError

    stage = engine.stages["generator"]
    engine._batch_failed(stage, 0, [request(1)], 0, RayTaskError("stream", "", RuntimeError("died")))
    engine._batch_failed(stage, 0, [request(2)], 1, RayTaskError("stream", "", RuntimeError("died")))
    assert [(b[0], alone) for b, _, alone in stage.retry] == [(request(1), False), (request(2), True)]


def test_a_retried_batch_goes_to_a_busy_replica_beside_its_work_unless_it_runs_alone():
    """Every retry waited for a replica with nothing in flight, and queued work waited behind it: with
    async replicas, a death's hundreds of retried streams each waited for a replica to drain."""
    stage = GeneratorStage(["a", "b"], StageBatching(max_batch=4, max_inflight_per_replica=3))
    stage.restarting.clear()
    stage.inflight = [2, 1]
    stage.retry.append(([request(1)], 1, False))
    assert stage.free_replica() == 1 and stage.take_for(1) == ([request(1)], 1)
    stage.inflight = [2, 1]
    stage.retry.append(([request(2)], 2, True))  # runs alone: b, the least loaded, drains for it
    stage.queue.extend((request(i), 0.0) for i in range(3, 7))  # a whole batch: a goes on with it
    assert stage.free_replica() == 0 and [r for r in stage.take_for(0)[0]] == [request(i) for i in range(3, 7)]
    stage.inflight = [3, 1]
    assert stage.free_replica() is None  # a is full; b takes nothing until it is empty
    stage.inflight = [3, 0]
    assert stage.free_replica() == 1 and stage.take_for(1) == ([request(2)], 2)


def test_a_dead_async_replicas_streams_are_retried_on_the_others_without_draining_the_pool():
    """8 replicas, one dead: its 400 streams, each retried alone, waited for a replica to drain one by one,
    and the pool answered 5-16 requests in 30 s where it had answered 3,000 (a reviewer's simulation)."""
    from engine.stages import StreamingGeneratorStage
    from schemas.config import LLMBatching

    stage = StreamingGeneratorStage([object()] * 3, LLMBatching(max_batch=8), "generator")
    for replica in range(3):
        stage.restarting.discard(replica)
        stage.ready(replica, 100_000)
    busy = Generate((("user", "x" * 40),), max_tokens=4)
    for replica in range(3):
        stage.sent(replica, [busy])
        stage.inflight[replica] = 1
    stage.retry.extend(([request(i)], 1, False) for i in range(6))  # a death's first failures
    taken = []
    while stage.retry and (replica := stage.free_replica()) is not None:
        batch, _ = stage.take_for(replica)
        stage.sent(replica, batch)
        stage.inflight[replica] += 1
        taken.append(replica)
    assert not stage.retry and sorted(set(taken)) == [0, 1, 2]
    stage.retry.append(([request(9)], 2, True))  # failed twice: runs alone, on the replica that empties first
    stage.queue.extend((request(i), 0.0) for i in range(10, 13))
    replica = stage.free_replica()
    assert replica is not None and request(9) not in stage.take_for(replica)[0]


def test_a_hung_retriever_shard_is_restarted_not_the_encoder_whose_batch_waited_on_it(monkeypatch):
    """A batch waits on its encoder and every shard: timed by the encoder's last result, a hung shard got each
    encoder killed in turn (600 s apiece) while it kept every batch waiting, and was never restarted itself."""
    from engine.stages import RetrieverStage
    from schemas.records import Retrieve

    stage = RetrieverStage([object()], [object(), object()], StageBatching(timeout_s=600))
    stage.restarting.clear()
    restarted = {"encoder": [], "shard": []}
    monkeypatch.setattr(stage, "restart", restarted["encoder"].append)
    monkeypatch.setattr(stage, "restart_shard", restarted["shard"].append)
    said = []
    eng = Engine({"retriever": stage}, {}, EngineConfig(failure_cooldown_s=0), lambda row: None, log=said.append)
    asked = Retrieve("q", 3)
    eng.waiters[asked] = []
    batch = Launched(stage, 0, [asked], ["shard0", "shard1"], started=time.perf_counter() - 700, pending=2)
    stage.inflight[0] += 1
    eng.launched.update(shard0=batch, shard1=batch)
    answered = {"shard0"}  # shard 0 answered the batch, shard 1 never does
    monkeypatch.setattr(loop.ray, "wait", lambda refs, num_returns, timeout: (
        [r for r in refs if r in answered], [r for r in refs if r not in answered]))
    eng._wait_and_route()
    assert restarted == {"encoder": [], "shard": [1]} and any("shard 1" in line for line in said)
    assert [r for b, _, _ in stage.retry for r in b] == [asked] and not eng.launched and stage.inflight == [0]
    # every shard waiting: the encoder may be what hangs, and it is restarted as before
    batch = Launched(stage, 0, [asked], ["s0", "s1"], started=time.perf_counter() - 700, pending=2)
    stage.retry.clear()
    stage.inflight[0] += 1
    eng.launched.update(s0=batch, s1=batch)
    monkeypatch.setattr(eng.supervisor, "died", lambda *args, **kwargs: None)
    eng._wait_and_route()
    assert restarted == {"encoder": [0], "shard": [1]}


def test_a_request_split_down_to_itself_still_runs_alone_on_its_next_retry_and_leaves_the_suspects_once_answered(engine):
    """retry_plan gives a request split out alone 0 tries; counted by its tries only, its next retry ran beside
    other work, where it could take a replica's other batches down with it."""
    from ray.exceptions import RayTaskError

    stage = engine.stages["generator"]
    boom = RayTaskError("generate", "", RuntimeError("crashed"))
    engine._batch_failed(stage, 0, [request(1), request(2)], 1, boom)  # failed twice: split, each half alone
    assert [(b, alone) for b, _, alone in stage.retry] == [([request(1)], True), ([request(2)], True)]
    stage.retry.clear()
    engine._batch_failed(stage, 0, [request(1)], 0, boom)  # the half's first failure on its own
    assert [(b, n, alone) for b, n, alone in stage.retry] == [([request(1)], 1, True)]
    engine.waiters[request(1)] = []
    engine._deliver_batch(stage, [request(1)], stage.failed([request(1)], "gave up"))
    assert request(1) not in stage.suspects


def test_a_replica_emptied_for_a_retry_that_runs_alone_takes_that_one_not_an_older_one_any_replica_could_take():
    stage = GeneratorStage(["a", "b"], StageBatching(max_batch=4, max_inflight_per_replica=3))
    stage.restarting.clear()
    stage.inflight = [0, 2]
    stage.retry.extend([([request(1)], 1, False), ([request(2)], 2, True)])
    assert stage.take_for(0) == ([request(2)], 2) and stage.take_for(1) == ([request(1)], 1)


def test_a_stuck_shard_is_killed_once_until_it_answers_and_the_encoder_whose_batch_waited_does_not_rest(monkeypatch):
    """Reloading its index may outlast a batch's timeout: each batch sent to it while it restarted killed it again."""
    from engine.stages import RetrieverStage
    from schemas.records import Retrieve

    stage = RetrieverStage([object()], [object(), object()], StageBatching(timeout_s=600))
    stage.restarting.clear()
    killed = []
    monkeypatch.setattr(loop.ray, "kill", lambda actor, no_restart: killed.append(stage.shards.index(actor)))
    eng = Engine({"retriever": stage}, {}, EngineConfig(failure_cooldown_s=30), lambda row: None, log=lambda line: None)
    answered = set()
    monkeypatch.setattr(loop.ray, "wait", lambda refs, num_returns, timeout: (
        [r for r in refs if r in answered], [r for r in refs if r not in answered]))
    for n in range(2):  # two passes: a batch, then its retry, each overdue on shard 1 alone
        asked = Retrieve(f"q{n}", 3)
        eng.waiters[asked] = []
        batch = Launched(stage, 0, [asked], [f"a{n}", f"b{n}"], started=time.perf_counter() - 700, pending=2)
        stage.inflight[0] += 1
        eng.launched.update({f"a{n}": batch, f"b{n}": batch})
        answered.add(f"a{n}")
        eng._wait_and_route()
    assert killed == [1] and stage.cooling_until == [0.0] and stage.stats.rests == 0
    assert [(b[0].query, n, alone) for b, n, alone in stage.retry] == [("q0", 1, False), ("q1", 1, False)]
    stage.answered_ok(0, [asked], [None])  # a batch every shard answered: shard 1 is back
    assert stage.shards_killed == set()
