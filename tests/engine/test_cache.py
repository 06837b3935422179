"""The request cache: in memory within a run, in SQLite across runs, keyed on the request and its pool."""

import sqlite3
import time

import pytest

from engine.cache import RequestCache
from engine.loop import Engine
from engine.stages import GeneratorStage, RetrieverStage, StreamingGeneratorStage
from schemas.config import EngineConfig, LLMBatching, StageBatching
from schemas.records import (
    Entail,
    Entailment,
    Generate,
    Generation,
    Judge,
    Judgment,
    Passage,
    Question,
    Rank,
    Ranking,
    Retrieval,
    Retrieve,
)
from strategies.base import StrategySettings
from strategies.registry import STRATEGIES
from tests.engine.fakes import CountingGenerator, FakeEncoder, FakeShard

NAMESPACES = {"generator": "model-a", "judge": "model-a", "retriever": "index-1", "ranker": "r", "nli": "n"}
PAIRS = [
    (Generate((("user", "q"),), max_tokens=8), Generation("an answer", 12, 3, cached_tokens=4, finish_reason="length")),
    (Judge((("user", "ok?"),)), Judgment("yes", {"yes": 0.8, "no": 0.2}, 9, 1)),
    (Retrieve("who", 2), Retrieval([Passage("p1", "T", "text", 0.5), Passage("p2", "U", "more", 0.25)])),
    (Rank("q", ("a", "b"), 1), Ranking([1], [0.9])),
    (Entail("premise", "hypothesis"), Entailment(0.75)),
]


def test_every_response_kind_comes_back_from_disk_in_a_new_process_as_it_went_in(tmp_path):
    first = RequestCache(100, tmp_path / "c.sqlite", NAMESPACES)
    for request, response in PAIRS:
        first.put(request, response)
    first.flush()
    later = RequestCache(100, tmp_path / "c.sqlite", NAMESPACES)  # what a rerun opens
    for request, response in PAIRS:
        assert later.get(request) == (response, "disk")
        assert later.get(request) == (response, "memory")  # then remembered for the rest of the run


def test_a_lone_surrogate_in_a_request_or_a_response_is_stored_and_read_back_not_a_dead_run(tmp_path):
    """Before, its key raised UnicodeEncodeError (a run's every lookup of it) and so did SQLite's write of the
    response, at every flush and at the last one: the run died and lost the buffered responses."""
    broken = "half an emoji \ud83d"
    first = RequestCache(100, tmp_path / "c.sqlite", NAMESPACES)
    assert first.get(Retrieve(broken, 3)) == (None, None)
    request, response = Generate((("user", broken),)), Generation(f"said {broken}", 3, 2)
    first.put(request, response)
    first.put(*PAIRS[0])
    first.flush()
    assert first.disk_error is None
    later = RequestCache(100, tmp_path / "c.sqlite", NAMESPACES)
    assert later.get(request) == (response, "disk") and later.get(PAIRS[0][0]) == (PAIRS[0][1], "disk")


def test_a_response_is_found_only_under_the_same_pool_and_request_and_never_an_error(tmp_path):
    path = tmp_path / "c.sqlite"
    cache = RequestCache(0, path, NAMESPACES)  # size 0: every lookup goes to disk
    request = Generate((("user", "q"),), max_tokens=8)
    cache.put(request, Generation("a", 1, 1))
    cache.put(Generate((("user", "broken"),)), Generation("", error="generator failed 3 times"))
    cache.flush()
    assert cache.get(Generate((("user", "q"),), max_tokens=8, step="another step"))[0] == Generation("a", 1, 1)
    assert cache.get(Generate((("user", "q"),), max_tokens=9)) == (None, None)  # another request
    assert cache.get(Generate((("user", "broken"),))) == (None, None)
    other_model = RequestCache(0, path, {**NAMESPACES, "generator": "model-b"})
    assert other_model.get(request) == (None, None)
    assert sqlite3.connect(path).execute("SELECT count(*) FROM responses").fetchone() == (1,)


def test_a_response_reaches_disk_within_seconds_even_when_responses_come_slowly(tmp_path, monkeypatch):
    """Before, responses were written 256 at a time only: a slow model's hours of work sat in memory,
    lost to a driver killed without cleanup."""
    clock = [1000.0]
    monkeypatch.setattr("engine.cache.time.monotonic", lambda: clock[0])
    cache = RequestCache(100, tmp_path / "c.sqlite", NAMESPACES)
    (first, answer), (second, judgment) = PAIRS[:2]
    cache.put(first, answer)
    clock[0] += 11  # the next response comes 11 s later: both are written with it, no flush() called
    cache.put(second, judgment)
    rerun = RequestCache(100, tmp_path / "c.sqlite", NAMESPACES)
    assert rerun.get(first) == (answer, "disk") and rerun.get(second) == (judgment, "disk")
    (third, retrieval) = PAIRS[2]
    cache.put(third, retrieval)  # the tail of a batch, with nothing after it: the engine's loop asks
    clock[0] += 11
    cache.flush_if_due()
    assert RequestCache(100, tmp_path / "c.sqlite", NAMESPACES).get(third) == (retrieval, "disk")


def test_without_a_path_it_is_a_bounded_memory_cache_that_writes_nothing(tmp_path):
    cache = RequestCache(2)
    for i in range(3):
        cache.put(Generate((("user", str(i)),)), Generation(str(i)))
    assert len(cache) == 2 and cache.get(Generate((("user", "0"),))) == (None, None)
    assert cache.get(Generate((("user", "2"),)))[1] == "memory"
    assert not list(tmp_path.iterdir())


def test_the_memory_part_is_bounded_in_bytes_as_well_as_in_entries_the_oldest_going_first():
    """Bounded in entries only: 100,000 retrievals of 50 passages held ~4.4 GB in the driver and in each engine actor."""
    from jobs.request_cache import open_cache
    from strategies.registry import AnswerConfig

    cache = open_cache(AnswerConfig(engine={"cache_mb": 1}, cache={"enabled": False}))
    for i in range(100):
        cache.put(Retrieve(f"q{i}", 50), Retrieval([Passage(f"{i}-{j}", "T", "x" * 600, 0.5) for j in range(50)]))
    assert 10 < len(cache) < 100 and 30_000 * len(cache) < cache.held <= 2**20  # each holds 50 x 600 chars at least
    assert cache.get(Retrieve("q99", 50))[1] == "memory" and cache.get(Retrieve("q0", 50)) == (None, None)
    for i in range(200):  # direct's short answers: all remembered, as before
        cache.put(Generate((("user", f"q{i}"),)), Generation("an answer", 1, 1))
    assert all(cache.get(Generate((("user", f"q{i}"),)))[1] == "memory" for i in range(200))
    from jobs.engine_actors import EngineActor

    config = EngineConfig(cache_mb=1)  # the caches an engine and an engine actor make themselves
    assert Engine({}, {}, config, print).cache.memory_bytes == EngineActor({}, {}, config, 1.0).engine.cache.memory_bytes == 2**20


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_a_second_run_on_the_same_disk_cache_computes_nothing_and_says_so(ray_session, tmp_path):
    ray = ray_session
    questions = [Question(f"q{i}", f"question {i}") for i in range(10)]

    def run(generator=CountingGenerator, streaming=False):
        gen = ray.remote(generator).options(num_cpus=0).remote()
        enc = [ray.remote(FakeEncoder).options(num_cpus=0).remote()]
        shards = [ray.remote(FakeShard).options(num_cpus=0).remote(n) for n in ("a", "b")]
        stages = {"generator": (StreamingGeneratorStage if streaming else GeneratorStage)([gen], LLMBatching()),
                  "retriever": RetrieverStage(enc, shards, StageBatching())}
        rows = []
        engine = Engine(stages, {"rag": STRATEGIES["rag"](StrategySettings(k=3))}, EngineConfig(), rows.append,
                        cache=RequestCache(1000, tmp_path / "c.sqlite", NAMESPACES))
        engine.run(questions, ["rag"])
        return (None if streaming else ray.get(gen.count.remote())), engine.metrics(), \
            sorted((r["id"], r["answer"]) for r in rows)

    calls, first, answers = run()
    assert calls == 10 and first["request_cache"]["hits"] == {"memory": 0, "disk": 0}
    calls, second, again = run()
    assert calls == 0 and again == answers and second["tokens_computed"] == 0
    assert second["request_cache"]["lookups"] == 20 and second["request_cache"]["hits"] == {"memory": 0, "disk": 20}
    assert second["request_cache"]["by_stage"]["retriever"] == {"lookups": 10, "memory": 0, "disk": 10}
    # a run that needs nothing more ends while its replica is still starting (it would wait an hour here)
    _, third, again = run(NeverReady, streaming=True)
    assert again == answers and third["request_cache"]["hit_rate"] == 1.0


class NeverReady:
    """An async replica still starting: it never says its KV capacity."""

    def kv_capacity(self):
        time.sleep(3600)


def test_a_cache_folder_that_cannot_be_made_costs_the_disk_part_not_the_run(tmp_path):
    """Before, a cache path under a file (or an unwritable $RAGSIFT_HOME) raised FileExistsError out of the
    engine and ended the run."""
    (request, response), (other, other_response) = PAIRS[:2]
    (tmp_path / "a-file").write_text("not a folder")
    cache = RequestCache(10, tmp_path / "a-file" / "requests.sqlite", NAMESPACES)
    assert cache.get(request) == (None, None) and "a-file" in cache.disk_error
    cache.put(request, response)
    cache.flush()
    assert cache.get(request) == (response, "memory")
    late = RequestCache(10, tmp_path / "a-file" / "requests.sqlite", NAMESPACES)
    late.put(other, other_response)  # the first touch of the disk is a write
    late.flush()
    assert "a-file" in late.disk_error and late.get(other) == (other_response, "memory")


def test_a_cache_in_a_folder_the_run_cannot_write_is_read_and_left_as_it_is(tmp_path, monkeypatch):
    """A home an admin prepared on a read-only mount: the run gave up the cache ("unable to open database file
    (delete the file, ...)") and found none of the responses it held."""
    import os

    from engine import cache as cache_module

    path = tmp_path / "shared" / "requests.sqlite"
    (request, response), (other, other_response) = PAIRS[:2]
    written = RequestCache(0, path, NAMESPACES)
    written.put(request, response)
    written.flush()
    written.db.close()
    before = path.read_bytes()
    real = os.access
    monkeypatch.setattr(cache_module.os, "access",  # a read-only mount, which root's permissions do not bypass
                        lambda p, mode: False if mode == os.W_OK and str(p) == str(path.parent) else real(p, mode))
    assert RequestCache(0, path, NAMESPACES).prune(1) == 0 and path.read_bytes() == before  # a run prunes first
    cache = RequestCache(0, path, NAMESPACES)
    assert cache.get(request) == (response, "disk") and cache.read_only and cache.disk_error is None
    cache.put(other, other_response)
    cache.flush()
    assert cache.disk_error is None and not cache.pending and cache.prune(1) == 0
    assert path.read_bytes() == before


def test_a_full_disk_gives_up_the_cache_without_advising_to_delete_it_and_a_damaged_file_with(tmp_path):
    """"database or disk is full (delete the file, ...)": deleting a whole cache does not free a full disk."""
    full = RequestCache(0, tmp_path / "c.sqlite", NAMESPACES)
    full._give_up_disk(sqlite3.OperationalError("database or disk is full"))
    assert "the file is kept" in full.disk_error and "delete" not in full.disk_error
    damaged = RequestCache(0, tmp_path / "d.sqlite", NAMESPACES)
    damaged._give_up_disk(sqlite3.DatabaseError("file is not a database"))
    assert "delete the file" in damaged.disk_error


def test_a_row_another_version_wrote_or_a_damaged_file_is_a_miss_not_a_failed_run(tmp_path):
    path = tmp_path / "c.sqlite"
    (request, response), (other, other_response) = PAIRS[:2]
    cache = RequestCache(0, path, NAMESPACES)
    cache.put(request, response)
    cache.put(other, other_response)
    cache.flush()
    db = sqlite3.connect(path)
    newer = '["Generation", {"text": "x", "prompt_tokens": 1, "reasoning_tokens": 3}]'  # a field this version lacks
    db.execute("UPDATE responses SET response = ? WHERE key = ?", (newer, cache.key(request)))
    db.execute("UPDATE responses SET response = ? WHERE key = ?", ('["Judgment", {"lab', cache.key(other)))
    db.commit()
    assert cache.get(request) == (None, None) and cache.get(other) == (None, None)
    assert cache.undecodable == 2 and cache.disk_error is None
    cache.put(request, response)  # computed again: the row is replaced
    cache.flush()
    assert RequestCache(0, path, NAMESPACES).get(request) == (response, "disk")

    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(b"not a database" * 100)
    cache = RequestCache(10, damaged, NAMESPACES)
    assert cache.get(request) == (None, None) and "damaged.sqlite" in cache.disk_error
    cache.put(request, response)
    cache.flush()  # nothing written, nothing raised; the run keeps its memory part
    assert cache.get(request) == (response, "memory")

    # a lock another writer holds past the busy timeout is a miss and a later write, not the end of the disk part
    shared = RequestCache(0, path, NAMESPACES)
    shared.db.execute("PRAGMA busy_timeout = 0")
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")
    shared.put(other, other_response)
    shared.flush()
    assert shared.disk_error is None and shared.pending
    holder.rollback()
    shared.flush()
    assert not shared.pending and RequestCache(0, path, NAMESPACES).get(other) == (other_response, "disk")


def test_a_locked_cache_file_is_written_again_after_doubling_pauses_not_at_every_put_and_holds_bounded_bytes(
        tmp_path, monkeypatch):
    """A write the lock refused kept its rows, and every later put (256 and more waiting) wrote again, each waiting
    SQLite's busy timeout (60 s): a minute of the driver per response while another process held the file."""
    import engine.cache as cache_module

    clock = [1000.0]
    monkeypatch.setattr("engine.cache.time.monotonic", lambda: clock[0])
    monkeypatch.setattr(cache_module, "PENDING_MAX_BYTES", 100_000)
    tries = []
    monkeypatch.setattr(cache_module, "locked", lambda err, real=cache_module.locked: tries.append(clock[0]) or real(err))
    path = tmp_path / "c.sqlite"
    cache = RequestCache(0, path, NAMESPACES)
    cache.db.execute("PRAGMA busy_timeout = 0")
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the file
    for i in range(1000):
        cache.put(Generate((("user", f"q{i}"),)), Generation(f"answer {i:04}", 1, 1))
    assert tries == [1000.0]  # the 256th put's write; none at the 744 puts after it
    for _ in range(200):  # the engine's loop asks every second
        clock[0] += 1
        cache.flush_if_due()
    assert [b - a for a, b in zip(tries, tries[1:])] == [10, 20, 40, 80]
    assert cache.pending_bytes <= 100_000 and cache.unsaved == 1000 - len(cache.pending) > 0  # the oldest dropped
    assert Engine({}, {}, EngineConfig(), print, cache=cache).cache_summary()["unsaved"] == 1000  # dropped or waiting
    holder.rollback()
    clock[0] += 160
    cache.flush_if_due()
    stored = sqlite3.connect(path).execute("SELECT count(*) FROM responses").fetchone()[0]
    assert stored == 1000 - cache.unsaved and not cache.pending and cache.retry_s == 0 and len(tries) == 5
    assert RequestCache(0, path, NAMESPACES).get(Generate((("user", "q999"),)))[0].text == "answer 0999"


def test_a_generation_cached_before_finish_reasons_were_kept_reads_back_with_none_known():
    from engine.cache import decode

    old = '["Generation", {"text": "an answer", "prompt_tokens": 12, "completion_tokens": 3, "error": null, "cached_tokens": 0}]'
    assert decode(old) == Generation("an answer", 12, 3) and decode(old).finish_reason is None


def test_a_cache_over_its_bound_loses_its_oldest_responses_when_a_run_opens_it_and_stops_growing(tmp_path):
    """Nothing was ever deleted: the file grew by every response any run computed (0.5 MB per 100 questions
    of direct + rag)."""
    path = tmp_path / "c.sqlite"
    cache = RequestCache(10, path, NAMESPACES)
    for i in range(2000):
        cache.put(Generate((("user", f"q{i}"),)), Generation("x" * 500, 1, 1))
    cache.flush()
    cache.db.close()
    full = path.stat().st_size
    reopened = RequestCache(10, path, NAMESPACES)
    assert reopened.prune(10 * full) == 0  # under its bound: nothing goes
    dropped = reopened.prune(full // 2)
    assert 1000 <= dropped < 2000 and reopened.pruned == dropped
    kept = [i for i in range(2000) if RequestCache(0, path, NAMESPACES).get(Generate((("user", f"q{i}"),)))[0]]
    assert kept == list(range(dropped, 2000))  # the oldest went
    for i in range(2000, 2000 + dropped // 2):  # what the next responses fill is the space freed
        reopened.put(Generate((("user", f"q{i}"),)), Generation("x" * 500, 1, 1))
    reopened.flush()
    reopened.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert path.stat().st_size <= full


def test_a_run_keeps_its_disk_cache_under_its_bound_as_it_writes_not_only_when_it_opens_it(tmp_path):
    """Pruned only at open: a run of a million questions wrote ~5 GB past cache.max_mb onto the disk its output
    shares."""
    path = tmp_path / "c.sqlite"
    bound = 256 * 2**10
    cache = RequestCache(10, path, NAMESPACES, max_bytes=bound)
    for i in range(4000):  # ~2.4 MB of responses
        cache.put(Generate((("user", f"q{i}"),)), Generation("x" * 500, 1, 1))
    cache.flush()
    pages, free, size = (cache.db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                                 "page_size"))
    assert (pages - free) * size <= bound
    kept = cache.db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    assert cache.pruned == 4000 - kept > 0
    assert cache.get(Generate((("user", "q3999"),)))[0] and not RequestCache(0, path, NAMESPACES).get(
        Generate((("user", "q0"),)))[0]  # the oldest went


def test_a_run_opens_its_disk_cache_pruned_to_cache_max_mb_and_says_how_many_went(tmp_path):
    from jobs.request_cache import open_cache
    from strategies.registry import AnswerConfig

    path = tmp_path / "c.sqlite"
    config = AnswerConfig(cache={"path": str(path), "enabled": True, "max_mb": 1})
    cache = RequestCache(10, path, open_cache(config).namespaces)  # no bound: as a version that pruned only at open
    for i in range(4000):
        cache.put(Generate((("user", f"q{i}"),)), Generation("y" * 600, 1, 1))
    cache.flush()
    assert path.stat().st_size > 2**20
    assert open_cache(config).pruned > 0 and open_cache(config).pruned == 0  # once under 1 MiB, it stays there
    assert open_cache(AnswerConfig(cache={"path": str(path), "enabled": True, "max_mb": None})).pruned == 0



def test_large_responses_past_the_pending_bound_are_written_not_dropped_while_the_file_is_not_locked(tmp_path, monkeypatch):
    """Responses past PENDING_MAX_BYTES went unsaved at every put, locked or not (big retrievals filled 64 MiB
    before 256 responses), and the warning blamed another process's lock."""
    import engine.cache as cache_module

    monkeypatch.setattr(cache_module, "PENDING_MAX_BYTES", 10_000)
    path = tmp_path / "c.sqlite"
    cache = RequestCache(0, path, NAMESPACES)
    for i in range(100):  # 100 KB of responses, under WRITE_EVERY of them
        cache.put(Generate((("user", f"q{i}"),)), Generation("x" * 1000, 1, 1))
    assert cache.unsaved == 0 and cache.pending_bytes <= 10_000
    cache.flush()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM responses").fetchone()[0] == 100
