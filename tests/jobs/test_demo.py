"""The demo reuses its index only when it was built from the embedded corpus with the same shard count."""

import json

import pytest

from jobs import demo
from jobs.index import FORMAT, MANIFEST


@pytest.fixture
def builds(monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "build_index", lambda config, log, extra: calls.append((config, extra)))
    return calls


def write_manifest(index_dir, **fields):
    index_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"format": FORMAT, "corpus_sha256": demo.corpus_sha256(), "shards": [{}, {}], **fields}
    (index_dir / MANIFEST).write_text(json.dumps(manifest))


def test_the_demo_builds_its_index_where_there_is_none(tmp_path, builds):
    demo.ensure_index(tmp_path / "idx", 2, log=lambda *a: None)
    [(config, extra)] = builds
    assert config.index.path == str(tmp_path / "idx") and config.index.shards == 2
    assert extra == {"corpus_sha256": demo.corpus_sha256()}


def test_the_demo_reuses_an_index_of_its_corpus_and_shard_count(tmp_path, builds):
    write_manifest(tmp_path / "idx")
    said = []
    demo.ensure_index(tmp_path / "idx", 2, log=said.append)
    assert builds == [] and said == [f"using the demo index at {tmp_path / 'idx'}"]


@pytest.mark.parametrize("fields, shards", [({"corpus_sha256": "0" * 64}, 2), ({}, 3), ({"format": FORMAT - 1}, 2)])
def test_the_demo_rebuilds_an_index_of_another_corpus_shard_count_or_format(tmp_path, builds, fields, shards):
    write_manifest(tmp_path / "idx", **fields)
    demo.ensure_index(tmp_path / "idx", shards, log=lambda *a: None)
    assert len(builds) == 1 and builds[0][0].index.shards == shards
