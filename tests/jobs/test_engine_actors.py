"""Several engine actors over the same pools (engine.actors > 1): the same rows, exactly once, resumable."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.stages import GeneratorStage, RetrieverStage, StreamingGeneratorStage
from jobs.answer import answer
from jobs.engine_actors import EngineActor
from schemas.config import LLMBatching, StageBatching
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeEncoder, FakeGenerator, FakeShard

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def write_questions(path, n):
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(n)], "question": [f"question {i}" for i in range(n)]}),
                   path, row_group_size=16)


def stub_stages(ray):
    return {"generator": GeneratorStage([ray.remote(FakeGenerator).options(num_cpus=0).remote() for _ in range(2)],
                                        StageBatching(max_batch=8)),
            "retriever": RetrieverStage([ray.remote(FakeEncoder).options(num_cpus=0).remote()],
                                        [ray.remote(FakeShard).options(num_cpus=0).remote(n) for n in "ab"],
                                        StageBatching(max_batch=8))}


def read(out):
    return {s: sorted(pq.read_table(out / s).select(["id", "answer", "retrieved_ids"]).to_pylist(), key=lambda r: r["id"])
            for s in ("direct", "rag")}


def test_engine_actors_answer_every_question_once_with_the_rows_one_engine_gives(ray_session, tmp_path):
    ray = ray_session
    write_questions(tmp_path / "q.parquet", 90)
    runs = {}
    for actors in (1, 3):
        config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / f"out{actors}"),
                              strategies=["direct", "rag"], commit={"shard_rows": 20},
                              engine={"window": 16, "actors": actors, "actor_cpus": 0})
        metrics = answer(config, log=lambda *_: None, stages=stub_stages(ray))
        assert all(c["ok"] for c in metrics["exactly_once"].values())
        runs[actors] = (read(tmp_path / f"out{actors}"), metrics)
    assert runs[3][0] == runs[1][0]  # the same rows, each id once per strategy
    split = runs[3][1]
    assert split["roots_done"] == 180 and len(split["engines"]) == 3
    # every engine answered its every third question, every input shard (of 20 rows) was shared
    assert [e["roots_done"] for e in split["engines"]] == [60, 60, 60]
    assert split["stages"]["generator"]["requests"] == runs[1][1]["stages"]["generator"]["requests"]
    assert split["resolved_by"] == runs[1][1]["resolved_by"]


def test_a_rerun_with_engine_actors_answers_only_what_is_not_committed(ray_session, tmp_path):
    ray = ray_session
    write_questions(tmp_path / "q.parquet", 60)
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"),
                          strategies=["direct", "rag"], commit={"shard_rows": 20},
                          engine={"actors": 2, "actor_cpus": 0})
    answer(config, log=lambda *_: None, stages=stub_stages(ray))
    before = read(tmp_path / "out")
    for strategy in ("direct", "rag"):  # as if the run had stopped before its last shard was committed
        (tmp_path / "out" / strategy / "part-00002.parquet").unlink()
        (tmp_path / "out" / strategy / "_part-00002.parquet.sha256").unlink()
    metrics = answer(config, log=lambda *_: None, stages=stub_stages(ray))
    assert metrics["shards_resumed"] == 2 and metrics["roots_done"] == 40
    assert read(tmp_path / "out") == before


def test_each_engine_gets_its_share_of_an_async_replicas_token_budget():
    class Replica:  # not called: the stage only needs to know how many replicas there are
        pass

    stage = StreamingGeneratorStage([Replica()], LLMBatching(), "generator")
    stage.share = 0.25
    stage.ready(0, 1000)  # a KV cache of 1,000 tokens: 2,000 in flight for one engine, 500 for each of four
    assert stage.budget == [500]


def test_what_an_engine_actor_logs_reaches_the_jobs_log(ray_session, tmp_path):
    """A replica that dies is said at once (the engine's log); with engine actors the job's log still says it."""
    from tests.engine.fakes import FakeGenerator

    class DiesOnce(FakeGenerator):
        def generate(self, batch):
            import os
            marker = tmp_path / "died"
            if not marker.exists():
                marker.touch()
                os._exit(1)
            return super().generate(batch)

    ray = ray_session
    write_questions(tmp_path / "q.parquet", 20)
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"],
                          engine={"actors": 2, "actor_cpus": 0, "failure_cooldown_s": 0.1})
    stages = {"generator": GeneratorStage([ray.remote(DiesOnce).options(num_cpus=0, max_restarts=-1).remote()],
                                          StageBatching(max_batch=8))}
    lines = []
    metrics = answer(config, log=lines.append, stages=stages)
    assert all(c["ok"] for c in metrics["exactly_once"].values()) and metrics["batch_failures"] >= 1
    assert any(line.startswith("engine ") and "generator" in line for line in lines), lines


def test_a_stage_down_inside_an_engine_actor_reaches_the_job_as_itself_not_wrapped_in_rays_traceback(ray_session, tmp_path):
    from schemas.errors import StageDown

    class AlwaysRaises(FakeGenerator):
        def generate(self, batch):
            raise ValueError("the server rejects this schema")

    ray = ray_session
    write_questions(tmp_path / "q.parquet", 40)
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"],
                          engine={"actors": 2, "actor_cpus": 0, "failure_cooldown_s": 0.01, "fail_fast_after": 4})
    stages = {"generator": GeneratorStage([ray.remote(AlwaysRaises).options(num_cpus=0).remote()],
                                          StageBatching(max_batch=8))}
    with pytest.raises(StageDown) as raised:
        answer(config, log=lambda *_: None, stages=stages)
    assert type(raised.value) is StageDown and "\n" not in str(raised.value)
    assert "the server rejects this schema" in str(raised.value)


def test_a_cache_handed_to_engine_actors_is_shared_on_disk_by_a_sweeps_values(ray_session, tmp_path):
    """A sweep's values (a Session's calls) pass one cache; with engine.actors > 1 it was ignored: each
    value computed every request again and the cache file was never made."""
    import sqlite3

    from engine.cache import RequestCache

    ray = ray_session
    write_questions(tmp_path / "q.parquet", 20)
    db = tmp_path / "requests.sqlite"
    cache = RequestCache(1000, db, {"generator": "g", "judge": "g", "retriever": "r"})  # as sweep / Session open it
    stages = stub_stages(ray)
    computed = []
    for value in (1, 2):
        config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / f"out{value}"),
                              strategies=["direct", "rag"], engine={"actors": 2, "actor_cpus": 0})
        metrics = answer(config, log=lambda *_: None, stages=stages, cache=cache)
        computed.append(metrics["tokens_computed"])
        assert metrics["request_cache"]["path"] == str(db)
    assert computed[0] > 0 and computed[1] == 0
    assert sqlite3.connect(db).execute("SELECT count(*) FROM responses").fetchone()[0] == 60


def test_engine_actors_keep_the_disk_cache_under_its_bound_as_they_write_and_say_how_many_went(ray_session, tmp_path):
    """They opened the file without its bound and never pruned: a long run wrote gigabytes past cache.max_mb."""
    import sqlite3

    from engine.cache import RequestCache

    write_questions(tmp_path / "q.parquet", 20)
    db = tmp_path / "requests.sqlite"
    cache = RequestCache(1000, db, {"generator": "g", "judge": "g", "retriever": "r"}, max_bytes=8 * 2**10)
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"),
                          strategies=["direct", "rag"], engine={"actors": 2, "actor_cpus": 0})
    metrics = answer(config, log=lambda *_: None, stages=stub_stages(ray_session), cache=cache)
    kept = sqlite3.connect(db).execute("SELECT count(*) FROM responses").fetchone()[0]
    assert metrics["request_cache"]["pruned"] > 0 and kept < 60  # 60 responses computed


def test_the_merged_metrics_of_engine_actors_keep_what_one_engines_metrics_say():
    """Before, hits by kind, hits per stage, the cache's path, the prefix-cache hit rate and the replicas'
    vLLM counters were only under `engines`."""
    from jobs.engine_actors import merge_metrics

    def part(memory, disk, prompt, cached, biggest, pruned=0, unsaved=0):
        stage = {"calls": 2, "requests": 8, "errors": 0, "rests": 0, "busy_s": 1.0,
                 "batch_size": {"mean": 4.0, "p50": 4, "p90": biggest, "max": biggest},
                 "driver_bytes_in": {"total": 10, "by_reference": 0, "per_request": 1.2},
                 "prefix_cache_hit_rate": round(cached / prompt, 4), "prompt_tokens": prompt, "cached_tokens": cached,
                 "vllm": {"kv_cache_usage": 0.5}}
        return {"roots_done": 4, "tokens_computed": 100, "requests_deduped": 0, "batch_failures": 0, "batch_splits": 0,
                "stage_tests": 0, "empty_answers": 0, "trees_capped": 0, "parse_failures": 0, "peak_roots_in_flight": 4,
                "replica_restarts": 0, "stages": {"generator": stage}, "resolved_by": {"rag": {"retrieval": 4}},
                "request_cache": {"path": "/c.sqlite", "disk_error": None, "undecodable": 0, "lookups": 8, "pruned": pruned,
                                  "unsaved": unsaved,
                                  "hits": {"memory": memory, "disk": disk},
                                  "by_stage": {"generator": {"lookups": 8, "memory": memory, "disk": disk}}}}

    early, late = part(1, 2, 100, 50, 5, pruned=7, unsaved=2), part(3, 0, 300, 30, 6, pruned=3)
    late["stages"]["generator"]["vllm"] = {"kv_cache_usage": 0.9}  # read by the engine that finished last
    merged = merge_metrics([early, late], wall_s=2.0, first_row_s=0.5, last=1)
    cache = merged["request_cache"]
    assert cache["path"] == "/c.sqlite" and cache["hits"] == {"memory": 4, "disk": 2} and cache["hit_rate"] == 0.375
    assert cache["by_stage"] == {"generator": {"lookups": 16, "memory": 4, "disk": 2}}
    assert cache["pruned"] == 10 and cache["unsaved"] == 2  # what each engine pruned as it wrote, or could not write
    generator = merged["stages"]["generator"]
    assert generator["prefix_cache_hit_rate"] == 0.2 and generator["batch_size"]["max"] == 6
    # one replica, busy 1 s in each engine's eyes: not 2 s of a 2 s run (busy while either had a batch on it)
    assert generator["busy_s"] == 1.0 and generator["requests"] == 16
    assert generator["vllm"] == {"kv_cache_usage": 0.9}


class DiesAtOnce(EngineActor):
    """The first engine actor to start answering dies, as one the OOM killer ends."""

    def run(self, read, nth, strategy_names, todo):
        if nth[0] == 0:
            import os

            os._exit(1)
        yield from super().run(read, nth, strategy_names, todo)


def test_an_engine_actor_that_dies_is_named_and_the_rerun_answers_the_rest_once(ray_session, tmp_path, monkeypatch):
    """Before, Ray's ActorDiedError (a screenful naming neither the engine nor what a rerun does)."""
    import jobs.engine_actors

    ray = ray_session
    write_questions(tmp_path / "q.parquet", 30)
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"),
                          strategies=["direct", "rag"], commit={"shard_rows": 10},
                          engine={"actors": 2, "actor_cpus": 0})
    monkeypatch.setattr(jobs.engine_actors, "EngineActor", DiesAtOnce)
    from schemas.errors import StageDown

    # StageDown: the CLI's one line, exit 2 (a RuntimeError of its own printed Ray's traceback)
    with pytest.raises(StageDown, match=r"^engine actor 0 of 2 died \(.*exit.*\); the parts committed so far are kept"):
        answer(config, log=lambda *_: None, stages=stub_stages(ray))
    monkeypatch.undo()
    metrics = answer(config, log=lambda *_: None, stages=stub_stages(ray))
    assert all(c["ok"] for c in metrics["exactly_once"].values())
    assert [len(rows) for rows in read(tmp_path / "out").values()] == [30, 30]
