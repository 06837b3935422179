"""Engine control flow on local Ray with scripted fake stage actors (no models)."""

import json

import pytest

from engine.loop import Engine
from engine.stages import GeneratorStage, RetrieverStage
from schemas.config import EngineConfig, StageBatching
from schemas.records import Generate, Generation, Question, Rank, Retrieval, Retrieve
from strategies.base import Ask, Done, Spawn, StrategySettings, prompt
from strategies.registry import STRATEGIES
from tests.engine.fakes import FakeEncoder, FakeGenerator, FakeShard, SlowGenerator

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


class Tree:
    """Test strategy: split into two sub-questions until depth 2, then join the children's answers."""

    name = "tree"
    stages = frozenset({"generator"})

    def start(self, item):
        if item.depth < 2:
            return Spawn([f"{item.question}.L", f"{item.question}.R"])
        return Ask([Generate((("user", item.question),))])

    def resume(self, item, responses):
        if isinstance(responses[0], Done):
            return Done("(" + " ".join(r.answer for r in responses) + ")", "decomposition")
        return Done(responses[0].text.removeprefix("echo:"), "leaf")


def make_engine(ray, rows, generator_batching=StageBatching(max_batch=8), window=16, retriever=False):
    gen = [ray.remote(FakeGenerator).options(num_cpus=0).remote()]
    stages = {"generator": GeneratorStage(gen, generator_batching)}
    if retriever:
        enc = [ray.remote(FakeEncoder).options(num_cpus=0).remote()]
        shards = [ray.remote(FakeShard).options(num_cpus=0).remote(n) for n in ("a", "b")]
        stages["retriever"] = RetrieverStage(enc, shards, StageBatching(max_batch=8))
    strategies = {n: STRATEGIES[n](StrategySettings(k=3)) for n in ("direct", "rag")}
    strategies["tree"] = Tree()
    return Engine(stages, strategies, EngineConfig(window=window), rows.append)


def test_every_question_and_strategy_yields_one_row(ray_session):
    rows = []
    engine = make_engine(ray_session, rows, retriever=True)
    questions = [Question(f"q{i}", f"question {i}") for i in range(50)]
    engine.run(questions, ["direct", "rag"])
    assert sorted((r["id"], r["strategy"]) for r in rows) == sorted(
        (f"q{i}", s) for i in range(50) for s in ("direct", "rag"))
    rag = {r["id"]: r for r in rows if r["strategy"] == "rag"}
    # top-3 over two shards (b scores one higher); the tie at 2.0 keeps shard order: a before b
    assert rag["q7"]["retrieved_ids"] == ["b-question 7-2", "a-question 7-2", "b-question 7-1"]
    assert rag["q7"]["n_retrievals"] == 1 and rag["q7"]["n_llm_calls"] == 1
    assert all(r["error"] is None for r in rows)


def test_window_bounds_roots_in_flight_and_batches_respect_max_batch(ray_session):
    rows = []
    engine = make_engine(ray_session, rows, StageBatching(max_batch=4), window=10)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(100)], ["direct"])
    assert len(rows) == 100
    assert engine.peak_in_flight == 10
    sizes = engine.stages["generator"].stats.batch_sizes
    assert max(sizes) <= 4 and sum(size * n for size, n in sizes.items()) == 100


def test_identical_requests_are_computed_once(ray_session):
    rows = []
    engine = make_engine(ray_session, rows)
    engine.run([Question(f"q{i}", "the same question") for i in range(30)], ["direct"])
    first_line = prompt("direct/user").format(question="the same question").splitlines()[0]
    assert len(rows) == 30 and {r["answer"] for r in rows} == {"echo:" + first_line}
    assert engine.stages["generator"].stats.requests == 1
    assert engine.requests_deduped == 29
    assert engine.tokens == 5  # computed once (3 prompt + 2 completion) ...
    assert all(r["prompt_tokens"] == 3 and r["completion_tokens"] == 2 for r in rows)  # ... charged to each


def test_fan_out_tree_completes_with_children_in_order(ray_session):
    rows = []
    engine = make_engine(ray_session, rows)
    engine.run([Question("r", "Q")], ["tree"])
    (row,) = rows
    assert row["answer"] == "((Q.L.L Q.L.R) (Q.R.L Q.R.R))"
    assert row["resolved_by"] == "decomposition"
    assert row["n_subquestions"] == 6 and row["n_llm_calls"] == 4
    trace = json.loads(row["trace"])
    assert sorted(c["child"] for c in trace) == ["Q.L", "Q.R"]


class Reads:
    """Test strategy: retrieve, split into L (which reads twice, so it finishes last) and R, join their answers;
    a question holding POISON fails at its read."""

    name = "reads"
    stages = frozenset({"generator", "retriever"})

    def start(self, item):
        return Ask([Retrieve(item.question, 2)])

    def resume(self, item, responses):
        r = responses[0]
        if isinstance(r, Retrieval):
            item.passages = r.passages
            if item.depth == 0:
                return Spawn([f"{item.question} L", f"{item.question} R"])
            return Ask([Generate((("user", item.question),), step="read")])
        if isinstance(r, Done):
            return Done(" + ".join(c.answer for c in responses), "decomposition")
        if r.error:
            return Done("", "error", error=r.error)
        if item.question.endswith("L") and not item.state.get("again"):
            item.state["again"] = True
            return Ask([Generate((("user", f"{item.question} again"),), step="read")])
        return Done(r.text, "leaf")


def test_a_row_lists_every_passage_its_question_and_sub_questions_read_and_its_trace_every_failed_request(ray_session):
    """retrieved_ids held the root's own retrieval only: a decomposed RA-ISF row cited passages outside it, and a
    Think-then-Act row answered by sub-queries had none (n_retrievals 1), so recall left it out. A failed
    sub-question's trace entry had no error, and no trace named the request that failed. Traces listed
    sub-questions in the order they finished, which varies from run to run."""
    rows = []
    gen = [ray_session.remote(FakeGenerator).options(num_cpus=0).remote()]
    enc = [ray_session.remote(FakeEncoder).options(num_cpus=0).remote()]
    shards = [ray_session.remote(FakeShard).options(num_cpus=0).remote(n) for n in ("a", "b")]
    stages = {"generator": GeneratorStage(gen, StageBatching(max_batch=1)),
              "retriever": RetrieverStage(enc, shards, StageBatching(max_batch=8))}
    engine = Engine(stages, {"reads": Reads()}, EngineConfig(window=4, failure_cooldown_s=0), rows.append)
    engine.run([Question("ok", "Q"), Question("bad", "POISON")], ["reads"])
    by_id = {r["id"]: r for r in rows}
    ok, bad = by_id["ok"], by_id["bad"]
    assert ok["answer"] == "echo:Q L again + echo:Q R" and ok["n_retrievals"] == 3
    # the root's own first, then the sub-questions' in the order they were asked (L finished after R)
    assert ok["retrieved_ids"] == ["b-Q-1", "a-Q-1", "b-Q L-1", "a-Q L-1", "b-Q R-1", "a-Q R-1"]
    assert len(ok["retrieved_scores"]) == 6
    assert [entry["child"] for entry in json.loads(ok["trace"])] == ["Q L", "Q R"]  # so is the trace
    trace = json.loads(bad["trace"])
    children = [entry for entry in trace if "child" in entry]
    assert len(children) == 2 and all("replica crashed" in c["error"] and c["resolved_by"] == "error" for c in children)
    assert all(c["trace"] == [{"step": "read", "error": c["error"]}] for c in children)
    assert bad["n_llm_calls"] == 2 and len(bad["retrieved_ids"]) == 6


def test_a_failing_batch_becomes_error_rows_and_the_run_continues(ray_session):
    rows = []
    engine = make_engine(ray_session, rows, StageBatching(max_batch=1))
    qs = [Question("ok1", "fine"), Question("bad", "POISON"), Question("ok2", "also fine"),
          Question("empty", "", error="empty question")]
    engine.run(qs, ["direct"])
    by_id = {r["id"]: r for r in rows}
    assert len(rows) == 4
    assert "replica crashed" in by_id["bad"]["error"]
    assert by_id["empty"]["error"] == "empty question"
    assert by_id["ok1"]["error"] is None and by_id["ok2"]["error"] is None


def test_driver_sleeps_while_replicas_work(ray_session, monkeypatch):
    """A partial batch waiting for a busy replica must not make the driver spin."""
    ray = ray_session
    real_wait, waits = ray.wait, []

    def wait(refs, *, num_returns=1, timeout=None, **kwargs):
        ready, rest = real_wait(refs, num_returns=num_returns, timeout=timeout, **kwargs)
        waits.append((timeout, len(ready)))
        return ready, rest

    rows = []
    gen = [ray.remote(SlowGenerator).options(num_cpus=0).remote()]
    ray.get(gen[0].__ray_ready__.remote())  # started: the driver's first wait is for its readiness call, answered
    strategies = {"direct": STRATEGIES["direct"](StrategySettings())}
    stage = GeneratorStage(gen, StageBatching(max_batch=4, max_wait_s=0.0))
    engine = Engine({"generator": stage}, strategies, EngineConfig(window=6), rows.append)
    monkeypatch.setattr(ray, "wait", wait)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(12)], ["direct"])
    assert len(rows) == 12 and stage.stats.calls >= 3  # 12 requests, 4 a batch: queued ones waited for the replica
    # a partial batch's deadline has passed at once (max_wait_s=0), but the busy replica cannot take it: the
    # driver wakes when a batch (or the readiness call) is done, or after the second it waits with nothing due;
    # a spinning driver asks Ray again and again with a timeout of (nearly) 0 and gets nothing
    assert [(t, n) for t, n in waits if not n and t < 1.0] == [], f"{len(waits)} waits for {stage.stats.calls} batches"
    # each batch and the readiness call woke it once, and a second look (timeout=0) took what else was done
    assert sum(1 for _, n in waits if n) <= 2 * (stage.stats.calls + 1)


class Wide:
    """Test strategy: every node asks for five sub-questions, forever (only caps stop it)."""

    name = "wide"
    stages = frozenset({"generator"})

    def start(self, item):
        return Spawn([f"{item.question}.{i}" for i in range(5)])

    def resume(self, item, children):
        ran = [c for c in children if c.error is None]
        assert all(c.resolved_by in ("node_cap", "depth_cap") for c in children if c.error)
        return Done(f"{len(ran)} of {len(children)} children", "decomposition")


def test_node_and_depth_caps_bound_trees_and_give_the_parent_its_dropped_children_as_failed(ray_session):
    rows = []
    gen = [ray_session.remote(FakeGenerator).options(num_cpus=0).remote()]
    engine = Engine({"generator": GeneratorStage(gen, StageBatching())}, {"wide": Wide()},
                    EngineConfig(max_nodes_per_root=12, max_depth=3), rows.append)
    engine.run([Question("r", "Q")], ["wide"])
    (row,) = rows
    assert row["n_subquestions"] == 11  # the root plus 11 children hit the cap of 12 nodes
    assert row["answer"] == "5 of 5 children" and row["depth"] <= 3 and row["error"] is None
    trace = json.loads(row["trace"])
    assert any(t.get("engine") == "node_cap" for t in _walk(trace))
    assert {t["answer"] for t in _walk(trace) if "child" in t} >= {"5 of 5 children", "1 of 5 children"}
    assert engine.metrics()["trees_capped"] == 1

    rows.clear()
    engine = Engine({"generator": GeneratorStage(gen, StageBatching())}, {"wide": Wide()},
                    EngineConfig(max_nodes_per_root=10_000, max_depth=2), rows.append)
    engine.run([Question("r", "Q")], ["wide"])
    (row,) = rows
    assert row["depth"] == 2 and row["n_subquestions"] == 5 + 25
    assert sum(t.get("engine") == "depth_cap" for t in _walk(json.loads(row["trace"]))) == 25


def _walk(trace):
    for entry in trace:
        yield entry
        yield from _walk(entry.get("trace", []))


class Fragile:
    """Test strategy whose start() raises for one question."""

    name = "fragile"
    stages = frozenset({"generator"})

    def start(self, item):
        if item.question == "boom":
            raise ValueError("bad state")
        malformed = {"list": Ask([Generate([("user", "x")])]), "none": Ask([None]),
                     "no pool": Ask([Rank("q", ("a",), 1)]), "letters": Spawn("abc")}
        return malformed.get(item.question) or Ask([Generate((("user", item.question),))])

    def resume(self, item, responses):
        if item.question == "silent":
            return None  # a solve() that falls off its end
        return Done(responses[0].text, "leaf")


def test_a_strategy_exception_or_a_step_that_is_not_one_fails_one_question_only(ray_session):
    rows = []
    gen = [ray_session.remote(FakeGenerator).options(num_cpus=0).remote()]
    engine = Engine({"generator": GeneratorStage(gen, StageBatching())}, {"fragile": Fragile()},
                    EngineConfig(), rows.append)
    malformed = ["list", "none", "no pool", "letters"]
    engine.run([Question("a", "fine"), Question("b", "boom"), Question("c", "ok"), Question("d", "silent")]
               + [Question(f"m{i}", q) for i, q in enumerate(malformed)], ["fragile"])
    by_id = {r["id"]: r for r in rows}
    assert "fragile.start: ValueError: bad state" in by_id["b"]["error"]
    assert by_id["d"]["error"] == "strategy fragile.resume returned NoneType, not Ask / Spawn / Done"
    assert by_id["a"]["answer"] == "echo:fine" and by_id["c"]["error"] is None
    # a malformed Ask or Spawn is the asking question's error, named, before anything is queued
    errors = [by_id[f"m{i}"]["error"] for i in range(len(malformed))]
    assert "cannot be hashed" in errors[0] and "asked NoneType, not a request" in errors[1]
    assert "asked the ranker stage, which this run has no pool for" in errors[2]
    assert "spawned something other than a list of question strings" in errors[3]


class Chain:
    """Test strategy: two sub-questions in turn, the second naming the first's answer (Think-then-Act's #n)."""

    name = "chain"
    stages = frozenset({"generator"})

    def start(self, item):
        if item.depth:
            return Ask([Generate((("user", item.question),))])
        item.answers = []
        return Spawn([f"{item.question}.first"])

    def resume(self, item, responses):
        if not item.depth and len(item.answers) == 0:
            item.answers.append(responses[0].answer)
            return Spawn([f"then {responses[0].answer}"])
        if not item.depth:
            return Done(" / ".join([*item.answers, responses[0].answer]), "decomposition")
        return Done(responses[0].text, "leaf")


def test_a_strategy_may_spawn_again_once_its_first_children_answered(ray_session):
    rows = []
    gen = [ray_session.remote(FakeGenerator).options(num_cpus=0).remote()]
    engine = Engine({"generator": GeneratorStage(gen, StageBatching())}, {"chain": Chain()}, EngineConfig(),
                    rows.append)
    engine.run([Question("a", "q")], ["chain"])
    assert rows[0]["answer"] == "echo:q.first / echo:then echo:q.first" and rows[0]["n_subquestions"] == 2


class Decomposing(FakeGenerator):
    """Decomposes every question into one sub-question (a JSON-constrained request), echoes the rest."""

    def generate(self, batch):
        return [Generation('{"sub_questions": ["Who is A?"]}', 3, 2) if r.json_schema else echo
                for r, echo in zip(batch, super().generate(batch))]


def test_a_row_whose_strategy_solved_sub_questions_inline_is_one_level_deep(ray_session):
    """least_to_most's rows with sub-questions said depth 0 (Think-then-Act's, spawned, said 1), so the
    report's depth chart showed none for it."""
    from strategies.least_to_most import LeastToMost, LeastToMostConfig

    rows = []
    gen = [ray_session.remote(Decomposing).options(num_cpus=0).remote()]
    engine = Engine({"generator": GeneratorStage(gen, StageBatching())},
                    {"least_to_most": LeastToMost(LeastToMostConfig())}, EngineConfig(), rows.append)
    engine.run([Question("a", "Who is B?")], ["least_to_most"])
    assert rows[0]["resolved_by"] == "decomposition" and rows[0]["n_subquestions"] == 1 and rows[0]["depth"] == 1


class CutOff(FakeGenerator):
    """Stops every generation about a sub-question (a JSON-constrained request) at its max_tokens."""

    def generate(self, batch):
        return [Generation('{"sub_questions": ["Who', 3, 2, finish_reason="length") if r.json_schema
                else Generation(echo.text, 3, 2, finish_reason="stop") for r, echo in zip(batch, super().generate(batch))]


def test_a_row_counts_its_generations_cut_off_at_max_tokens_and_the_run_counts_them_by_step(ray_session):
    """A generation that reached its max_tokens lost its end: vLLM says so (finish_reason "length"),
    and a row and metrics.json say how many of the row's generations it happened to (it was not recorded)."""
    from strategies.least_to_most import LeastToMost, LeastToMostConfig

    rows = []
    gen = [ray_session.remote(CutOff).options(num_cpus=0).remote()]
    engine = Engine({"generator": GeneratorStage(gen, StageBatching())},
                    {"least_to_most": LeastToMost(LeastToMostConfig()), "direct": STRATEGIES["direct"](StrategySettings())},
                    EngineConfig(), rows.append)
    engine.run([Question("a", "Who is B?")], ["least_to_most", "direct"])
    by = {r["strategy"]: r for r in rows}
    decompositions = by["least_to_most"]["step_tokens"]["decompose"] // 5  # 3 + 2 tokens a generation
    assert decompositions >= 1 and by["least_to_most"]["n_truncated"] == decompositions
    assert by["direct"]["n_truncated"] == 0
    assert engine.metrics()["truncated"] == {"least_to_most": {"decompose": decompositions}}


def test_utilisation_is_the_union_of_each_replicas_batches_per_time_slice(ray_session):
    from engine.stages import StageStats, utilisation

    # replica 0 busy 0-10 s (two overlapping batches), replica 1 busy 5-10 s
    stats = StageStats()
    stats.batch_started(0, 0.0, 0)
    stats.batch_started(0, 2.0, 1)
    stats.batch_ended(0, 0.0, 5.0)
    stats.batch_ended(0, 2.0, 10.0)
    stats.batch_started(1, 5.0, 0)
    stats.batch_ended(1, 5.0, 10.0)
    assert utilisation(stats.busy_bins, stats.bin_s, 10, 2, bins=5) == {"bin_s": 2.0, "busy": [0.5, 0.5, 0.75, 1.0, 1.0]}
    rows = []
    engine = make_engine(ray_session, rows)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(40)], ["direct"])
    u = engine.metrics()["stages"]["generator"]["utilisation"]
    assert len(u["busy"]) == 50 and u["bin_s"] > 0 and 0 < max(u["busy"]) <= 1


def test_the_prefix_cache_hit_rate_is_the_cached_share_of_every_answered_requests_prompt_tokens(ray_session):
    from tests.engine.fakes import PrefixCachedGenerator

    rows = []
    gen = [ray_session.remote(PrefixCachedGenerator).options(num_cpus=0).remote()]
    engine = Engine({"generator": GeneratorStage(gen, StageBatching(max_batch=2))},
                    {"direct": STRATEGIES["direct"](StrategySettings())}, EngineConfig(), rows.append)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(5)], ["direct"])
    generator = engine.metrics()["stages"]["generator"]
    assert generator["requests"] == 5  # over batches of 2: 2 + 2 + 1
    # 2 of 3 prompt tokens found in each of the 5 requests: summed over all of them, not the last batch's
    assert (generator["prompt_tokens"], generator["cached_tokens"]) == (15, 10)
    assert generator["prefix_cache_hit_rate"] == round(2 / 3, 4)


class HeldGenerator(FakeGenerator):
    """A request saying SLOW runs until ``marker`` exists (the test writes it once the other rows came) or for
    ``hold_s`` at most, and answers which ended it; the others answer at once."""

    def __init__(self, marker: str, hold_s: float):
        self.marker, self.hold_s = marker, hold_s

    def generate(self, batch):
        import os
        import time

        if any("SLOW" in r.messages[-1][1] for r in batch):
            deadline = time.monotonic() + self.hold_s
            while not os.path.exists(self.marker) and time.monotonic() < deadline:
                time.sleep(0.01)
            released = "released" if os.path.exists(self.marker) else "not released"
        return [Generation(released, 3, 2) if "SLOW" in r.messages[-1][1] else echo
                for r, echo in zip(batch, super().generate(batch))]


@pytest.mark.parametrize("kind", ["batch", "async"])
def test_an_async_replica_answers_each_request_when_it_ends_not_when_its_batch_does(ray_session, kind, tmp_path):
    from engine.stages import StreamingGeneratorStage
    from schemas.config import LLMBatching
    from tests.engine.fakes import streaming

    questions = [Question(f"q{i}", f"question {i}") for i in range(7)] + [Question("slow", "SLOW question")]
    batching = LLMBatching(max_batch=8, max_wait_s=0.5)  # the eight requests go as one batch
    # the long request ends once the seven short ones' rows came; a batch replica answers none of them before
    # it ends, so there it ends on its own after hold_s (an async replica's reaches it only if their rows never came)
    marker, hold_s = tmp_path / "seven rows came", 30.0 if kind == "async" else 1.0
    if kind == "async":
        stage = StreamingGeneratorStage(
            [ray_session.remote(streaming(HeldGenerator)).options(num_cpus=0).remote(str(marker), hold_s)], batching)
    else:
        stage = GeneratorStage([ray_session.remote(HeldGenerator).options(num_cpus=0).remote(str(marker), hold_s)],
                               batching)
    arrived = []

    def on_row(row):
        arrived.append((row["id"], row["answer"]))
        if len(arrived) == 7:
            marker.touch()

    engine = Engine({"generator": stage}, {"direct": STRATEGIES["direct"](StrategySettings())}, EngineConfig(window=8),
                    on_row)
    engine.run(questions, ["direct"])
    assert stage.stats.calls == 1 and len(arrived) == 8
    slow = dict(arrived)["slow"]
    if kind == "async":  # the seven short answers did not wait for the long one: their rows ended it
        assert slow == "released" and arrived[-1][0] == "slow"
    else:  # the batch returns when its longest request ends: no row came while it ran
        assert slow == "not released"


def test_async_replicas_keep_the_tokens_in_flight_within_twice_their_kv_cache(ray_session):
    from engine.stages import StreamingGeneratorStage
    from schemas.config import LLMBatching
    from tests.engine.fakes import SlowGenerator, streaming

    small = type("SmallCache", (streaming(SlowGenerator),), {"capacity": 100})  # room for about three requests
    replicas = [ray_session.remote(small).options(num_cpus=0).remote(0.2) for _ in range(2)]
    stage = StreamingGeneratorStage(replicas, LLMBatching(max_batch=64, max_wait_s=0.0))
    costs, sent = [], stage.sent
    stage.sent = lambda replica, batch: (costs.extend(map(stage.cost, batch)), sent(replica, batch))
    rows = []
    engine = Engine({"generator": stage}, {"direct": STRATEGIES["direct"](StrategySettings())}, EngineConfig(window=32),
                    rows.append)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(24)], ["direct"])
    assert len(rows) == 24 and all(r["error"] is None for r in rows)
    assert stage.budget == [200, 200] and stage.tokens_in_flight == [0, 0]
    # a replica with room takes at least one more request
    assert 200 <= stage.stats.peak_tokens_in_flight < 200 + max(costs)
    assert stage.stats.calls > 8  # no replica took the whole queue at once


def test_busy_seconds_are_the_union_of_a_replicas_overlapping_streams_and_running_counts_requests(ray_session):
    """Summed per stream, busy_s read 136 s for one replica in a 109 s run; "running" counted streams
    ("queued=0 running=1" with 30 requests out)."""
    from engine.stages import StageStats, StreamingGeneratorStage
    from schemas.config import LLMBatching
    from tests.engine.fakes import SlowGenerator, streaming

    def union(spans):
        total, end = 0.0, 0.0
        for _, a, b in sorted(spans):
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        return total

    # given times: streams 0-5 and 1-3 overlap (the later one ends first), 7-8 starts after the replica idled
    stats, spans = StageStats(), [(0, 0.0, 5.0), (0, 1.0, 3.0), (0, 7.0, 8.0)]
    stats.batch_started(0, 0.0, 0)
    stats.batch_started(0, 1.0, 1)
    stats.batch_ended(0, 1.0, 3.0)
    stats.batch_ended(0, 0.0, 5.0)
    stats.batch_started(0, 7.0, 0)
    stats.batch_ended(0, 7.0, 8.0)
    assert union(spans) == 6.0 and sum(b - a for _, a, b in spans) == 8.0
    assert stats.busy_s == pytest.approx(6.0)

    small = type("SmallCache", (streaming(SlowGenerator),), {"capacity": 100})
    stage = StreamingGeneratorStage([ray_session.remote(small).options(num_cpus=0).remote(0.3)],
                                    LLMBatching(max_batch=3, max_wait_s=0.0))
    seen = []

    def report(engine):
        launched = {id(b): b for b in engine.launched.values()}.values()
        seen.append((stage.running, sum(len(b.remaining()) for b in launched), sum(stage.inflight)))

    rows, spans = [], []
    count = stage.stats.batch_ended

    def ended(replica, started, finished, origin=0.0):  # each stream's span, to union here
        spans.append((replica, started, finished))
        count(replica, started, finished, origin)

    stage.stats.batch_ended = ended
    engine = Engine({"generator": stage}, {"direct": STRATEGIES["direct"](StrategySettings())}, EngineConfig(window=32),
                    rows.append, on_progress=report, progress_every_s=0.0)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(12)], ["direct"])
    assert len(rows) == 12 and stage.running == 0 and stage.stats.requests == 12
    assert all(running == out for running, out, _ in seen) and any(running > streams for running, _, streams in seen)
    assert any(streams > 1 for _, _, streams in seen)  # the replica had streams in flight at once
    # the engine counts each of the run's streams as it starts and ends: busy_s is the union of their spans
    # (the spans' and the count's start times are two readings of the clock a few microseconds apart)
    assert stage.stats.busy_s == pytest.approx(union(spans), abs=0.05)
    assert sum(stage.stats.busy_bins) == pytest.approx(stage.stats.busy_s)  # utilisation's slices hold the same time


def test_stage_statistics_do_not_grow_with_the_number_of_batches():
    """A list per batch (its size and span) took ~6 GB and ~15 minutes to summarise at 50M batches."""
    from engine.stages import StageStats

    stats = StageStats()
    for i in range(200_000):  # one replica busy without a break for 200,000 s, a batch a second
        stats.batch_started(0, float(i), 0)
        stats.batch_ended(0, float(i), i + 1.0)
        stats.batch_sizes[1 + i % 8] += 1
    assert len(stats.busy_bins) <= StageStats.MAX_BINS and len(stats.batch_sizes) == 8
    summary = stats.summary(wall_s=200_000.0, replicas=1)
    assert summary["utilisation"]["busy"] == [1.0] * 50 and summary["busy_s"] == 200_000.0
    assert (summary["batch_size"]["p50"], summary["batch_size"]["p90"], summary["batch_size"]["max"]) == (5, 8, 8)


def test_equally_loaded_async_replicas_take_turns_so_work_spreads_over_all_of_them():
    """When the driver cannot keep every replica busy, a replica that finishes quickly must not get
    every next batch while the last replicas of the pool get none (the simulated 64-replica cluster
    left one replica without a single request before this)."""
    from engine.stages import StreamingGeneratorStage
    from schemas.config import LLMBatching

    stage = StreamingGeneratorStage([object()] * 4, LLMBatching(max_batch=2), "generator")
    for replica in range(4):
        stage.restarting.discard(replica)
        stage.ready(replica, 1000)
    request = Generate((("user", "x" * 40),), max_tokens=4)
    chosen = []
    for _ in range(8):  # each batch is answered at once: every replica is idle at every choice
        replica = stage.free_replica()
        stage.sent(replica, [request])
        stage.returned(replica, [request])
        chosen.append(replica)
    assert chosen == [0, 1, 2, 3, 0, 1, 2, 3]


def test_a_burst_of_requests_is_shared_among_the_idle_async_replicas():
    """20 requests, 4 endpoint replicas: one call of 20 went to the first (its room is twice its KV
    cache), the server saw 2 in flight instead of 8, and the run took longer than on one replica."""
    from engine.stages import StreamingGeneratorStage
    from schemas.config import LLMBatching

    stage = StreamingGeneratorStage([object()] * 4, LLMBatching(), "generator")
    for replica in range(4):
        stage.restarting.discard(replica)
        stage.ready(replica, 100_000)
    request = Generate((("user", "x" * 40),), max_tokens=4)
    stage.queue.extend((request, 0.0) for _ in range(20))
    sizes = []
    while stage.queue and (replica := stage.free_replica()) is not None:
        batch, _ = stage.take_for(replica)
        stage.sent(replica, batch)
        sizes.append((replica, len(batch)))
    assert sizes == [(0, 5), (1, 5), (2, 5), (3, 5)]
    stage.queue.extend((request, 0.0) for _ in range(3))  # every replica busy: the least loaded takes them all
    replica = stage.free_replica()
    assert len(stage.take_for(replica)[0]) == 3


def test_a_burst_at_a_runs_start_leaves_their_shares_to_the_replicas_still_starting():
    """20 requests, 4 endpoint replicas answering their readiness calls one after another (each actor
    starts on its own): the first one ready counted itself the only idle replica and took all 20."""
    from engine.stages import StreamingGeneratorStage
    from schemas.config import LLMBatching

    def burst(replicas: int, ready: list[int]):
        stage = StreamingGeneratorStage([object()] * replicas, LLMBatching(), "generator")
        stage.queue.extend((Generate((("user", "x" * 40),), max_tokens=4), 0.0) for _ in range(20))
        sizes = []
        for replica in ready:
            stage.restarting.discard(replica)
            stage.ready(replica, 2 * 1024)
            while stage.queue and (free := stage.free_replica()) is not None:
                batch, _ = stage.take_for(free)
                stage.sent(free, batch)
                sizes.append((free, len(batch)))
        return sizes, stage

    assert burst(4, [0, 1, 2, 3])[0] == [(0, 5), (1, 5), (2, 5), (3, 5)]
    assert burst(1, [0])[0] == [(0, 20)]  # one replica: nobody to wait for
    sizes, stage = burst(4, [0])  # the others never come: the rest waits a short while, not for good
    assert sizes == [(0, 5)] and stage.next_deadline() == stage.first_ready_at + stage.startup_hold_s
    stage.first_ready_at -= stage.startup_hold_s
    assert stage.free_replica() == 0 and len(stage.take_for(0)[0]) == 15


def test_a_ranker_call_holds_as_many_requests_as_fit_its_text_budget():
    """A call's time is its texts: 128 MIGRES ranks of 50 passages ran past the ranker's 600 s timeout
    on a shared CPU core, so the replica was killed and the same batch retried."""
    from engine.stages import RankerStage
    from schemas.config import RankerBatching
    from schemas.records import Rank

    stage = RankerStage([object()], RankerBatching(max_texts=120))
    stage.restarting.clear()  # the replica answered its readiness call
    for i in range(4):
        stage.queue.append((Rank(f"q{i}", ("t",) * 50, 3), 0.0))
    stage.queue.append((Rank("long", ("t",) * 200, 3), 0.0))
    assert stage.full()  # 400 texts in 5 requests: a busy replica may queue the next call behind its work
    stage.inflight[0] = 1
    assert stage.free_replica() == 0
    assert [[r.query for r in stage.take()[0]] for _ in range(3)] == [["q0", "q1"], ["q2", "q3"], ["long"]]
    assert not stage.full()
    assert EngineConfig().ranker.max_texts == 1024


class BigShard(FakeShard):
    """Passages of 50 kB: a batch's hits exceed Ray's inline limit (100 kB) and go through the object store."""

    def search(self, queries, k):
        return [[p.__class__(p.id, p.title, "x" * 50_000, p.score) for p in hits] for hits in super().search(queries, k)]


def test_the_driver_counts_the_bytes_it_receives_per_stage_and_what_came_by_reference(ray_session):
    ray = ray_session
    rows = []
    engine = make_engine(ray, rows, retriever=True)
    engine.run([Question(f"q{i}", f"question {i}") for i in range(10)], ["rag"])
    small = engine.metrics()
    gen, ret = small["stages"]["generator"]["driver_bytes_in"], small["stages"]["retriever"]["driver_bytes_in"]
    assert gen["total"] > 0 and ret["total"] > 0
    assert gen["by_reference"] == ret["by_reference"] == 0  # small replies are inlined in the task's answer
    assert small["driver_bytes_in_per_root"] == round((gen["total"] + ret["total"]) / 10, 1)

    rows = []
    engine = make_engine(ray, rows, retriever=True)
    engine.stages["retriever"].shards = [ray.remote(BigShard).options(num_cpus=0).remote(n) for n in ("a", "b")]
    engine.run([Question(f"q{i}", f"question {i}") for i in range(10)], ["rag"])
    ret = engine.metrics()["stages"]["retriever"]["driver_bytes_in"]
    # each question's 3 hits from each of 2 shards, 50 kB each, reached the driver through the object store
    assert ret["by_reference"] == ret["total"] and ret["per_request"] > 2 * 3 * 50_000


def test_the_byte_count_is_taken_after_the_read_when_ray_knows_where_a_new_object_lies(ray_session, monkeypatch):
    """Ray's owner learns a returned object's node a moment after the task is done (3 of 600 replies here had
    no node yet when asked before the read): a lag simulated for every object not yet read."""
    ray = ray_session
    read: set = set()
    real_get, real_locations = ray.get, ray.experimental.get_object_locations

    def get(refs, *args, **kwargs):
        read.update(refs if isinstance(refs, list) else [refs])
        return real_get(refs, *args, **kwargs)

    def locations(refs, *args, **kwargs):
        found = real_locations(refs, *args, **kwargs)
        return {ref: {**info, "node_ids": info["node_ids"] if ref in read else []} for ref, info in found.items()}

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray.experimental, "get_object_locations", locations)
    rows = []
    engine = make_engine(ray, rows, retriever=True)
    engine.stages["retriever"].shards = [ray.remote(BigShard).options(num_cpus=0).remote(n) for n in ("a", "b")]
    engine.run([Question(f"q{i}", f"question {i}") for i in range(4)], ["rag"])
    ret = engine.metrics()["stages"]["retriever"]["driver_bytes_in"]
    assert ret["total"] > 4 * 2 * 3 * 50_000 and ret["by_reference"] == ret["total"]


def test_a_rows_text_holds_no_lone_surrogate_and_an_errors_text_no_terminal_colours():
    from engine.loop import _describe
    from schemas.records import utf8

    assert utf8("mentions \ud800") == "mentions ?" and utf8(None) is None  # pyarrow refused the row, the run died
    coloured = RuntimeError("\x1b[36mray::EndpointGenerator.stream()\x1b[39m\nEndpointError: Error code: 401")
    assert _describe(coloured) == "RuntimeError: ray::EndpointGenerator.stream()\nEndpointError: Error code: 401"
