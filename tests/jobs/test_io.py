import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.io import AnswerWriter, question_rows
from schemas.tables import ANSWERS, SchemaError
from tests.conftest import SAMPLE_QUESTIONS


def test_streams_the_sample_with_limit():
    rows = list(question_rows(str(SAMPLE_QUESTIONS), batch_rows=16, limit=40))
    assert len(rows) == 40 and all(r.error is None for r in rows)
    assert len(list(question_rows(str(SAMPLE_QUESTIONS)))) == 200


def test_schema_errors_name_file_and_column(tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["q"]}), bad)
    with pytest.raises(SchemaError, match=r"bad\.parquet.*'question'"):
        list(question_rows(str(bad)))
    typed = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"id": [1], "question": ["q"]}), typed)
    with pytest.raises(SchemaError, match=r"typed\.parquet.*'id' has type int64"):
        list(question_rows(str(typed)))
    with pytest.raises(SchemaError, match="not found"):
        list(question_rows(str(tmp_path / "missing.parquet")))
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(SchemaError, match="not a readable Parquet"):
        list(question_rows(str(junk)))


def test_bad_rows_become_error_rows(tmp_path):
    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b", None, "d"], "question": ["ok?", "  ", "x", None]}), f)
    rows = list(question_rows(str(f)))
    assert [r.error for r in rows] == [None, "empty question", "null id", "empty question"]


def test_writer_one_file_per_strategy_with_metadata(tmp_path):
    w = AnswerWriter(str(tmp_path / "out"), {"config_sha256": "x"}, row_group=2)
    base = {n: None for n in ANSWERS.names}
    for i in range(5):
        w.write({**base, "id": str(i), "strategy": "rag" if i % 2 else "direct", "answer": "a",
                 "retrieved_ids": [], "retrieved_scores": [], "n_llm_calls": 1, "n_retrievals": 0,
                 "prompt_tokens": 1, "completion_tokens": 1, "latency_s": 0.1})
    paths = w.close()
    assert sorted(paths) == ["direct", "rag"]
    assert pq.read_table(paths["direct"]).num_rows == 3 and pq.read_table(paths["rag"]).num_rows == 2
    assert b"config_sha256" in pq.read_schema(paths["rag"]).metadata[b"ragsift"]
    assert not list((tmp_path / "out").glob("*.tmp"))
