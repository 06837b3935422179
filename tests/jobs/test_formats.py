"""Other tools' files read as they are: FlashRAG's dataset and corpus JSON Lines, CSV questions and
corpora; bad files are clear errors."""

import json
import re

import pyarrow as pa
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
    pq.write_table(pa.table({"id": ["a"], "text": ["t"]}), tmp_path / "c.parquet")
    assert corpus_parquet(str(tmp_path / "c.parquet"), tmp_path / "idx", lines.append).endswith("c.parquet")


def test_a_parquet_corpus_with_integer_ids_is_indexed_with_its_ids_as_text(ray_session, tmp_path):
    """As JSON Lines and CSV numbers are: a table written from a DataFrame often has int64 ids (it was refused,
    'column id has type int64, expected string')."""
    import ray

    from actors.bm25 import BM25Shard
    from jobs.index import IndexJobConfig, build_index
    from schemas.config import load_config
    from tests.jobs.test_index import HashEncoder

    pq.write_table(pa.table({"id": pa.array([10, 11, 12], pa.int64()), "title": ["A", "B", "C"],
                             "text": ["passage alpha", "passage beta", "passage gamma"]}), tmp_path / "c.parquet")
    config = load_config(IndexJobConfig, None, [f"index.path={tmp_path / 'idx'}", "index.shards=1"],
                         corpus=str(tmp_path / "c.parquet"))
    manifest = build_index(config, log=lambda *a, **k: None,
                           encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["count"] == 3
    assert BM25Shard(str(tmp_path / "idx" / "shard-000")).search(["beta"], 1)[0][0].id == "11"


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


def test_every_csv_cell_is_text_so_ids_keep_their_zeros_and_numeric_answers_are_answers(tmp_path):
    """Before, pyarrow inferred numbers: 007 and 7 both became "7" (one dropped as a duplicate), and an
    answers column of years was refused as int64."""
    (tmp_path / "q.csv").write_text("id,question,answers\n007,when?,1990\n7,how many?,42|forty-two\n08,who?,\n")
    rows = pq.read_table(materialize_questions(str(tmp_path / "q.csv"), str(tmp_path / "out"), {}, None)).to_pylist()
    assert [(r["id"], r["answers"]) for r in rows] == [("007", ["1990"]), ("7", ["42", "forty-two"]), ("08", None)]


def test_a_csv_whose_quoted_cells_hold_newlines_is_read_past_its_first_block(tmp_path):
    """Before, a valid CSV (Python's csv module writes paragraphs in quotes) was refused once it was over one
    16 MB block: pyarrow split a block at a newline inside a cell ("Expected 3 columns, got 1")."""
    import csv

    from jobs.formats import batches

    with open(tmp_path / "corpus.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "title", "text"])
        for i in range(400):
            writer.writerow([f"p{i}", f"T{i}", f"First paragraph of {i}.\n\nSecond, with a comma.\r\nThird."])
    read_rows = [r for b in batches(str(tmp_path / "corpus.csv"), block_bytes=1 << 10) for r in b.to_pylist()]
    assert [r["id"] for r in read_rows] == [f"p{i}" for i in range(400)]
    assert read_rows[399]["text"] == "First paragraph of 399.\n\nSecond, with a comma.\r\nThird."


def test_a_csv_with_a_header_and_no_rows_is_a_clear_error(tmp_path):
    (tmp_path / "q.csv").write_text("id,question\n")
    with pytest.raises(UserError, match="no rows"):
        read(str(tmp_path / "q.csv"))


def test_a_json_answers_string_is_one_answer_the_bar_splits_only_csv_cells(tmp_path):
    source = write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q", "answers": "AT|T"}])
    assert read(source)["answers"].to_pylist() == [["AT|T"]]


@pytest.mark.parametrize("body", ["hi", {"messages": "hi"}, {"messages": [None, 3]}])
def test_an_openai_batch_request_of_another_shape_is_an_error_row_not_a_crash(tmp_path, body):
    """Before, a body that was not {"messages": [{...}]} raised AttributeError ('str' has no 'get')."""
    source = write_jsonl(tmp_path / "batch.jsonl", [{"custom_id": "r1", "body": body}])
    assert read(source).to_pylist() == [{"id": "r1", "question": None}]


@pytest.mark.parametrize("ident, message", [
    ({"a": 1}, "ids must be text or numbers"), ([1], "ids must be text or numbers"),
    (12345678901234567890, "2\\*\\*53"),
])
def test_an_id_that_cannot_be_text_is_a_clear_error(tmp_path, ident, message):
    source = write_jsonl(tmp_path / "q.jsonl", [{"id": ident, "question": "q"}])
    with pytest.raises(UserError, match=message):
        read(source)


def test_renaming_onto_a_column_the_questions_have_is_a_clear_error(tmp_path):
    source = write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "query": "q1", "question": "old"}])
    with pytest.raises(UserError, match=r"two columns named \['question'\]"):
        materialize_questions(source, str(tmp_path / "out"), {"question": "query"}, None)


def test_a_damaged_datasets_folder_is_a_clear_error(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"id": "a", "question": "q"}]).save_to_disk(str(tmp_path / "ds"))
    (tmp_path / "ds" / "state.json").write_text("{not json")
    with pytest.raises(UserError, match="not readable as a `datasets` folder"):
        materialize_questions(str(tmp_path / "ds"), str(tmp_path / "out"), {}, None)


def test_a_field_first_seen_after_the_first_block_says_so(tmp_path):
    from jobs.formats import batches

    source = write_jsonl(tmp_path / "q.jsonl", [{"id": str(i), "question": "q" * 50} for i in range(200)]
                         + [{"id": "late", "question": "q", "answers": ["x"]}])
    with pytest.raises(UserError, match="first appears after the first block"):
        list(batches(source, block_bytes=4096))


@pytest.mark.parametrize("row, message", [
    ({"id": "1", "text": ["a", "b"]}, "column 'text' holds list"),
    ({"id": "1", "text": "a", "title": {"x": 1}}, "column 'title' holds struct"),
    ({"id": "1", "contents": 5}, "`contents` holds int64, not text"),
])
def test_a_corpus_field_that_is_not_text_is_a_clear_error(tmp_path, row, message):
    from jobs.index import corpus_parquet

    source = write_jsonl(tmp_path / "c.jsonl", [row])
    with pytest.raises(UserError, match=message):
        corpus_parquet(source, tmp_path / "idx", print)


@pytest.mark.parametrize("name, content", [
    ("c.csv", b"id,text\n1,hello there\n2,wor\xffld\n3,general kenobi\n"),
    ("c.jsonl", b'{"id": "1", "text": "hello there"}\n{"id": "2", "text": "wor\xffld"}\n'
                b'{"id": "3", "text": "general kenobi"}\n'),
])
def test_corpus_text_that_is_not_utf8_is_skipped_and_counted_and_the_rest_is_indexed(ray_session, tmp_path, name,
                                                                                    content):
    """Before, the CSV's conversion failed whole, and the JSONL's build raised UnicodeDecodeError
    halfway, at the same row on every resume."""
    import ray

    from jobs.index import IndexJobConfig, build_index
    from schemas.config import load_config
    from tests.jobs.test_index import HashEncoder

    (tmp_path / name).write_bytes(content)
    config = load_config(IndexJobConfig, None, [f"index.path={tmp_path / 'idx'}", "index.shards=1"],
                         corpus=str(tmp_path / name))
    manifest = build_index(config, log=lambda *a, **k: None,
                           encoders=[ray.remote(HashEncoder).options(num_cpus=0).remote()])
    assert manifest["count"] == 2 and manifest["skipped"]["invalid_utf8"] == 1
    assert pq.read_table(tmp_path / "idx" / "shard-000" / "passages.parquet")["id"].to_pylist() == ["1", "3"]


def test_csv_cells_that_look_like_nulls_are_text_only_an_empty_cell_is_none(tmp_path):
    """pyarrow's null list made NA, null, nan into nulls once cells were strings: gold answers were lost."""
    (tmp_path / "q.csv").write_text("id,question,answers\nNA,what is NA?,NA\nb,what is null?,null\nc,empty?,\n")
    rows = read(str(tmp_path / "q.csv")).to_pylist()
    assert [(r["id"], r["answers"]) for r in rows] == [("NA", ["NA"]), ("b", ["null"]), ("c", None)]


def test_an_openai_batch_message_given_as_content_parts_is_its_text():
    """The API takes content as a list of parts; such a request became an error row ("empty question")."""
    from jobs.formats import last_user_message

    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Who wrote"},
                                                      {"type": "image_url", "image_url": {"url": "x"}},
                                                      {"type": "text", "text": "Hamlet?"}]}]}
    assert last_user_message(body) == "Who wrote\nHamlet?"
    assert last_user_message({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}) is None


@pytest.mark.parametrize("suffix, content", [
    (".csv", b"id,question,answers\n\xff1,q,x\n2,fine,y\n"),
    (".csv", b"id,question,answers\n1,q,caf\xe9\n"),
    (".jsonl", b'{"id": "\xff1", "question": "q"}\n'),
])
def test_ids_or_answers_that_are_not_utf8_are_refused_naming_the_row_before_the_run(tmp_path, suffix, content):
    """They converted, then plan_input (or evaluate) died with a UnicodeDecodeError traceback."""
    source = tmp_path / f"q{suffix}"
    source.write_bytes(content)
    with pytest.raises(UserError, match=r"of row [12] is not valid UTF-8"):
        materialize_questions(str(source), str(tmp_path / "out"), {}, None)


def test_numeric_gold_answers_are_text_and_optional_columns_of_the_wrong_type_are_refused_at_conversion(tmp_path):
    """[1984] was accepted by answer and refused by evaluate after the run; a numeric dataset column
    was refused by question_rows only after the models had loaded, naming the converted file."""
    source = write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q", "answers": [1984]}])
    target = materialize_questions(source, str(tmp_path / "out"), {}, None)
    assert pq.read_table(target)["answers"].to_pylist() == [["1984"]]
    source = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "question": "q", "dataset": 3}])
    with pytest.raises(UserError, match=r"d\.jsonl: column 'dataset' has type int64"):
        materialize_questions(source, str(tmp_path / "out"), {}, None)


def test_a_line_that_is_not_json_is_named_by_its_line_number(tmp_path):
    (tmp_path / "q.jsonl").write_text('\n\n\n{"id": "a", "question": "q"}\n\n{"id": "b", "question": "r"}\nnot json\n')
    with pytest.raises(UserError, match=r"q\.jsonl: not readable as JSONL \(line 7: "):
        read(str(tmp_path / "q.jsonl"))


def test_gold_columns_of_other_shapes_convert_and_only_what_answering_reads_is_type_checked(tmp_path):
    """Review of the conversion changes: nested answers crashed the UTF-8 check (a cast to binary), and
    meta of objects or numeric gold passage ids were refused though answering reads neither."""
    source = write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q", "answers": [["Paris", "City"]],
                                                 "gold_passage_ids": [12, 34], "meta": {"source": "x"}}])
    table = pq.read_table(materialize_questions(source, str(tmp_path / "out"), {}, None))
    assert table["gold_passage_ids"].to_pylist() == [["12", "34"]]


def test_an_openai_batch_file_whose_message_shapes_vary_from_request_to_request_is_read(tmp_path):
    """A system message's content as a string and the user's as a list of parts (the usual shape), or
    ``stop`` a string in one request and a list in the next: pyarrow's reader refused the file ("changed from
    string to array in row 0")."""
    parts = [{"type": "text", "text": "Who wrote Hamlet?"}]
    source = write_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}],
                  "stop": "x"}},
        {"custom_id": "r2", "body": {"messages": [{"role": "user", "content": "Who painted it?"}], "stop": ["x", "y"]}},
    ])
    assert read(source).to_pylist() == [{"id": "r1", "question": "Who wrote Hamlet?"},
                                        {"id": "r2", "question": "Who painted it?"}]


def test_an_openai_batch_file_is_read_in_batches_and_a_bad_line_is_named(tmp_path):
    from jobs.formats import batches

    source = write_jsonl(tmp_path / "batch.jsonl", [{"custom_id": i, "body": {"messages": [
        {"role": "user", "content": f"q{i}"}]}} for i in range(25)])
    assert [b.num_rows for b in batches(source, mapped=False)] == [25]
    assert read(source)["id"].to_pylist() == [str(i) for i in range(25)]
    with open(source, "a") as f:
        f.write('{"custom_id": "x", "body": \n')
    with pytest.raises(UserError, match="line 26"):
        read(source)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{"custom_id": 1, "body": {}}, {"custom_id": "b", "body": {}}])
    with pytest.raises(UserError, match="custom_id has one type"):
        read(mixed)


def test_a_corpus_that_fails_after_its_first_block_leaves_no_half_copy_and_no_traceback(tmp_path, monkeypatch):
    """Before, the Parquet writer was left open when its stream closed: its collection printed "Exception ignored
    in ParquetWriter.__del__ ... Invalid operation on closed file" under the clear error."""
    import gc
    import sys

    import pyarrow as pa

    import jobs.formats

    def failing(uri, **kwargs):
        yield pa.RecordBatch.from_pydict({"id": ["a"], "text": ["alpha"]})
        raise UserError(f"{uri}: not readable as CSV (after its first 1 rows, ...)")

    monkeypatch.setattr(jobs.formats, "batches", failing)
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    with pytest.raises(UserError, match="not readable"):
        jobs.formats.to_parquet(str(tmp_path / "c.csv"), str(tmp_path / "c.parquet"), ["id", "text"], ["id", "text"])
    gc.collect()
    assert ignored == [] and list(tmp_path.iterdir()) == []
