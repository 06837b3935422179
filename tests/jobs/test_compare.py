"""``ragsift compare`` / ``label``: which strategies run by default, and bad gold fails before answering."""

import argparse
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import answer as answer_job
from jobs import compare, label
from schemas.tables import ANSWERS, SchemaError
from strategies.registry import ANSWERING


def args_for(job, *argv):
    parser = argparse.ArgumentParser()
    job.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_compare_runs_every_answering_strategy_unless_told(tmp_path):
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), tmp_path / "q.parquet")
    io = ["--questions", str(tmp_path / "q.parquet"), "--output", str(tmp_path / "out")]
    default = answer_job.config_from_args(args_for(compare, *io), default_strategies=ANSWERING)
    assert default.strategies == ["direct", "rag", "raisf", "least_to_most", "self_reasoning", "think_act", "migres"]
    flag = answer_job.config_from_args(args_for(compare, *io, "--strategy", "rag,migres"), ANSWERING)
    assert flag.strategies == ["rag", "migres"]
    (tmp_path / "c.yaml").write_text("strategies: [think_act]\n")
    from_file = answer_job.config_from_args(args_for(compare, *io, "--config", str(tmp_path / "c.yaml")),
                                            ANSWERING)
    assert from_file.strategies == ["think_act"]  # a job's default never overrides the config file
    labels = answer_job.config_from_args(args_for(label, *io), default_strategies=label.LABEL_STRATEGIES)
    assert labels.strategies == ["raisf_labels", "self_reasoning"]
    assert answer_job.config_from_args(args_for(answer_job, *io)).strategies == ["rag"]


def test_a_bad_gold_column_fails_compare_before_any_answering(tmp_path):
    bad = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], "answers": [["x"]], "gold_passage_ids": [[1]]}), bad)
    args = args_for(compare, "--questions", str(bad), "--output", str(tmp_path / "out"),
                    "--index-dir", str(tmp_path / "no-index"))
    with pytest.raises(SchemaError, match=r"'gold_passage_ids' has type list<element: int64>"):
        compare.run(args)
    assert not (tmp_path / "out" / "rag").exists()


@pytest.fixture
def one_question_and_no_ray(tmp_path, monkeypatch):
    """A one-question file, and a Ray whose start fails the test: the checks below come before it."""
    import jobs.ray_session

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")
    monkeypatch.setattr(jobs.ray_session, "init_ray", no_ray)
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), questions)
    return questions


def test_a_mistyped_index_dir_is_a_one_line_error_before_ray_starts_and_leaves_nothing(tmp_path, one_question_and_no_ray,
                                                                                       capsys):
    """Before, it failed only after Ray started and left a _manifest.json that refused the corrected rerun."""
    from jobs.cli import run_job

    questions = one_question_and_no_ray
    code = run_job("answer", ["--questions", str(questions), "--output", str(tmp_path / "out"),
                              "--index-dir", str(tmp_path / "no-index"), "--strategy", "rag"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no index at" in err and "no-index" in err
    assert not (tmp_path / "out").exists()


def test_force_with_a_mistyped_index_dir_keeps_the_output_it_could_not_replace(tmp_path, one_question_and_no_ray, capsys):
    """Before, --force skipped the index check on a claimed output, discarded every part, then failed."""
    from jobs.cli import run_job
    from jobs.output import ShardedOutput

    questions = one_question_and_no_ray
    earlier = ShardedOutput(str(tmp_path / "out"), {"generator.model": "earlier"}, ["rag"], shard_rows=10)
    earlier.sealed(0, 1)
    earlier.write({"id": "a", "strategy": "rag", "answer": "x", "_shard": 0})
    code = run_job("answer", ["--questions", str(questions), "--output", str(tmp_path / "out"), "--force",
                              "--index-dir", str(tmp_path / "no-index"), "--strategy", "rag"])
    assert code == 2 and "no index at" in capsys.readouterr().err
    assert (tmp_path / "out" / "rag" / "part-00000.parquet").exists()


def test_an_unwritable_output_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    from jobs.cli import run_job

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), questions)
    blocked = tmp_path / "file"
    blocked.write_text("a file where the output directory should go")
    argv = ["--questions", str(questions), "--output", str(blocked / "out"), "--strategy", "direct",
            "--generator", "smollm2-135m-instruct"]
    code = run_job("answer", argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("ragsift answer: error:")
    with pytest.raises(OSError):
        run_job("answer", [*argv, "--debug"])


def test_a_model_that_cannot_be_loaded_offline_is_one_line_naming_it_before_ray_starts(tmp_path, monkeypatch, capsys):
    """Before, the query encoder's actor failed at start: a 112-line traceback that never named the model,
    or a run that waited on an actor Ray kept restarting."""
    import jobs.ray_session
    from jobs.cli import run_job

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")
    monkeypatch.setattr(jobs.ray_session, "init_ray", no_ray)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({"embedder": "someone/not-a-model", "dims": 384,
                                                     "shards": [{"dir": "s0"}]}))
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), questions)
    for model, flags in (("someone/not-a-model", ["--index-dir", str(index), "--strategy", "rag"]),
                         ("someone/no-such-llm", ["--strategy", "direct", "--generator", "someone/no-such-llm"])):
        code = run_job("answer", ["--questions", str(questions), "--output", str(tmp_path / "out"), *flags])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"model {model!r}" in err and "HF_HUB_OFFLINE" in err
        assert not (tmp_path / "out").exists()


def test_a_strategy_named_twice_is_refused_before_anything_runs(tmp_path, one_question_and_no_ray, capsys):
    """Before, every question was answered twice into one part, committed with each id twice, and the
    output could not be resumed or forced back to health."""
    from jobs.cli import run_job

    code = run_job("compare", ["--questions", str(one_question_and_no_ray), "--output", str(tmp_path / "out"),
                               "--strategy", "direct,rag,direct"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "['direct'] named more than once" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "direct").exists()


@pytest.mark.parametrize("gold, refusal", [
    ({}, "no `answers` column"),
    ({"answers": [["x"]], "dataset": ["ALL"]}, "a dataset named ALL"),
])
def test_compare_refuses_gold_it_cannot_score_before_ray_starts(tmp_path, one_question_and_no_ray, capsys, gold, refusal):
    """Before, every question was answered and the run failed at its evaluation."""
    from jobs.cli import run_job

    questions = tmp_path / "gold.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], **gold}), questions)
    code = run_job("compare", ["--questions", str(questions), "--output", str(tmp_path / "out"), "--strategy", "direct"])
    assert code == 2 and refusal in capsys.readouterr().err
    assert not (tmp_path / "out" / "direct").exists()


def test_compare_scores_the_strategies_it_ran_not_another_left_incomplete_in_the_folder(tmp_path, monkeypatch):
    """A killed `--strategy direct,rag` left rag with one question of two; the rerun `--strategy direct`
    put rag (n=1) beside direct (n=2) in one table, scored on other questions, with no word."""
    from tests.jobs.test_report import answer_row

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "question": ["A?", "B?"], "answers": [["x"], ["y"]]}), questions)
    out = tmp_path / "out"
    (out / "rag").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([answer_row("a", "rag", "x", "retrieval")], schema=ANSWERS),
                   out / "rag" / "part-00000.parquet")
    (out / "direct").mkdir()
    pq.write_table(pa.Table.from_pylist([answer_row("a", "direct", "x", "closed_book"),
                                         answer_row("b", "direct", "y", "closed_book")], schema=ANSWERS),
                   out / "direct" / "part-00000.parquet")
    monkeypatch.setattr(answer_job, "answer", lambda *a, **k: {})  # the answers above stand for the run's
    compare.run(args_for(compare, "--questions", str(questions), "--output", str(out), "--strategy", "direct"))
    table = json.loads((out / "eval.json").read_text())
    assert {r["strategy"] for r in table} == {"direct"}


def test_compare_and_the_demo_write_their_files_before_printing_so_a_closed_stdout_keeps_them(tmp_path, monkeypatch,
                                                                                              closed_stdout):
    """`ragsift compare ... | head -1`: the table was printed first, rich exited on the broken pipe, and
    eval.json was never written (after the whole run)."""
    import sys

    from jobs import demo
    from jobs.evaluate import evaluate
    from tests.jobs.test_demo import demo_args, write_manifest
    from tests.jobs.test_report import answer_row

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["A?"], "answers": [["x"]]}), questions)
    out = tmp_path / "out"
    (out / "direct").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([answer_row("a", "direct", "x", "closed_book")], schema=ANSWERS),
                   out / "direct" / "part-00000.parquet")
    monkeypatch.setattr(answer_job, "answer", lambda *a, **k: {})  # the answers above stand for the run's
    monkeypatch.setattr(sys, "stdout", closed_stdout)
    with pytest.raises(SystemExit):
        compare.run(args_for(compare, "--questions", str(questions), "--output", str(out), "--strategy", "direct"))
    assert json.loads((out / "eval.json").read_text())[0]["strategy"] == "direct"
    (out / "eval.json").unlink()
    for name, stand_in in [("answer", lambda *a, **k: None), ("llm_settings", lambda llm: None),
                           ("evaluate", lambda *a, **k: evaluate(str(out), str(questions)))]:
        monkeypatch.setattr(demo, name, stand_in)
    write_manifest(tmp_path / "idx")
    with pytest.raises(SystemExit):
        demo.run(demo_args(tmp_path, "--strategy", "direct"))
    assert json.loads((out / "eval.json").read_text())[0]["strategy"] == "direct"


def test_a_push_to_hub_the_hub_would_refuse_is_one_line_before_any_labelling(tmp_path, one_question_and_no_ray,
                                                                             monkeypatch, capsys):
    """An invalid repository id ended a whole labelling run with HFValidationError's traceback at the upload,
    its last step; with HF_HUB_OFFLINE set (as the tests run) the upload could not reach the hub either."""
    from huggingface_hub import constants

    from jobs.cli import run_job

    monkeypatch.setattr(label, "label", lambda *a, **k: pytest.fail("labelled before the push was checked"))
    argv = ["--questions", str(one_question_and_no_ray), "--output", str(tmp_path / "out"), "--push-to-hub"]
    for repo in ("my labels", "me/my/labels", "../labels", ""):
        assert run_job("label", [*argv, repo]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--push-to-hub {repo!r} is not a Hugging Face repository id" in err, err
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert run_job("label", [*argv, "me/labels"]) == 2
    assert "--push-to-hub needs the Hugging Face hub, and HF_HUB_OFFLINE is set" in capsys.readouterr().err


def test_a_push_that_fails_after_labelling_is_one_line_saying_where_the_labels_are(tmp_path, monkeypatch):
    """No network or no login: the labelling finished, then HfApi's ConnectError ended it with a traceback."""
    import huggingface_hub

    from jobs.dataset_card import push_to_hub
    from schemas.errors import UserError

    class Unreachable:
        def create_repo(self, *args, **kwargs):
            raise ConnectionError("[Errno 101] Network is unreachable\nand more lines")

    monkeypatch.setattr(huggingface_hub, "HfApi", Unreachable)
    with pytest.raises(UserError, match=rf"the labels are in {tmp_path}, but pushing them to the hub as me/labels failed "
                                        r"\(ConnectionError: \[Errno 101\] Network is unreachable\); rerun"):
        push_to_hub(str(tmp_path), "me/labels")


def test_compare_says_where_it_wrote_without_the_outputs_credentials(tmp_path, monkeypatch, capsys):
    """It printed `wrote s3://KEY:SECRET@bucket/out?endpoint_override=.../eval.md`: the secret, and a path
    after the query string."""
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["A?"], "answers": [["x"]]}), questions)
    monkeypatch.setattr(answer_job, "answer", lambda *a, **k: {})
    for name in ("evaluate", "write_reports", "print_tables"):
        monkeypatch.setattr(compare, name, lambda *a, **k: (None, None))
    output = "s3://KEY:SECRET@bucket/out?endpoint_override=127.0.0.1:1&scheme=http"
    compare.run(args_for(compare, "--questions", str(questions), "--output", output, "--strategy", "direct"))
    err = capsys.readouterr().err
    assert "SECRET" not in err and "into s3://***@bucket/out?endpoint_override" in err
