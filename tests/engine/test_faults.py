"""Chaos on local Ray: replicas killed mid-run, requests that crash or hang replicas, actors that
cannot start. Every question must come out exactly once, with the answers of an undisturbed run."""

import os
import time

import pytest

from engine.loop import Engine
from engine.stages import GeneratorStage, RetrieverStage, StreamingGeneratorStage
from schemas.config import EngineConfig, LLMBatching, StageBatching
from schemas.errors import StageDown
from schemas.records import Question
from strategies.base import StrategySettings
from strategies.registry import STRATEGIES
from tests.engine.fakes import (
    BadReplicaGenerator,
    BreaksAfterGenerator,
    BrokenGenerator,
    DeepErrorGenerator,
    FakeEncoder,
    FakeGenerator,
    FirstComeFirstServed,
    FlakyGenerator,
    HangsOnceGenerator,
    ShortGenerator,
    SlowGenerator,
    SlowShard,
    SlowStartingGenerator,
    StreamingFake,
    streaming,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

QUESTIONS = [Question(f"q{i}", f"question {i}") for i in range(40)]


@pytest.fixture(params=["batch", "async"])
def kind(request):
    """Both kinds of generator replica: one call per micro-batch, or streamed results (serving: async)."""
    return request.param


def run(ray, questions, strategy="rag", generator=SlowGenerator, batching=StageBatching(max_batch=8),
        kill=None, kind="batch", log=None, replica_args=((), ()), **engine):
    """Run the engine; ``kill(stages)`` is called once, after the fifth question is done. A generator
    replica per item of ``replica_args``, its constructor's arguments."""
    if kind == "async":
        streams = generator if issubclass(generator, StreamingFake) else streaming(generator)
        actor = ray.remote(streams).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
        stages = {"generator": StreamingGeneratorStage([actor.remote(*a) for a in replica_args],
                                                       LLMBatching(**batching.model_dump()))}
    else:
        actor = ray.remote(generator).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
        stages = {"generator": GeneratorStage([actor.remote(*a) for a in replica_args], batching)}
    if "retriever" in STRATEGIES[strategy].stages:  # three actors that a closed-book run would only start
        shard = ray.remote(SlowShard).options(num_cpus=0, max_restarts=-1, max_task_retries=0)
        stages["retriever"] = RetrieverStage([ray.remote(FakeEncoder).options(num_cpus=0).remote()],
                                             [shard.remote(n) for n in ("a", "b")], StageBatching(max_batch=8))
    rows, killed = [], []

    def chaos(e):
        if kill and not killed and e.roots_done >= 5:
            kill(stages)
            killed.append(True)

    config = EngineConfig(**{"window": 16, "failure_cooldown_s": 0.0, **engine})
    eng = Engine(stages, {strategy: STRATEGIES[strategy](StrategySettings(k=2))}, config, rows.append,
                 on_progress=chaos, progress_every_s=0.0, log=log)
    eng.run(questions, [strategy])
    assert not kill or killed, "the run ended before the chaos"
    return {r["id"]: r for r in rows}, rows, eng


def answers(by_id):
    return {i: (r["answer"], r["retrieved_ids"], r["error"]) for i, r in by_id.items()}


CALM: dict[str, dict] = {}


def calm_answers(ray, kind: str, questions=QUESTIONS) -> dict:
    """The answers of an undisturbed run of ``questions`` (SlowGenerator, the chaos runs' fakes with their
    faults taken out: they answer alike), run once per kind and module: each run starts five actors, ~10 s
    on a 2-core box, and a dozen tests compare against the same answers."""
    if kind not in CALM:
        CALM[kind] = answers(run(ray, QUESTIONS, kind=kind)[0])
    return {q.id: CALM[kind][q.id] for q in questions}


@pytest.mark.parametrize("victim", ["generator replica", "retriever shard"])
def test_a_killed_actor_restarts_and_its_batches_are_retried(ray_session, victim, kind):
    def kill(stages):
        if victim == "generator replica":
            # a replica with a batch on it: one killed while idle (or still starting, as on a loaded box)
            # fails no batch, and then there is nothing to retry
            generator = stages["generator"]
            actor = generator.replicas[next((i for i, n in enumerate(generator.inflight) if n), 0)]
        else:
            actor = stages["retriever"].shards[1]
        ray_session.kill(actor, no_restart=False)

    calm = calm_answers(ray_session, kind)
    by_id, rows, engine = run(ray_session, QUESTIONS, kill=kill, kind=kind)
    assert len(rows) == len(QUESTIONS) and answers(by_id) == calm
    assert all(r["error"] is None for r in rows) and engine.batch_failures >= 1


def test_a_restarting_replica_gets_no_batch_until_it_is_back_so_no_batch_is_split(ray_session, kind):
    """A call to a restarting actor fails at once (ActorUnavailableError): batches sent to it while it
    restarts would count as failing again, be split and run alone, and the stage would lose its batching."""
    def kill(stages):
        ray_session.kill(stages["generator"].replicas[0], no_restart=False)

    calm = calm_answers(ray_session, kind)
    by_id, rows, engine = run(ray_session, QUESTIONS, generator=SlowStartingGenerator, kill=kill, kind=kind)
    assert answers(by_id) == calm and all(r["error"] is None for r in rows)
    assert engine.batch_failures >= 1 and engine.batch_splits == 0
    assert engine.metrics()["replica_restarts"] >= 1
    # (a bound on calls against the calm run was dropped: how many calls the same work takes depends on
    # timing: it failed 1 run in 3 on a loaded box (10 calls against 7 + 2) and in a fresh-clone CI run.
    # A batch sent to the restarting replica fails a second time and is split: batch_splits says it.)


def test_a_replica_dead_for_good_is_retired_and_the_others_finish_the_run(ray_session, kind):
    def kill(stages):
        ray_session.kill(stages["generator"].replicas[0], no_restart=True)

    calm = calm_answers(ray_session, kind)
    by_id, rows, engine = run(ray_session, QUESTIONS, kill=kill, kind=kind)
    assert answers(by_id) == calm and all(r["error"] is None for r in rows)
    assert engine.stages["generator"].retired == {0} and engine.batch_splits == 0


def test_a_replica_killed_while_it_starts_is_reported_and_the_run_finishes_once_it_starts(ray_session, kind, tmp_path):
    """Ray's memory monitor kills a replica that loads too much while it starts; the run must say so,
    not wait in silence with a full queue."""
    starts = tmp_path / "starts"

    def dies_twice(self):
        with open(starts, "a") as f:
            f.write("x")
        if len(starts.read_text()) <= 2:  # the first two starts die, as under Ray's memory monitor
            time.sleep(1)
            os._exit(1)
        SlowGenerator.__init__(self)

    generator = type("DiesWhileStarting", (SlowGenerator,), {"__init__": dies_twice})
    lines = []
    calm = calm_answers(ray_session, kind, QUESTIONS[:10])
    by_id, rows, engine = run(ray_session, QUESTIONS[:10], generator=generator, kind=kind, log=lines.append)
    assert answers(by_id) == calm and all(r["error"] is None for r in rows)
    assert engine.metrics()["replica_restarts"] >= 2
    assert any(line.startswith("generator replica ") and " died " in line for line in lines), lines


def test_a_transient_failure_retries_the_batch_whole(ray_session, kind):
    calm = calm_answers(ray_session, kind)
    by_id, rows, engine = run(ray_session, QUESTIONS, generator=FlakyGenerator, kind=kind)
    assert answers(by_id) == calm and all(r["error"] is None for r in rows)
    # each replica's first call failed once; the first failure is retried whole. An async replica takes a retry
    # beside its own work, so the retry may be the other replica's first call and fail there too: then, failed
    # twice, it is split (a batch replica's retry went to the replica that had failed, idle again)
    assert engine.batch_failures == 2 and engine.batch_splits <= (kind == "async")
    assert engine.metrics()["batch_splits"] == engine.batch_splits


def test_a_request_that_kills_replicas_is_isolated_to_one_error_row(ray_session, kind):
    questions = [*QUESTIONS[:12], Question("killer", "KILLME please"), *QUESTIONS[12:20]]
    by_id, rows, engine = run(ray_session, questions, strategy="direct", generator=FakeGenerator, max_attempts=2,
                                 kind=kind)
    assert len(rows) == len(questions)
    assert "generator failed 2 times" in by_id["killer"]["error"]
    assert engine.batch_splits >= 2  # a batch of several only splits after failing twice
    assert all(r["error"] is None and r["answer"].startswith("echo:") for i, r in by_id.items() if i != "killer")


def test_a_batch_replica_that_answers_fewer_requests_than_it_was_given_fails_the_call_not_the_run(ray_session):
    questions = [*QUESTIONS[:12], Question("short", "SHORT please"), *QUESTIONS[12:20]]
    by_id, rows, _ = run(ray_session, questions, strategy="direct", generator=ShortGenerator, max_attempts=2)
    assert len(rows) == len(questions)  # the engine stalled with the unanswered request waiting
    assert "replica answered 0 of 1 requests" in by_id["short"]["error"]
    assert all(r["error"] is None and r["answer"].startswith("echo:") for i, r in by_id.items() if i != "short")


def test_an_error_every_request_hits_stops_the_run_instead_of_isolating_each_request(ray_session, kind):
    # isolating 50 such requests on 2 replicas took 200 s at the default 2 s cooldown (4 failures a
    # request); over a large input it is hours of turning every question into an error row
    poisoned = [Question(f"p{i}", f"POISON {i}") for i in range(24)]
    with pytest.raises(StageDown, match=r"stage generator: 16 retried calls raised in a row and none of its calls "
                                        r"answered in this run \(RuntimeError: replica crashed\)"):
        run(ray_session, poisoned, strategy="direct", generator=FakeGenerator, kind=kind, fail_fast_after=16)
    # with the check off, each becomes an error row as before
    by_id, rows, _ = run(ray_session, poisoned, strategy="direct", generator=FakeGenerator, kind=kind,
                         fail_fast_after=0)
    assert len(rows) == 24 and all("generator failed 3 times" in r["error"] for r in rows)


def test_bad_requests_failing_in_a_row_once_the_good_ones_answered_become_error_rows_and_the_run_goes_on(
        ray_session, kind):
    # where the good requests of a window answer first, the bad ones left fail in a row with nothing
    # answering between: the stage is asked again a request it answered, and goes on. Stopping on such
    # failures in a row stopped a run with a third of 400 questions bad after ~2 s (the async kind)
    questions = [Question(f"q{i}", f"question {i}" if i < 30 else f"POISON {i}") for i in range(90)]
    by_id, rows, engine = run(ray_session, questions, strategy="direct", generator=FakeGenerator, kind=kind,
                              fail_fast_after=8, window=90)
    assert len(rows) == 90 and engine.stage_tests >= 1
    assert {i for i, r in by_id.items() if r["error"]} == {f"q{i}" for i in range(30, 90)}
    assert all(r["answer"] == f"echo:Question: question {i[1:]}" for i, r in by_id.items() if not r["error"])


def test_a_third_of_the_requests_bad_gives_their_error_rows_and_the_others_answers_without_stopping(ray_session,
                                                                                                     kind):
    questions = [Question(f"q{i}", f"POISON {i}" if i % 3 == 0 else f"question {i}") for i in range(120)]
    by_id, rows, _ = run(ray_session, questions, strategy="direct", generator=FakeGenerator, kind=kind,
                         fail_fast_after=24, window=64)
    assert len(rows) == 120
    assert {i for i, r in by_id.items() if r["error"]} == {f"q{i}" for i in range(0, 120, 3)}


def test_a_stage_that_goes_bad_mid_run_stops_it_when_a_request_it_answered_fails_too(ray_session, kind):
    questions = [Question(f"q{i}", f"question {i}") for i in range(200)]
    with pytest.raises(StageDown, match=r"stage generator: \d+ requests retried alone raised in a row, and a "
                                        r"request it had answered in this run failed too \(RuntimeError: device lost\)"):
        run(ray_session, questions, strategy="direct", generator=BreaksAfterGenerator, kind=kind, fail_fast_after=8)


def test_one_replica_gone_bad_rests_and_the_others_answer_its_requests_without_stopping_the_run(ray_session, kind):
    # it answers nothing, so each failure rests it, and the stage test (asked after fail_fast_after
    # failures) goes to a replica it has not failed on: the stage answers, the run goes on. (Unrested
    # because the stage was answering, it took every retry while the other worked, failed the test and
    # stopped the run)
    questions = [Question(f"q{i}", f"question {i}") for i in range(40)]
    by_id, rows, _ = run(ray_session, questions, strategy="direct", generator=BadReplicaGenerator, kind=kind,
                         replica_args=((True,), (False,)), fail_fast_after=4, failure_cooldown_s=1.0)
    assert len(rows) == 40 and all(r["error"] is None for r in rows)


def test_a_replica_that_raises_while_it_answers_is_not_rested(ray_session, kind):
    # resting it would add a cooldown to each failure of isolating bad requests: 10% bad questions,
    # 400 of them, took 231 s (batch) and 112 s (async) at a 2 s cooldown, 8-13 s without. (A failure
    # before a replica answered rests it: that may be an outage, so the bad ones come later here)
    questions = [Question(f"q{i}", f"POISON {i}" if i % 10 == 5 and i >= 40 else f"question {i}") for i in range(80)]
    _, rows, engine = run(ray_session, questions, strategy="direct", kind=kind, failure_cooldown_s=3600)
    assert len(rows) == 80 and sum(r["error"] is not None for r in rows) == 4 and engine.batch_failures >= 4
    assert engine.stages["generator"].stats.rests == 0


def test_a_hanging_batch_times_out_and_the_hanging_request_becomes_an_error_row(ray_session, kind):
    questions = [*QUESTIONS[:6], Question("hang", "HANG forever"), *QUESTIONS[6:10]]
    by_id, rows, _ = run(ray_session, questions, strategy="direct", generator=FakeGenerator,
                         batching=StageBatching(max_batch=4, timeout_s=5.0), max_attempts=2,
                         failure_cooldown_s=1.0, kind=kind)  # time for the killed replica to restart
    assert len(rows) == len(questions)
    assert ("waited for a result over 5.0 s" if kind == "async" else "ran over 5.0 s") in by_id["hang"]["error"]
    assert {i: r["error"] for i, r in by_id.items() if r["error"]}.keys() == {"hang"}


def test_a_raised_errors_row_says_what_went_wrong_not_rays_header_and_the_remote_traceback(ray_session, kind):
    """An async replica's row held 500 characters of Ray's header (pid, actor id) and of the remote traceback,
    cut before vLLM's message: 'Unsupported type "'; a message of several lines is kept whole, on one."""
    questions = [*QUESTIONS[:3], Question("bad", "REJECT this")]
    by_id, rows, _ = run(ray_session, questions, strategy="direct", generator=DeepErrorGenerator, kind=kind,
                         batching=StageBatching(max_batch=4), max_attempts=2)
    assert by_id["bad"]["error"] == 'generator failed 2 times: RuntimeError: Unsupported type "nonsense". See the docs.'
    assert all(by_id[q.id]["error"] is None for q in QUESTIONS[:3])


def test_a_replica_killed_for_a_timeout_takes_work_again_only_from_its_restarted_copy(ray_session, kind, tmp_path):
    """ray.kill returns before the actor dies, and an async replica's copy being killed answered the readiness
    call sent at once: the retried request went to the restarting actor and failed there (ActorUnavailableError),
    a second restart counted and one of its attempts spent."""
    log = []
    questions = [*QUESTIONS[:3], Question("hang", "HANG once")]
    by_id, rows, engine = run(ray_session, questions, strategy="direct", generator=HangsOnceGenerator, kind=kind,
                              replica_args=((str(tmp_path / "hung"),),), log=log.append,
                              batching=StageBatching(max_batch=1, timeout_s=5.0))
    assert len(rows) == 4 and all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert by_id["hang"]["answer"] == "echo:Question: HANG once"
    # every death is a kill for a timeout (one, or more where a loaded box is slow to answer), none a call
    # that reached the restarting actor
    assert log and all("killed to restart it" in line for line in log), log
    assert engine.metrics()["replica_restarts"] == len(log), log


@pytest.mark.timeout(600)  # four actor restarts: ~10 s on an idle 2-core box, 51 s at load 13, over 180 s at load 18
def test_a_stage_whose_every_call_hangs_stops_the_run_instead_of_restarting_its_replicas_for_ever(ray_session, kind):
    """A hung server behind an endpoint pool: the watchdog killed and restarted the replica (48 times for
    12 questions), and the run never stopped by itself; only calls that raised counted towards it."""
    hanging = [Question(f"h{i}", f"HANG {i}") for i in range(8)]
    with pytest.raises(StageDown, match=r"stage generator: 2 retried calls raised in a row and none of its calls "
                                        r"answered in this run \(batch of \d+ (ran|waited for a result) over 1.0 s\)"):
        run(ray_session, hanging, strategy="direct", generator=FakeGenerator, kind=kind, replica_args=((),),
            batching=StageBatching(max_batch=4, timeout_s=1.0), fail_fast_after=2, failure_cooldown_s=0.5)


def test_a_replica_slower_to_start_than_the_timeout_gets_work_once_it_is_ready_and_is_not_killed_for_it(ray_session, kind):
    """A batch replica got its first batches while Ray was still creating it, and their timeout ran from the
    call: it was killed mid-start, and Ray ran the calls it held on the restarted copy, untracked and ahead
    of the readiness call (a hung one there left the run waiting for ever on a loaded box)."""
    log = []
    by_id, rows, engine = run(ray_session, QUESTIONS[:8], strategy="direct", generator=SlowStartingGenerator,
                              kind=kind, replica_args=((),), log=log.append,
                              batching=StageBatching(max_batch=4, timeout_s=2.0))  # it takes 4 s to start
    assert len(rows) == 8 and all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert engine.metrics()["replica_restarts"] == 0 and not log, log


def test_a_call_waiting_behind_another_on_a_replica_that_streams_results_is_not_timed_out(ray_session):
    # each replica gets two calls of 4 (2.4 s each, a result every 0.6 s): the second waits 2.4 s for
    # its first result, past the 1.5 s timeout, while its replica streams the first call's. Timed alone,
    # it was killed with the replica, and the first call's work with it.
    log = []
    by_id, rows, engine = run(ray_session, QUESTIONS[:16], strategy="direct", generator=FirstComeFirstServed,
                              batching=StageBatching(max_batch=4, timeout_s=1.5), kind="async", log=log.append)
    assert len(rows) == 16 and all(r["error"] is None for r in rows)
    assert engine.metrics()["replica_restarts"] == 0 and not log


def test_actors_that_cannot_start_stop_the_run_with_a_clear_error(ray_session, kind):
    with pytest.raises(StageDown, match="model weights not found"):
        run(ray_session, QUESTIONS[:4], strategy="direct", generator=BrokenGenerator, kind=kind)
