import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.questions import plan_input, question_columns, question_rows
from jobs.storage import redact
from schemas.errors import UserError
from schemas.tables import SchemaError
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


def test_columns_of_only_nulls_or_empty_lists_are_accepted(tmp_path):
    """pyarrow infers null / list<null> for them (e.g. a slice with no gold passages)."""
    path = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "Who?", "answers": ["x"], "gold_passage_ids": [],
                                          "kind": None}]), path)
    assert pq.read_schema(path).field("gold_passage_ids").type == pa.list_(pa.null())
    assert set(question_columns(str(path))) == {"answers", "gold_passage_ids", "kind"}
    assert [(q.id, q.kind, q.error) for q in question_rows(str(path))] == [("a", None, None)]


def test_bad_rows_become_error_rows(tmp_path):
    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b", None, "d"], "question": ["ok?", "  ", "x", None]}), f)
    rows = list(question_rows(str(f)))
    assert [r.error for r in rows] == [None, "empty question", "null id", "empty question"]


def test_each_bad_row_becomes_its_error_row_a_later_duplicate_is_dropped_and_the_rest_are_answered(tmp_path):
    f = tmp_path / "q.parquet"
    questions = pa.array([b"fine?", b"\xff\xfe bad utf8", b"tab\tand\x00nul\x07?", b"\x01\x02", b"x" * 5000,
                          b"dup first", b"dup second"], pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(pa.table({"id": ["a", "b", "c", "d", "e", "dup", "dup"], "question": questions}), f)
    plan = plan_input(str(f))
    assert plan.rows == 7 and plan.duplicate_rows == {6} and plan.answered == 6
    rows = list(question_rows(str(f), batch_rows=3, drop_rows=plan.duplicate_rows, max_chars=4096))
    assert [r.id for r in rows] == ["a", "b", "c", "d", "e", "dup"]
    assert [r.error for r in rows] == [None, "invalid UTF-8 in question", None, "empty question",
                                       "question too long (5000 chars > 4096)", None]
    assert rows[2].question == "tab\tandnul?" and rows[5].question == "dup first"


def test_a_real_id_equal_to_a_stand_in_is_kept_and_the_stand_in_changes(tmp_path):
    """Before, the real id "<row 2>" was dropped as a duplicate of row 2's stand-in: a row lost."""
    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "<row 2>", None], "question": ["x?", "y?", "z?"]}), f)
    plan = plan_input(str(f))
    assert plan.duplicate_rows == set()
    rows = list(question_rows(str(f), drop_rows=plan.duplicate_rows, null_id_prefix=plan.null_id_prefix))
    assert [(r.id, r.error) for r in rows] == [("a", None), ("<row 2>", None), ("<<row 2>", "null id")]


def test_a_binary_question_column_follows_the_invalid_utf8_row_policy(tmp_path):
    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "question": pa.array([b"fine?", b"\xff bad"], pa.binary())}), f)
    rows = list(question_rows(str(f), drop_rows=plan_input(str(f)).duplicate_rows))
    assert [(r.question, r.error) for r in rows] == [("fine?", None), ("", "invalid UTF-8 in question")]


def test_an_id_or_kind_that_is_not_utf8_becomes_that_rows_error_not_a_crash_of_the_plan(tmp_path):
    """A Parquet file is read as written: before, one such id raised UnicodeDecodeError from plan_input (a
    traceback, no row answered), one such kind from the answer form's check."""
    from jobs.questions import value_counts
    f = tmp_path / "q.parquet"
    text = lambda *values: pa.array(values, pa.binary()).cast(pa.string(), safe=False)  # noqa: E731
    pq.write_table(pa.table({"id": text(b"a", b"bad\xff", b"c"), "question": ["x?", "y?", "z?"],
                             "kind": text(b"yes-no", b"\xfe", None)}), f)
    plan = plan_input(str(f))
    assert plan.rows == 3 and plan.duplicate_rows == set()
    rows = list(question_rows(str(f), drop_rows=plan.duplicate_rows, null_id_prefix=plan.null_id_prefix))
    assert [(r.id, r.error, r.kind) for r in rows] == [
        ("a", None, "yes-no"), ("<row 1>", "invalid UTF-8 in id", None), ("c", None, None)]
    assert value_counts(str(f), "kind", 3) == {"yes-no": 1}


def test_shards_are_skipped_without_losing_rows(tmp_path):
    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(25)], "question": ["?"] * 25}), f, row_group_size=4)
    rows = list(question_rows(str(f), batch_rows=3, shard_rows=10, skip_shards=frozenset({1})))
    assert [r.id for r in rows] == [f"q{i}" for i in [*range(10), *range(20, 25)]]
    assert [r.shard for r in rows] == [0] * 10 + [2] * 5
    assert [r.id for r in question_rows(str(f), limit=12, shard_rows=10, skip_shards=frozenset({0}))] == ["q10", "q11"]


def test_credentials_never_leave_a_uri():
    assert redact("s3://AKIA:secret@bucket/q.parquet") == "s3://***@bucket/q.parquet"
    assert redact("/data/q.parquet") == "/data/q.parquet"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=4), st.sampled_from(["<row 0>", "<row 3>", "<<row 1>"])),
                          st.one_of(st.none(), st.binary(max_size=40))), max_size=30))
def test_any_rows_give_one_question_each_and_never_raise(tmp_path, rows):
    f = tmp_path / "q.parquet"
    questions = pa.array([q for _, q in rows], pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(pa.table({"id": pa.array([i for i, _ in rows], pa.string()), "question": questions}), f)
    plan = plan_input(str(f))
    out = list(question_rows(str(f), batch_rows=7, shard_rows=5, drop_rows=plan.duplicate_rows, max_chars=30,
                             null_id_prefix=plan.null_id_prefix))
    assert len(out) == plan.answered and len({q.id for q in out}) == len(out)
    real = [i for i, _ in rows if i is not None]
    assert plan.answered == len(set(real)) + sum(i is None for i, _ in rows)  # only real repeats are dropped
    for q in out:
        if q.error is None:
            assert q.question.strip() and len(q.question) <= 30
            assert not any(ord(c) < 32 and c not in "\t\n" for c in q.question)


def test_a_question_file_without_the_question_column_is_told_how_to_map_its_own(tmp_path):
    f = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "query": ["x?"]}), f)
    with pytest.raises(SchemaError, match=r"missing required column 'question' \(has \['id', 'query'\]\); .*"
                                          r"--set 'input.columns=\{question: <yours>\}'"):
        plan_input(str(f))
    with pytest.raises(SchemaError, match="input.columns"):
        question_columns(str(f))


def test_a_repeated_id_keeps_the_gold_of_its_first_row_where_it_is_answered():
    """label and calibrate kept the last row's gold: the answer to "capital of France?" was labelled
    against "Shakespeare"."""
    from jobs.questions import by_first_id

    rows = [{"id": "a", "answers": ["Paris"]}, {"id": "a", "answers": ["Shakespeare"]}, {"id": "b", "answers": []}]
    assert by_first_id(rows)["a"]["answers"] == ["Paris"] and list(by_first_id(rows)) == ["a", "b"]


def test_uris_rebuilt_from_paths_keep_their_credentials_host_and_query():
    """Before, `_input/` files, answer parts found in a folder and files joined to an output were rebuilt
    from the scheme alone: `key:secret@` and `?endpoint_override=` were dropped and the file read elsewhere."""
    from jobs.storage import join, path_of, uri_of

    q = "?endpoint_override=127.0.0.1:5055&scheme=http"
    assert uri_of(f"s3://K:S@bkt/out{q}", "bkt/out/rag/part-00000.parquet") == f"s3://K:S@bkt/out/rag/part-00000.parquet{q}"
    assert uri_of("s3://bkt/out/", "bkt/out/x") == "s3://bkt/out/x"
    assert uri_of("hdfs://namenode:9000/data/out", "/data/out/x") == "hdfs://namenode:9000/data/out/x"
    assert uri_of("file:///tmp/out", "/tmp/out/x") == "file:///tmp/out/x" and uri_of("runs/out", "runs/out/x") == "runs/out/x"
    assert join(f"s3://bkt/out{q}", "rag", "metrics.json") == f"s3://bkt/out/rag/metrics.json{q}"
    assert join("runs/out/", "metrics.json") == "runs/out/metrics.json"
    assert path_of(f"s3://bkt/q.jsonl{q}").endswith(".jsonl") and path_of("runs/a?b.csv") == "runs/a?b.csv"
    # pyarrow's paths are decoded: encoded again, or `s3://bkt/my%20out`'s parts were refused as URIs
    assert uri_of("s3://bkt/my%20out", "bkt/my out/rag/part-00000.parquet") == "s3://bkt/my%20out/rag/part-00000.parquet"
    assert uri_of("s3://bkt/out", "bkt/out/think_act.beta_threshold=0.5") == "s3://bkt/out/think_act.beta_threshold=0.5"


def test_a_uri_pyarrow_cannot_parse_is_one_line_that_keeps_its_secret():
    """A secret with an unencoded '/' (AWS's own example key has two) was printed whole, and the URI taken
    as a local path ended in a traceback."""
    from jobs.formats import is_foreign
    from jobs.storage import filesystem

    secret = "s3://AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bkt/q.parquet"
    assert redact(secret) == "s3://***@bkt/q.parquet"
    assert redact("s3://bkt/path@v1/x.parquet") == "s3://bkt/path@v1/x.parquet"  # an '@' in a key is no credential
    with pytest.raises(UserError, match=r"^s3://\*\*\*@bkt/q.parquet: not a URI pyarrow can open") as err:
        filesystem(secret)
    assert "wJalr" not in str(err.value)
    with pytest.raises(UserError, match="not a URI pyarrow can open"):
        filesystem("s3://bkt/my out")
    assert is_foreign("s3://bkt/q.jsonl?endpoint_override=127.0.0.1:5055") and not is_foreign("s3://bkt/q.parquet?x=.csv")
