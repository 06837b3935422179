"""A request cache file that cannot be read costs the run its disk cache, not its answers, and the run says so."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from engine.cache import RequestCache
from engine.stages import GeneratorStage
from jobs.answer import answer
from jobs.request_cache import namespaces
from schemas.config import StageBatching
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeGenerator

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def test_a_damaged_cache_file_is_said_in_the_log_and_the_questions_are_answered(ray_session, tmp_path):
    """It was said only in metrics.json's request_cache.disk_error: every later run lost its cache unnoticed."""
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["question a", "question b"]}), tmp_path / "q.parquet")
    damaged = tmp_path / "requests.sqlite"
    damaged.write_bytes(b"not a database" * 100)
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"])
    actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    lines = []
    metrics = answer(config, log=lambda *a, **k: lines.append(" ".join(map(str, a))),
                     stages={"generator": GeneratorStage([actor], StageBatching())},
                     cache=RequestCache(10, damaged, namespaces(config)))
    assert metrics["exactly_once"]["direct"]["ok"] and "requests.sqlite" in metrics["request_cache"]["disk_error"]
    assert [line for line in lines if line.startswith("warning: this run gave up its request cache on disk: ")
            and "delete the file" in line]


def test_responses_a_locked_cache_file_kept_from_disk_are_counted_and_said_in_the_log(ray_session, tmp_path):
    """A file another process held locked kept the run's responses off the disk silently."""
    import sqlite3

    pq.write_table(pa.table({"id": ["a", "b"], "question": ["question a", "question b"]}), tmp_path / "q.parquet")
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"])
    cache = RequestCache(10, tmp_path / "requests.sqlite", namespaces(config))
    cache.db.execute("PRAGMA busy_timeout = 0")
    holder = sqlite3.connect(tmp_path / "requests.sqlite")
    holder.execute("BEGIN EXCLUSIVE")  # held for the whole run
    actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    lines = []
    metrics = answer(config, log=lambda *a, **k: lines.append(" ".join(map(str, a))),
                     stages={"generator": GeneratorStage([actor], StageBatching())}, cache=cache)
    assert metrics["exactly_once"]["direct"]["ok"] and metrics["request_cache"]["unsaved"] == 2
    assert metrics["request_cache"]["disk_error"] is None
    assert [line for line in lines if line.startswith("warning: 2 responses of this run were not saved")]


def test_a_runs_recorded_config_leaves_the_cache_to_the_rerun(tmp_path, monkeypatch):
    """config.yaml recorded `cache: {enabled: true}`: rerun with `--config` under RAGSIFT_NO_CACHE=1, it read and
    wrote the cache all the same."""
    from jobs.answer import write_record
    from schemas.config import load_config

    (tmp_path / "out").mkdir()
    monkeypatch.setenv("RAGSIFT_NO_CACHE", "")
    write_record(AnswerConfig(questions="q.parquet", output=str(tmp_path / "out")), {})
    recorded = tmp_path / "out" / "config.yaml"
    assert "enabled" not in yaml.safe_load(recorded.read_text())["cache"]
    assert load_config(AnswerConfig, recorded).cache.enabled is True
    monkeypatch.setenv("RAGSIFT_NO_CACHE", "1")
    assert load_config(AnswerConfig, recorded).cache.enabled is False
    assert load_config(AnswerConfig, recorded, ["cache.enabled=true"]).cache.enabled is True  # said for this run


def test_each_run_on_a_shared_cache_counts_only_its_own_pruned_and_unsaved_responses(ray_session, tmp_path):
    """A Session's calls and a sweep's values share one cache: each run's metrics.json counted every response
    pruned or left unsaved since the cache was opened, and warned of the earlier runs' unsaved responses."""
    import sqlite3

    from engine.cache import encode
    from schemas.records import Generation

    path = tmp_path / "requests.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, stage TEXT, response TEXT, created REAL)")
    with db:
        db.executemany("INSERT INTO responses VALUES (?, ?, ?, ?)",
                       [(f"old{i}", "generator", encode(Generation("x" * 500, 1, 1)), i) for i in range(400)])
    db.close()
    config = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "out"), strategies=["direct"])
    cache = RequestCache(10, path, namespaces(config), max_bytes=100_000)
    opened = cache.prune(100_000)  # as open_cache does: the first run's
    cache.db.execute("PRAGMA busy_timeout = 0")
    actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    stages = {"generator": GeneratorStage([actor], StageBatching())}

    def run(n: int) -> dict:
        pq.write_table(pa.table({"id": [f"{n}a", f"{n}b"], "question": [f"question {n}a", f"question {n}b"]}),
                       tmp_path / f"q{n}.parquet")
        lines = []
        metrics = answer(config.model_copy(update={"questions": str(tmp_path / f"q{n}.parquet"),
                                                   "output": str(tmp_path / f"out{n}")}),
                         log=lambda *a, **k: lines.append(" ".join(map(str, a))), stages=stages, cache=cache)
        return {**metrics["request_cache"], "warned": [line for line in lines if line.startswith("warning: ")]}

    first = run(1)
    assert opened > 0 and first["pruned"] >= opened and first["unsaved"] == 0 and not first["warned"]
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # held for the next two runs
    second, third = run(2), run(3)
    assert second["pruned"] == third["pruned"] == 0
    assert second["unsaved"] == third["unsaved"] == 2  # the third's own, not the second's still waiting
    assert third["warned"] == ["warning: 2 responses of this run were not saved to the request cache on disk: another "
                               "process held its file locked (a rerun computes them again)"]
    holder.rollback()
