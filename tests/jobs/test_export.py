"""An OpenAI / vLLM batch input file answered by ragsift and exported as a batch output file that vLLM's
own protocol models accept, one response per custom_id; the rows export keeps every column."""

import json

import pyarrow.parquet as pq
import pytest

from engine.stages import GeneratorStage
from jobs.answer import answer
from jobs.export import export
from jobs.question_sources import materialize_questions
from schemas.config import StageBatching
from schemas.errors import UserError
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeGenerator

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def test_an_openai_batch_file_in_gives_an_openai_batch_file_out(ray_session, tmp_path):
    from vllm.entrypoints.launchers.run_batch import BatchRequestInput, BatchRequestOutput

    ray = ray_session
    requests = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "any", "messages": [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": f"question {i}" + (
                                                           " POISON" if i == 2 else "")}]}} for i in range(5)]
    source = tmp_path / "batch_input.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in requests))
    for r in requests:  # a file vLLM's run-batch would take (a request it would not raises)
        BatchRequestInput.model_validate(r)

    questions = materialize_questions(str(source), str(tmp_path / "out"), {}, None)
    assert pq.read_table(questions).to_pylist()[1] == {"id": "req-1", "question": "question 1"}
    config = AnswerConfig(questions=questions, output=str(tmp_path / "out"), strategies=["direct"],
                          engine={"max_attempts": 2})
    actor = ray.remote(FakeGenerator).options(num_cpus=0).remote()
    answer(config, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())})

    assert export(str(tmp_path / "out"), str(tmp_path / "results.jsonl"), "openai-batch") == 5
    lines = [BatchRequestOutput.model_validate_json(line)
             for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    by_id = {line.custom_id: line for line in lines}
    assert sorted(by_id) == [r["custom_id"] for r in requests]
    assert by_id["req-2"].response.status_code == 500 and "replica crashed" in by_id["req-2"].error
    ok = by_id["req-0"].response
    assert ok.status_code == 200 and ok.body.choices[0].message.content.endswith("question 0")
    assert ok.body.usage.total_tokens == ok.body.usage.prompt_tokens + ok.body.usage.completion_tokens > 0

    assert export(str(tmp_path / "out"), str(tmp_path / "rows.jsonl"), "rows") == 5
    row = json.loads((tmp_path / "rows.jsonl").read_text().splitlines()[0])
    assert {"id", "answer", "retrieved_ids", "trace", "error"} <= set(row)
    with pytest.raises(UserError, match="no answers of strategy 'rag'"):
        export(str(tmp_path / "out"), str(tmp_path / "x.jsonl"), "openai-batch", strategy="rag")


def test_one_part_named_by_its_bare_file_name_exports(tmp_path, monkeypatch):
    import pyarrow as pa

    rows = [{"id": "a", "strategy": "rag", "answer": "Paris", "error": None, "prompt_tokens": 3,
             "completion_tokens": 1}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "part-00000.parquet")
    monkeypatch.chdir(tmp_path)  # an IndexError before: the strategy was read from the path's folder
    assert export("part-00000.parquet", "out.jsonl", "openai-batch", strategy="rag") == 1
    assert json.loads((tmp_path / "out.jsonl").read_text())["custom_id"] == "a"


def test_a_file_holding_two_strategies_exports_only_the_one_asked_for(tmp_path):
    """Before, a file's strategy was read off its first row: --strategy rag exported direct's answers too,
    --strategy direct found none, and no --strategy wrote two responses for one custom_id."""
    import pyarrow as pa

    from schemas.tables import ANSWERS
    from tests.jobs.test_evaluate import answer_row

    rows = [answer_row("a", "x", "rag", step_tokens=[("read", 5)]), answer_row("a", "y", "direct")]
    pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), tmp_path / "both.parquet")
    for strategy, answer_text in (("rag", "x"), ("direct", "y")):
        assert export(str(tmp_path / "both.parquet"), str(tmp_path / f"{strategy}.jsonl"), "rows", strategy) == 1
        (line,) = (tmp_path / f"{strategy}.jsonl").read_text().splitlines()
        assert json.loads(line)["answer"] == answer_text
    assert json.loads((tmp_path / "rag.jsonl").read_text())["step_tokens"] == {"read": 5}  # a map, not pairs
    with pytest.raises(UserError, match="several strategies"):
        export(str(tmp_path / "both.parquet"), str(tmp_path / "b.jsonl"), "openai-batch")


def test_export_refuses_to_write_over_the_answers_it_reads_and_keeps_the_old_file_when_it_fails(tmp_path):
    """``--to`` was truncated before anything was read: naming the answer part itself emptied it, and an
    answer file without a column the format reads crashed with a KeyError after the old --to was emptied."""
    import pyarrow as pa

    from schemas.tables import ANSWERS
    from tests.jobs.test_evaluate import answer_row

    part = tmp_path / "rag" / "part-00000.parquet"
    part.parent.mkdir()
    pq.write_table(pa.Table.from_pylist([answer_row("a", "x", "rag")], schema=ANSWERS), part)
    with pytest.raises(UserError, match="one of the answer files"):
        export(str(tmp_path), str(part), "rows")
    assert pq.read_table(part).num_rows == 1

    bare = tmp_path / "bare.parquet"
    pq.write_table(pa.table({"id": [1], "strategy": ["rag"], "answer": ["x"]}), bare)
    old = tmp_path / "old.jsonl"
    old.write_text("kept\n")
    with pytest.raises(UserError, match=r"no column \['error', 'prompt_tokens', 'completion_tokens'\]"):
        export(str(bare), str(old), "openai-batch")
    assert old.read_text() == "kept\n" and not list(tmp_path.glob("*.tmp"))
    assert export(str(bare), str(old), "rows") == 1 and json.loads(old.read_text())["id"] == 1


def test_a_batch_line_names_its_custom_id_as_a_string():
    from jobs.export import batch_line

    line = batch_line({"id": 7, "strategy": "rag", "answer": "x", "error": None, "prompt_tokens": 1,
                       "completion_tokens": 1}, "m")
    assert line["custom_id"] == "7"


def test_a_batch_lines_finish_reason_is_length_where_a_generation_of_the_row_was_cut_off():
    """It was always "stop", also for an answer cut off at sampling.max_tokens."""
    from jobs.export import batch_line

    row = {"id": "q", "strategy": "direct", "answer": "The capital of France is Par", "error": None,
           "prompt_tokens": 9, "completion_tokens": 8}
    finish = lambda **extra: batch_line({**row, **extra}, "m")["response"]["body"]["choices"][0]["finish_reason"]  # noqa: E731
    assert finish(n_truncated=1) == "length"
    assert finish(n_truncated=0) == "stop" and finish() == "stop"  # a row written before the column: not known


def test_export_writes_through_a_link_and_refuses_a_directory(tmp_path):
    """Moving the finished file over --to replaced a link (its target kept the old text) and, for a
    directory, failed after all the work, leaving <to>.tmp behind."""
    import os

    import pyarrow as pa

    from schemas.tables import ANSWERS
    from tests.jobs.test_evaluate import answer_row

    part = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist([answer_row("a", "x", "rag")], schema=ANSWERS), part)
    (tmp_path / "real.jsonl").write_text("old\n")
    os.symlink(tmp_path / "real.jsonl", tmp_path / "link.jsonl")
    assert export(str(part), str(tmp_path / "link.jsonl"), "rows") == 1
    assert (tmp_path / "link.jsonl").is_symlink() and json.loads((tmp_path / "real.jsonl").read_text())["id"] == "a"
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match="is a directory"):
        export(str(part), str(tmp_path / "d"), "rows")
    assert not list(tmp_path.glob("*.tmp"))


def a_run(folder, rows: int, shard_rows: int, parts: dict[str, list[int]]):
    """An answer output as ``answer`` leaves it: its manifest, and for each strategy the parts of ``parts``."""
    import pyarrow as pa

    from schemas.tables import ANSWERS
    from tests.jobs.test_evaluate import answer_row

    folder.mkdir()
    (folder / "_manifest.json").write_text(json.dumps({"input.rows": rows, "commit.shard_rows": shard_rows}))
    for strategy, shards in parts.items():
        (folder / strategy).mkdir()
        for shard in shards:
            answered = [answer_row(f"q{shard * shard_rows + i}", "x", strategy) for i in range(shard_rows)]
            pq.write_table(pa.Table.from_pylist(answered, schema=ANSWERS), folder / strategy / f"part-{shard:05d}.parquet")


def test_a_run_not_finished_is_refused_unless_partial_which_exports_what_was_answered(tmp_path):
    """A killed run's 2 answers of 16 were exported as a whole batch output file, exit 0, without a word."""
    a_run(tmp_path / "out", rows=6, shard_rows=2, parts={"rag": [0, 2], "direct": [0, 1, 2]})
    with pytest.raises(UserError, match=r"not finished .*rag has 2 of its 3 parts.*--partial"):
        export(str(tmp_path / "out"), str(tmp_path / "rag.jsonl"), "openai-batch", strategy="rag")
    assert not (tmp_path / "rag.jsonl").exists()
    said = []
    assert export(str(tmp_path / "out"), str(tmp_path / "rag.jsonl"), "openai-batch", strategy="rag", partial=True,
                  log=said.append) == 4
    assert "rag has 2 of its 3 parts" in said[0]
    assert export(str(tmp_path / "out"), str(tmp_path / "direct.jsonl"), "openai-batch", strategy="direct") == 6
    with pytest.raises(UserError, match="rag has 2 of its 3 parts"):  # rows takes every strategy
        export(str(tmp_path / "out"), str(tmp_path / "rows.jsonl"), "rows")


def test_export_makes_the_folder_of_to_and_leaves_a_file_of_the_users_beside_it_alone(tmp_path):
    """``<to>.tmp`` was written over and removed (a file of the user's, or another export's), and a --to in a
    folder not yet made failed naming that .tmp file."""
    a_run(tmp_path / "out", rows=2, shard_rows=2, parts={"rag": [0]})
    to = tmp_path / "new" / "folder" / "rag.jsonl"
    assert export(str(tmp_path / "out"), str(to), "openai-batch") == 2
    (tmp_path / "keep.jsonl.tmp").write_text("my notes\n")
    assert export(str(tmp_path / "out"), str(tmp_path / "keep.jsonl"), "openai-batch") == 2
    assert (tmp_path / "keep.jsonl.tmp").read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl", "keep.jsonl.tmp", "new", "out"]


def test_evaluate_says_when_the_run_it_scores_is_not_finished(tmp_path, capsys):
    import argparse

    import pyarrow as pa

    from jobs.evaluate import run

    a_run(tmp_path / "out", rows=4, shard_rows=2, parts={"rag": [1]})
    pq.write_table(pa.Table.from_pylist(
        [{"id": f"q{i}", "question": "?", "answers": ["x"]} for i in range(4)]), tmp_path / "q.parquet")
    run(argparse.Namespace(answers=str(tmp_path / "out"), questions=str(tmp_path / "q.parquet"), k=None, out=None))
    assert "warning: " + str(tmp_path / "out") + " is not finished" in capsys.readouterr().err
    # and its files say so: left beside the run once it finished, they read as its scores (before: no word)
    import json

    assert json.loads((tmp_path / "out" / "eval.json").read_text())[0]["unfinished"].endswith("rag has 1 of its 2 parts")
    assert (tmp_path / "out" / "eval.md").read_text().startswith("**Not finished**: ")
    a_run(tmp_path / "done", rows=4, shard_rows=2, parts={"rag": [0, 1]})
    (tmp_path / "done" / "labels").mkdir()  # a label run's labels beside its answers are no strategy's parts
    (tmp_path / "done" / "labels" / "relevance.parquet").write_bytes(b"")
    run(argparse.Namespace(answers=str(tmp_path / "done"), questions=str(tmp_path / "q.parquet"), k=None, out=None))
    assert "warning" not in capsys.readouterr().err
    assert "unfinished" not in json.loads((tmp_path / "done" / "eval.json").read_text())[0]
    assert "Not finished" not in (tmp_path / "done" / "eval.md").read_text()


def test_to_dash_writes_the_lines_to_stdout(tmp_path, capfd, monkeypatch):
    """`--to -` wrote a file named "-"."""
    from jobs.cli import main

    a_run(tmp_path / "out", rows=2, shard_rows=2, parts={"rag": [0]})
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--answers", str(tmp_path / "out"), "--to", "-"]) == 0
    out = capfd.readouterr().out.splitlines()
    assert [json.loads(line)["custom_id"] for line in out] == ["q0", "q1"] and not (tmp_path / "-").exists()


def test_a_run_that_has_committed_no_part_yet_is_said_to_be_one_in_evaluate_export_and_report(tmp_path):
    """Before, all three said "no answer Parquet files ... give another file itself to evaluate it"."""
    import json

    from jobs.evaluate import answer_files

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_manifest.json").write_text(json.dumps({"input.rows": 4, "commit.shard_rows": 2}))
    with pytest.raises(FileNotFoundError, match="holds a run that has committed no part yet"):
        answer_files(str(tmp_path / "out"))
    (tmp_path / "other").mkdir()
    with pytest.raises(FileNotFoundError, match="no answer Parquet files in"):
        answer_files(str(tmp_path / "other"))
