"""Index build and sharded search with the real MiniLM embedder on a slice of the sample corpus."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from actors.encoder import Encoder
from actors.retriever import ShardRetriever, merge_topk
from jobs.index import IndexJobConfig, build_index
from schemas.config import load_config
from tests.conftest import SAMPLE_CORPUS, SAMPLE_QUESTIONS

pytestmark = [pytest.mark.ray, pytest.mark.model, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def squad_slice(tmp_path_factory):
    """300 real passages that include the gold passages of the sample's SQuAD questions."""
    questions = pq.read_table(SAMPLE_QUESTIONS)
    squad = questions.filter(pc.equal(questions["dataset"], "squad")).to_pylist()
    gold = {g for q in squad for g in q["gold_passage_ids"]}
    corpus = pq.read_table(SAMPLE_CORPUS)
    is_gold = pc.is_in(corpus["id"], pa.array(sorted(gold)))
    table = pa.concat_tables([corpus.filter(is_gold), corpus.filter(pc.invert(is_gold)).slice(0, 300 - len(gold))])
    path = tmp_path_factory.mktemp("corpus") / "corpus.parquet"
    pq.write_table(table, path)
    return path, squad


def _build(ray_session, corpus, out, shards):
    config = load_config(IndexJobConfig, None, [f"index.path={out}", f"index.shards={shards}",
                                                "index.encode_batch_rows=64"], corpus=str(corpus))
    return build_index(config, log=lambda *a, **k: None)


def test_sharded_search_equals_one_index(ray_session, squad_slice, tmp_path):
    corpus, squad = squad_slice
    one = _build(ray_session, corpus, tmp_path / "one", 1)
    three = _build(ray_session, corpus, tmp_path / "three", 3)
    assert one["count"] == three["count"] == 300
    assert [s["count"] for s in three["shards"]] == [100, 100, 100]
    assert json.loads((tmp_path / "three" / "manifest.json").read_text())["dims"] == 384

    queries = Encoder("all-minilm-l6-v2").encode([q["question"] for q in squad])
    single = ShardRetriever(str(tmp_path / "one" / "shard-000")).search(queries, 10)
    shards = [ShardRetriever(str(tmp_path / "three" / s["dir"])) for s in three["shards"]]
    merged = merge_topk([s.search(queries, 10) for s in shards], 10)
    for a, b in zip(single, merged):
        assert [p.id for p in a] == [p.id for p in b]
        np.testing.assert_allclose([p.score for p in a], [p.score for p in b], rtol=1e-5)

    # the SQuAD questions are easy for dense retrieval over 300 passages
    hits = [bool(set(q["gold_passage_ids"]) & {p.id for p in res[:5]}) for q, res in zip(squad, merged)]
    assert sum(hits) / len(hits) >= 0.8


def test_bad_corpus_rows_are_skipped_and_counted(ray_session, tmp_path):
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "a", None, "c"], "title": ["A", None, "A2", "N", "C"],
                             "text": ["alpha text", "beta text", "dup", "no id", None]}), corpus)
    manifest = _build(ray_session, corpus, tmp_path / "idx", 2)
    assert manifest["count"] == 2
    assert manifest["skipped"] == {"null_text": 1, "null_id": 1, "duplicate_id": 1}
    ids = [r for s in manifest["shards"] for r in
           pq.read_table(tmp_path / "idx" / s["dir"] / "passages.parquet")["id"].to_pylist()]
    assert ids == ["a", "b"]


def test_corpus_without_text_column_is_a_clear_error(tmp_path):
    from schemas.tables import SchemaError

    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a"], "body": ["x"]}), corpus)
    config = load_config(IndexJobConfig, None, [f"index.path={tmp_path / 'i'}"], corpus=str(corpus))
    with pytest.raises(SchemaError, match=r"c\.parquet.*'text'"):
        build_index(config)
