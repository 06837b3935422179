"""Question sources converted to ragsift's Parquet: datasets directories and renamed columns, via the CLI's config."""

import argparse
import re

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import answer as answer_job
from jobs.cli import main
from schemas.errors import UserError

ROWS = [{"qid": "a", "query": "Who?", "golds": ["x"]}, {"qid": "b", "query": "What?", "golds": ["y"]}]
COLUMNS = "input.columns={id: qid, question: query, answers: golds}"


def config_for(questions, output, *overrides):
    parser = argparse.ArgumentParser()
    answer_job.add_arguments(parser)
    args = parser.parse_args(["--questions", str(questions), "--output", str(output),
                              *[a for o in overrides for a in ("--set", o)]])
    return answer_job.config_from_args(args)


def test_a_saved_dataset_with_renamed_columns_becomes_a_question_file(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    config = config_for(tmp_path / "ds", tmp_path / "out", COLUMNS)
    assert re.fullmatch(rf"{tmp_path}/out/_input/questions-[0-9a-f]{{16}}\.parquet", config.questions)
    table = pq.read_table(config.questions)
    assert table.select(["id", "question", "answers"]).to_pylist() == [
        {"id": "a", "question": "Who?", "answers": ["x"]}, {"id": "b", "question": "What?", "answers": ["y"]}]


def test_a_dataset_dict_needs_a_split_when_it_has_several(tmp_path):
    d = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "validation": datasets.Dataset.from_list(ROWS[:1])})
    d.save_to_disk(str(tmp_path / "dd"))
    config = config_for(tmp_path / "dd", tmp_path / "out", COLUMNS, "input.split=validation")
    assert pq.read_table(config.questions)["id"].to_pylist() == ["a"]
    with pytest.raises(UserError, match=r"splits \['train', 'validation'\]: choose one with --set input.split"):
        config_for(tmp_path / "dd", tmp_path / "out2", COLUMNS)
    # through the command: a one-line error, exit 2
    assert main(["answer", "--questions", str(tmp_path / "dd"), "--output", str(tmp_path / "out3")]) == 2


def test_parquet_is_read_in_place_unless_columns_are_renamed(tmp_path):
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "q.parquet")
    assert config_for(tmp_path / "q.parquet", tmp_path / "out").questions == str(tmp_path / "q.parquet")
    renamed = config_for(tmp_path / "q.parquet", tmp_path / "out", "input.columns={question: query}")
    assert pq.read_table(renamed.questions).select(["question", "id"]).to_pylist()[0] == {"question": "Who?", "id": "0"}
    with pytest.raises(UserError, match=r"\['nope'\] are not in the questions"):
        config_for(tmp_path / "q.parquet", tmp_path / "out", "input.columns={question: nope}")


def test_a_folder_of_parquet_files_is_one_question_table_in_path_order_without_markers_or_hidden_files(tmp_path):
    """Spark's or Ray Data's output, the layout of a million questions, was refused: "cannot be read (...
    is a directory)"."""
    from jobs.question_sources import as_parquet

    folder = tmp_path / "qs"
    (folder / "_temporary").mkdir(parents=True)
    rows = [{"id": f"q{i}", "question": f"Q{i}?", "answers": [f"a{i}"]} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows[2:]), folder / "part-00001.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:2]), folder / "part-00000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), folder / "_temporary" / "part-00002.parquet")  # in progress
    (folder / "_SUCCESS").write_text("")
    (folder / ".part-00000.parquet.crc").write_bytes(b"crc")
    config = config_for(folder, tmp_path / "out")
    assert re.fullmatch(rf"{tmp_path}/out/_input/questions-[0-9a-f]{{16}}\.parquet", config.questions)
    assert pq.read_table(config.questions)["id"].to_pylist() == ["q0", "q1", "q2", "q3", "q4"]
    assert pq.read_table(as_parquet(str(folder)))["answers"].to_pylist() == [[f"a{i}"] for i in range(5)]  # evaluate's read
    (tmp_path / "none").mkdir()
    with pytest.raises(UserError, match=r"a folder with no Parquet file"):
        config_for(tmp_path / "none", tmp_path / "out2")
    # partitioned by dataset (Spark's partitionBy): the column is in the folder names only, and stays text
    pq.write_to_dataset(pa.Table.from_pylist([{**r, "dataset": d} for r, d in zip(rows, ["nq", "2020", "nq", "squad", "2020"])]),
                        str(tmp_path / "hive"), partition_cols=["dataset"])
    table = pq.read_table(config_for(tmp_path / "hive", tmp_path / "out3").questions)
    assert sorted(zip(table["id"].to_pylist(), table["dataset"].to_pylist())) == [
        ("q0", "nq"), ("q1", "2020"), ("q2", "nq"), ("q3", "squad"), ("q4", "2020")]


def test_hf_names_go_through_load_dataset(tmp_path):
    """``hf:NAME`` is ``datasets.load_dataset(NAME, split=...)``: a hub name online; here a local folder of files."""
    (tmp_path / "files").mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "files" / "train.parquet")
    config = config_for(f"hf:{tmp_path / 'files'}", tmp_path / "out", COLUMNS)
    assert pq.read_table(config.questions)["question"].to_pylist() == ["Who?", "What?"]
    assert main(["answer", "--questions", "hf:no-such-owner/no-such-dataset", "--output", str(tmp_path / "o")]) == 2


def test_other_questions_converted_into_a_claimed_output_leave_its_input_as_it_was(tmp_path):
    """Before, every conversion rewrote <output>/_input/questions.parquet in place, before the output's
    lease and identity check: a refused rerun with other questions replaced the file the earlier run's
    config.yaml names (so its evaluation read the new gold), and a second driver the file a first read."""
    (tmp_path / "a.jsonl").write_text('{"id": "1", "question": "Who?", "answers": ["x"]}\n')
    (tmp_path / "b.jsonl").write_text('{"id": "1", "question": "Who?", "answers": ["y"]}\n')
    first = config_for(tmp_path / "a.jsonl", tmp_path / "out").questions
    again = config_for(tmp_path / "a.jsonl", tmp_path / "out").questions
    other = config_for(tmp_path / "b.jsonl", tmp_path / "out").questions
    assert first == again != other
    assert pq.read_table(first)["answers"].to_pylist() == [["x"]]
    assert sorted(p.name for p in (tmp_path / "out" / "_input").iterdir()) == sorted(
        [first.rsplit("/", 1)[-1], other.rsplit("/", 1)[-1]])


def test_a_converted_input_without_a_question_column_is_refused_naming_the_users_file_before_anything_is_written(
        tmp_path):
    from schemas.tables import SchemaError

    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('{"id": "a", "query": "Who?"}\n')
    with pytest.raises(SchemaError, match=r"q\.jsonl.*question"):  # named the _input/ copy, already written
        config_for(jsonl, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_renamed_columns_get_the_formats_reading_too(tmp_path):
    """The rename ran after a CSV's answers were split and FlashRAG's names mapped: a renamed answers
    column stayed 'a|b' (refused as text), and golden_answers could not be named (it was gone)."""
    (tmp_path / "q.csv").write_text("id,query,golds\n1,q1,a|b\n")
    config = config_for(tmp_path / "q.csv", tmp_path / "out", "input.columns={question: query, answers: golds}")
    assert pq.read_table(config.questions).select(["id", "question", "answers"]).to_pylist() == [
        {"id": "1", "question": "q1", "answers": ["a", "b"]}]
    (tmp_path / "f.jsonl").write_text('{"qid": "x", "question": "q", "golden_answers": ["g"]}\n')
    config = config_for(tmp_path / "f.jsonl", tmp_path / "out2", "input.columns={id: qid, answers: golden_answers}")
    assert pq.read_table(config.questions).select(["id", "answers"]).to_pylist() == [{"id": "x", "answers": ["g"]}]


@pytest.mark.parametrize("mapping, message", [
    ("{id: query, question: query}", "maps one column of the questions"),
    ("{questoin: query}", r"names \['questoin'\], not question columns"),
])
def test_an_input_columns_mapping_that_loses_or_misnames_a_column_is_refused(tmp_path, capsys, mapping, message):
    """One file column for two of ours silently dropped the first; a misspelt key of ours was accepted
    and the file's own `question` column answered instead."""
    (tmp_path / "q.jsonl").write_text('{"query": "q1", "question": "other"}\n')
    with pytest.raises(UserError, match=message):
        config_for(tmp_path / "q.jsonl", tmp_path / "out", f"input.columns={mapping}")


def test_a_local_hf_folder_of_csv_files_splits_answers_and_maps_flashrag_names(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "train.csv").write_text("id,question,golden_answers\nq1,Who?,a|b\n")
    config = config_for(f"hf:{tmp_path / 'hf'}", tmp_path / "out")
    assert pq.read_table(config.questions).select(["id", "answers"]).to_pylist() == [{"id": "q1", "answers": ["a", "b"]}]


def test_a_split_is_refused_for_questions_that_have_none(tmp_path, capsys):
    """``input.split`` of a Parquet or JSON Lines file, or of a saved Dataset of one table, was ignored: the
    whole file was answered whatever split was asked for."""
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "q.parquet")
    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?"}\n')
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    for questions in ("q.parquet", "q.jsonl", "ds"):
        with pytest.raises(UserError, match=r"input.split 'train': .* is one table, with no splits"):
            config_for(tmp_path / questions, tmp_path / "out", "input.split=train")
    capsys.readouterr()
    assert main(["answer", "--questions", str(tmp_path / "q.parquet"), "--output", str(tmp_path / "o"),
                 "--set", "input.split=train"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_runs_config_yaml_of_converted_questions_runs_again_with_config_alone_as_the_same_run(tmp_path):
    """config.yaml names the converted copy, which holds the split chosen and the columns renamed, and keeps
    input.split / input.columns: --config with it refused the split of a Parquet file (or looked for the
    renamed column in the copy). Recording them as none instead changed the run's identity, so the file no
    longer resumed its own output."""
    import yaml

    from jobs.identity import run_identity
    from jobs.questions import plan_input

    datasets.DatasetDict({"validation": datasets.Dataset.from_list([{"qid": "1", "query": "Who?", "answers": ["x"]}])}
                         ).save_to_disk(str(tmp_path / "dd"))
    config = config_for(tmp_path / "dd", tmp_path / "out", "input.split=validation", "input.columns={id: qid, question: query}")
    answer_job.write_record(config, {})
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["input"]["split"] == "validation"
    parser = argparse.ArgumentParser()
    answer_job.add_arguments(parser)
    again = answer_job.config_from_args(parser.parse_args(["--config", str(tmp_path / "out" / "config.yaml")]))
    assert again.questions == config.questions
    assert run_identity(again, plan_input(again.questions)) == run_identity(config, plan_input(config.questions))
    elsewhere = answer_job.config_from_args(parser.parse_args(["--config", str(tmp_path / "out" / "config.yaml"),
                                                               "--output", str(tmp_path / "other")]))
    assert pq.read_table(elsewhere.questions).select(["id", "question"]).to_pylist() == [{"id": "1", "question": "Who?"}]


def test_a_converted_copy_on_an_object_store_is_known_by_its_path_not_by_its_query():
    """A run's config.yaml names the copy with the store's query after it (uri_of keeps it): before, it was not
    known as the copy, and --config <output>/config.yaml applied input.columns to it a second time."""
    from jobs.question_sources import is_converted_copy
    from jobs.storage import uri_of
    copy = uri_of("s3://b/out?endpoint_override=h:9000", "b/out/_input/questions-0123456789abcdef.parquet")
    assert copy.endswith("?endpoint_override=h:9000") and is_converted_copy(copy)
    assert not is_converted_copy("s3://b/mine/questions.parquet?endpoint_override=h:9000")
    assert is_converted_copy("out/_input/questions-0123456789abcdef.parquet")
