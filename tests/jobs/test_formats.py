"""Other tools' files read as they are: FlashRAG's dataset and corpus JSON Lines, CSV questions and
corpora; bad files are clear errors."""

import json
import re

import pyarrow.parquet as pq
import pytest

from jobs.formats import read
from jobs.question_sources import materialize_questions
from jobs.questions import plan_input
from schemas.errors import UserError

pytestmark = pytest.mark.timeout(120)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_flashrag_dataset_file_becomes_a_question_file_with_gold_answers(tmp_path):
    source = write_jsonl(tmp_path / "nq_dev.jsonl", [
        {"id": "dev_0", "question": "who wrote hamlet", "golden_answers": ["Shakespeare", "William Shakespeare"],
         "metadata": {"source": "nq"}},
        {"id": "dev_1", "question": "capital of france", "golden_answers": ["Paris"], "metadata": {"source": "nq"}}])
    converted = materialize_questions(source, str(tmp_path / "out"), {}, None)
    table = pq.read_table(converted)
    assert re.search(r"_input/questions-[0-9a-f]{16}\.parquet$", converted) and plan_input(converted).rows == 2
    assert table["id"].to_pylist() == ["dev_0", "dev_1"]
    assert table["answers"].to_pylist() == [["Shakespeare", "William Shakespeare"], ["Paris"]]


def test_csv_questions_with_integer_ids_and_several_answers_in_a_cell(tmp_path):
    (tmp_path / "q.csv").write_text('id,query,answers\n1,who wrote hamlet,Shakespeare|William Shakespeare\n'
                                    '2,"capital of france, today",Paris\n')
    converted = materialize_questions(str(tmp_path / "q.csv"), str(tmp_path / "out"), {"question": "query"}, None)
    rows = pq.read_table(converted).to_pylist()
    assert [(r["id"], r["question"], r["answers"]) for r in rows] == [
        ("1", "who wrote hamlet", ["Shakespeare", "William Shakespeare"]),
        ("2", "capital of france, today", ["Paris"])]


def test_a_flashrag_corpus_splits_contents_into_title_and_text(tmp_path):
    from jobs.index import corpus_parquet

    source = write_jsonl(tmp_path / "wiki.jsonl", [
        {"id": "0", "contents": '"Hamlet"\nHamlet is a tragedy by William Shakespeare.'},
        {"id": "1", "contents": "A passage without a title line."}])
    lines = []
    converted = corpus_parquet(source, tmp_path / "idx", lines.append)
    assert converted == str(tmp_path / "idx" / "_corpus.parquet") and "2 rows converted" in lines[0]
    assert pq.read_table(converted).to_pylist() == [
        {"id": "0", "text": "Hamlet is a tragedy by William Shakespeare.", "title": "Hamlet"},
        {"id": "1", "text": "A passage without a title line.", "title": ""}]
    assert corpus_parquet(str(tmp_path / "c.parquet"), tmp_path / "idx", lines.append).endswith("c.parquet")


def test_a_jsonl_corpus_is_indexed_like_parquet(ray_session, tmp_path):
    import ray

    from actors.bm25 import BM25Shard
    from jobs.index import IndexJobConfig, build_index
    from schemas.config import load_config
    from tests.jobs.test_index import HashEncoder

    source = write_jsonl(tmp_path / "corpus.jsonl", [{"id": f"p{i}", "title": f"T{i}", "text": f"passage {w}"}
                                                      for i, w in enumerate(["alpha", "beta", "gamma", "delta"])])
    config = load_config(IndexJobConfig, None, [f"index.path={tmp_path / 'idx'}", "index.shards=2"], corpus=source)
    manifest = build_index(config, log=lambda *a, **k: None,
                           encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["count"] == 4 and manifest["corpus"] == source
    assert BM25Shard(str(tmp_path / "idx" / "shard-001")).search(["gamma"], 1)[0][0].id == "p2"


@pytest.mark.parametrize("content, message", [
    ('{"id": "a", "question": "q"}\n{"id": ', "not readable as JSONL"),
    ("", "Empty JSON stream"),
])
def test_a_broken_corpus_file_is_a_clear_error(tmp_path, content, message):
    from jobs.index import corpus_parquet

    (tmp_path / "c.jsonl").write_text(content)
    with pytest.raises(UserError, match=message):
        corpus_parquet(str(tmp_path / "c.jsonl"), tmp_path / "idx", print)


def test_a_corpus_without_text_names_the_missing_column(tmp_path):
    from jobs.index import corpus_parquet

    write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "body": "x"}])
    with pytest.raises(UserError, match=r"no column \['text'\]"):
        corpus_parquet(str(tmp_path / "c.jsonl"), tmp_path / "idx", print)
    assert read(write_jsonl(tmp_path / "q.jsonl", [{"id": 7, "question": "q"}]))["id"].to_pylist() == ["7"]
