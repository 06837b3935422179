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
