"""The ``ragsift`` command's handling of what goes wrong around a job."""

import argparse
import os
import types
from pathlib import Path

import pytest

from jobs.cli import _execute
from schemas.config import ConfigError
from schemas.errors import StageDown, UserError


def job_that_raises(error):
    def run(args):
        raise error
    return types.SimpleNamespace(run=run)


def test_ctrl_c_ends_a_job_with_one_line_saying_the_same_command_resumes(capsys):
    code = _execute("answer", job_that_raises(KeyboardInterrupt()), argparse.Namespace(debug=False))
    err = capsys.readouterr().err
    assert code == 130
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("ragsift answer: interrupted") and "same command resumes" in err


def test_ctrl_c_of_a_job_that_does_not_resume_says_only_that_it_was_interrupted(capsys):
    assert _execute("evaluate", job_that_raises(KeyboardInterrupt()), argparse.Namespace(debug=False)) == 130
    assert capsys.readouterr().err == "ragsift evaluate: interrupted\n"


def test_sigterm_ends_a_job_as_ctrl_c_does_with_status_143_and_gives_the_caller_its_handler_back(capsys):
    import os
    import signal
    import time

    mine = []
    before = signal.signal(signal.SIGTERM, lambda *_: mine.append("caller's"))
    try:
        def run(args):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises in here
            return 0

        assert _execute("answer", types.SimpleNamespace(run=run), argparse.Namespace(debug=False)) == 143
        assert capsys.readouterr().err == ("ragsift answer: terminated (SIGTERM); what was committed is kept, and the "
                                           "same command resumes from it\n")
        os.kill(os.getpid(), signal.SIGTERM)
        assert mine == ["caller's"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_storage_that_stops_answering_mid_run_says_the_committed_parts_are_kept_and_a_bad_path_does_not(capsys):
    """An S3 server gone mid-run ended the job with pyarrow's message alone, not a word of resuming."""
    gone = OSError("When uploading part for key 'out/rag/part-00003.parquet.tmp': AWS Error NETWORK_CONNECTION "
                   "during UploadPart operation: curlCode: 7, Couldn't connect to server")
    assert _execute("answer", job_that_raises(gone), argparse.Namespace(debug=False)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Couldn't connect to server" in err and "the same command resumes" in err
    missing = FileNotFoundError(2, "No such file or directory", "q.parquet")
    assert _execute("answer", job_that_raises(missing), argparse.Namespace(debug=False)) == 2
    assert "resumes" not in capsys.readouterr().err
    assert _execute("evaluate", job_that_raises(gone), argparse.Namespace(debug=False)) == 2
    assert "resumes" not in capsys.readouterr().err
    from ray.exceptions import GetTimeoutError

    # a damaged file, a Ray timeout: not storage that stopped answering, which a rerun mends
    for other in (OSError("Couldn't deserialize thrift: TProtocolException: Invalid data"),
                  GetTimeoutError("Get timed out: some object(s) not ready.")):
        assert _execute("answer", job_that_raises(other), argparse.Namespace(debug=False)) == 2
        assert "resumes" not in capsys.readouterr().err, other


def test_a_full_disk_names_the_file_and_says_to_free_space_and_rerun(capsys):
    """ENOSPC mid-run said "[Errno 28] Error writing bytes to file" alone: not which disk, nor that the run resumes."""
    full = OSError(28, "Error writing bytes to file. Detail: [errno 28] No space left on device",
                   "/runs/out/rag/part-00003.parquet")
    assert _execute("answer", job_that_raises(full), argparse.Namespace(debug=False)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/runs/out/rag/part-00003.parquet" in err
    assert "free space there and the same command resumes" in err
    assert _execute("evaluate", job_that_raises(full), argparse.Namespace(debug=False)) == 2
    assert "resumes" not in capsys.readouterr().err


def test_sigterm_that_lands_inside_a_ray_call_still_ends_the_job_as_terminated(capsys):
    """Ray's blocking calls check signals themselves and raise a KeyboardInterrupt of their own in place of the
    handler's exception: the job said "interrupted" and exited 130 under load (CI's box)."""
    import os
    import signal
    import time

    def run(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # as ray.get / ray.wait do
        return 0

    assert _execute("answer", types.SimpleNamespace(run=run), argparse.Namespace(debug=False)) == 143
    assert capsys.readouterr().err.startswith("ragsift answer: terminated (SIGTERM)")
    assert _execute("answer", job_that_raises(KeyboardInterrupt()), argparse.Namespace(debug=False)) == 130  # Ctrl-C


def test_sigterm_while_ray_starts_ends_the_job_as_terminated_not_with_rays_silent_status_15(capsys):
    """ray.init sets a handler of its own (sys.exit(signum)) while it runs: `timeout 4 ragsift answer ...` and a
    scheduler's stop in a run's first seconds ended it with status 15 and no word."""
    import os
    import signal
    import sys
    import time

    from jobs.ray_session import _sigterm_handler_kept

    def run(args):
        with _sigterm_handler_kept():
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # ray.init's, as Ray writes it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        return 0

    assert _execute("answer", types.SimpleNamespace(run=run), argparse.Namespace(debug=False)) == 143
    assert capsys.readouterr().err.startswith("ragsift answer: terminated (SIGTERM); what was committed is kept")


def test_ray_inits_handler_is_replaced_by_the_clis_again_but_not_once_the_clis_has_run():
    """The CLI's handler ignores a second SIGTERM once it ran (its clean-up must finish); restored after a
    ray.init it had interrupted, it would have raised again in the clean-up."""
    import signal

    from jobs.ray_session import _sigterm_handler_kept

    def cli(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, cli)
    try:
        with _sigterm_handler_kept():
            signal.signal(signal.SIGTERM, lambda *_: None)  # what ray.init sets
        assert signal.getsignal(signal.SIGTERM) is cli
        with pytest.raises(KeyboardInterrupt), _sigterm_handler_kept():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the CLI's handler, run inside ray.init
            raise KeyboardInterrupt
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_ctrl_c_with_debug_keeps_the_traceback():
    with pytest.raises(KeyboardInterrupt):
        _execute("answer", job_that_raises(KeyboardInterrupt()), argparse.Namespace(debug=True))


def test_a_user_error_is_one_line_and_exit_code_2(capsys):
    code = _execute("index", job_that_raises(FileNotFoundError("corpus.parquet: no such file")),
                    argparse.Namespace(debug=False))
    assert code == 2
    assert capsys.readouterr().err == "ragsift index: error: corpus.parquet: no such file\n"


PRINTS_UNTIL_STOPPED = """
import argparse, sys, time, types
from jobs.cli import _execute
def run(args):
    time.sleep(0.5)  # the reader has gone by now
    for _ in range(1000):
        print("x" * 1000, flush=True)
    return 0
sys.exit(_execute("evaluate", types.SimpleNamespace(run=run), argparse.Namespace(debug=False)))
"""


def test_a_reader_that_stops_reading_ends_the_job_quietly_as_sigpipe_would():
    """``ragsift evaluate | head -1``: was "error: [Errno 32] Broken pipe", exit 2."""
    import subprocess
    import sys
    from pathlib import Path

    job = subprocess.Popen([sys.executable, "-c", PRINTS_UNTIL_STOPPED], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    job.stdout.close()
    err = job.stderr.read()
    assert job.wait(timeout=60) == 141
    assert err == b""


def test_a_broken_pipe_that_is_not_standard_output_stays_a_one_line_error(capsys):
    assert _execute("answer", job_that_raises(BrokenPipeError(32, "Broken pipe")), argparse.Namespace(debug=False)) == 2
    assert capsys.readouterr().err == "ragsift answer: error: [Errno 32] Broken pipe\n"


@pytest.mark.parametrize("error", [UserError("q.parquet: no rows"), ConfigError("retrieval.k: must be > 0"),
                                   StageDown("stage generator: its actors cannot start (OSError: model weights not "
                                             "found); fix the cause and rerun the same command to resume")])
def test_what_the_user_can_fix_is_one_line_whichever_kind_of_user_error(error, capsys):
    assert _execute("answer", job_that_raises(error), argparse.Namespace(debug=False)) == 2
    assert capsys.readouterr().err == f"ragsift answer: error: {error}\n"


@pytest.mark.parametrize("bug", [KeyError("n_llm_calls"), ValueError("too many values to unpack")])
def test_a_key_or_value_error_from_ragsifts_own_code_is_a_bug_and_keeps_its_traceback(bug):
    # printed as "error: 'n_llm_calls'" with exit 2 it read as the user's mistake, with nothing to act on
    with pytest.raises(type(bug)):
        _execute("answer", job_that_raises(bug), argparse.Namespace(debug=False))


def test_bad_input_that_used_to_end_in_a_traceback_is_one_line(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.cli import main

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], "answers": [["x"]]}), questions)
    # a question file given where answers go (a KeyError on `strategy` before)
    assert main(["evaluate", "--answers", str(questions), "--questions", str(questions)]) == 2
    assert "is not a file of ragsift answers (no column ['strategy', 'answer'])" in capsys.readouterr().err
    # a binary file given as the config (a UnicodeDecodeError before)
    assert main(["answer", "--config", str(questions), "--questions", str(questions), "--output",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not valid YAML" in err


def test_a_damaged_index_manifest_or_run_metrics_is_said_not_a_traceback(tmp_path):
    from jobs.index import read_manifest
    from jobs.report import read_metrics

    (tmp_path / "manifest.json").write_text('{"shards": [')  # a writer killed mid-file
    with pytest.raises(UserError, match="is damaged .* rebuild the index"):
        read_manifest(tmp_path)
    (tmp_path / "metrics.json").write_text("{")
    assert read_metrics(tmp_path / "metrics.json") is None  # the run's answers are still reported
    (tmp_path / "metrics.json").write_bytes(b"\xff\xfe{")
    assert read_metrics(tmp_path / "metrics.json") is None


def test_an_answers_directory_counts_the_files_a_single_answers_file_would_be_accepted_as(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.evaluate import answer_files

    (tmp_path / "rag").mkdir()
    (tmp_path / "notes").mkdir()
    part = tmp_path / "rag" / "part-00000.parquet"
    pq.write_table(pa.table({"id": ["a"], "strategy": ["rag"], "answer": ["x"]}), part)
    # strategy and answer but no id: refused when named alone, so not an answer part inside a directory either
    pq.write_table(pa.table({"strategy": ["rag"], "answer": ["x"]}), tmp_path / "notes" / "x.parquet")
    assert answer_files(str(tmp_path)) == [str(part)]


@pytest.mark.parametrize("job", ["calibrate", "label", "sweep"])
def test_a_job_that_does_not_answer_error_rows_again_refuses_retry_errors_rather_than_ignore_it(job, capsys):
    import importlib

    from jobs.cli import JOBS, _parser

    with pytest.raises(SystemExit) as usage:
        _parser(job, importlib.import_module(JOBS[job][0])).parse_args(
            (["--param", "k", "--values", "1"] if job == "sweep" else []) + ["--retry-errors"])
    err = capsys.readouterr().err.splitlines()[-1]
    assert usage.value.code == 2 and "unrecognized arguments:" in err and err.endswith("--retry-errors")
    for answering in ("answer", "compare"):  # where it is carried out
        args = _parser(answering, importlib.import_module(JOBS[answering][0])).parse_args(["--retry-errors"])
        assert args.retry_errors


def _args(job: str, argv: list[str]):
    import importlib

    from jobs.cli import JOBS, _parser

    return _parser(job, importlib.import_module(JOBS[job][0])).parse_args(argv)


@pytest.fixture
def question_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], "answers": [["x"]]}), path)
    return str(path)


@pytest.mark.parametrize("path", ["/data/idx #2", "2024", "2024-06-01", "~", "*idx", "[v2]idx", "true"])
def test_a_path_or_model_flag_is_taken_as_it_stands_not_read_as_yaml(path, question_file, tmp_path):
    from jobs.answer import config_from_args
    from jobs.models import pinned

    # "/data/idx #2" was /data/idx (a comment), silently another index; the others were refused
    config = config_from_args(_args("answer", ["--questions", question_file, "--output", str(tmp_path / "o"),
                                                "--index-dir", path, "--generator", path]))
    # a model named by a local path is pinned to the folder it names ("~" is one: the home folder, for the index too)
    assert config.index.path == os.path.expanduser(path) and config.generator.model == pinned(path)


def test_jobs_that_pick_their_own_strategies_run_the_strategies_checks_and_need_questions(question_file, tmp_path,
                                                                                        capsys):
    from jobs.cli import main

    output = ["--questions", question_file, "--output", str(tmp_path / "o")]
    # raisf among compare's default strategies: a trained judge with no model was a TypeError in pool
    # building, and engine.max_depth under raisf.d_th was accepted
    for job, setting in [("compare", "raisf.judges=trained"), ("calibrate", "raisf.judges=trained"),
                         ("compare", "engine.max_depth=1")]:
        assert main([job, *output, "--set", setting]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("needs know.model" in err or "below raisf.d_th" in err), err
    for job in ("compare", "label", "calibrate", "answer"):  # a TypeError in a path function before
        assert main([job, "--output", str(tmp_path / "o")]) == 2
        assert "needs questions and an output: pass --questions and --output" in capsys.readouterr().err
    # sweep went on to start Ray and the models, then answered into ./None/<param>=<value>
    assert main(["sweep", "--param", "retrieval.k", "--values", "3,5", "--questions", question_file]) == 2
    assert "needs questions and an output" in capsys.readouterr().err
    assert main(["calibrate", *output, "--keep", "80"]) == 2  # an IndexError after the whole probe pass
    assert "--keep 80.0: a share of the questions, in (0, 1]" in capsys.readouterr().err
    assert main(["calibrate", *output, "--strategy", "rag"]) == 2  # ignored without a word before
    assert "calibrate runs its own probe" in capsys.readouterr().err


def test_two_config_files_on_the_command_line_layer_rather_than_the_second_replacing_the_first(question_file,
                                                                                             tmp_path):
    from jobs.answer import config_from_args

    mine, calibrated = tmp_path / "mine.yaml", tmp_path / "calibrated.yaml"
    mine.write_text("retrieval: {k: 3}\n")
    calibrated.write_text("raisf: {know_threshold: 0.9}\n")
    config = config_from_args(_args("answer", ["--questions", question_file, "--output", str(tmp_path / "o"),
                                               "--config", str(mine), "--config", str(calibrated)]))
    assert (config.retrieval.k, config.raisf.know_threshold) == (3, 0.9)


@pytest.mark.parametrize("job", ["answer", "compare", "calibrate", "export"])
def test_an_empty_strategy_name_is_refused_not_read_as_the_default_strategies(job, question_file, tmp_path, capsys):
    """``--strategy ''`` (an unset shell variable) answered with rag, the default."""
    from jobs.cli import main

    where = (["--answers", str(tmp_path), "--to", str(tmp_path / "x.jsonl")] if job == "export"
             else ["--questions", question_file, "--output", str(tmp_path / "o")])
    assert main([job, *where, "--strategy", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--strategy ''" in err, err


def test_ragsifts_help_says_what_it_is_in_a_whole_sentence(capsys):
    """Its description was the module docstring's first line, cut mid-sentence: "The ``ragsift`` command.
    Each subcommand is one module under ``jobs`` with"."""
    from jobs.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "question answering as a distributed batch job on Ray, vLLM and FAISS" in out and " with positional" not in out


def test_a_bad_dtype_or_a_model_folder_without_a_model_is_one_line_naming_it_before_ray_starts(question_file, tmp_path,
                                                                                               capsys, monkeypatch):
    """Both failed inside the vLLM replica, after Ray and the actors started, the cause shown being pydantic's
    help link ("For further information visit https://errors.pydantic.dev/...")."""
    import jobs.ray_session
    from jobs.cli import main

    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *args: pytest.fail("Ray started"))
    answer = ["answer", "--questions", question_file, "--strategy", "direct"]
    assert main([*answer, "--output", str(tmp_path / "o1"), "--set", "generator.dtype=float63"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generator.dtype: Input should be 'auto', 'half'" in err, err
    empty = tmp_path / "empty model"
    empty.mkdir()
    assert main([*answer, "--output", str(tmp_path / "o2"), "--generator", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the model folder {empty} holds no config.json" in err, err
    (empty / "config.json").write_text("{}")
    assert main([*answer, "--output", str(tmp_path / "o3"), "--generator", str(empty)]) == 2
    assert "holds no weights (*.safetensors, *.bin, *.pt)" in capsys.readouterr().err
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_a_relative_output_in_a_ray_jobs_uploaded_working_dir_is_refused_and_inputs_shipped_with_it_are_read(
        question_file, tmp_path, capsys, monkeypatch):
    """`ray job submit --working-dir . -- ... --output runs/x` wrote the answers into Ray's unpacked copy of the
    upload (runtime_resources/working_dir_files/_ray_pkg_<hash>/runs/x): lost to the user, and a resubmission
    from a changed checkout started over."""
    import shutil

    import jobs.ray_session
    from jobs.cli import main
    from jobs.storage import check_kept

    package = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    (package / "data").mkdir(parents=True)
    shutil.copy(question_file, package / "data" / "q.parquet")  # data shipped with the job
    monkeypatch.chdir(package)

    def no_ray(*args):
        raise UserError("Ray would start here")

    monkeypatch.setattr(jobs.ray_session, "init_ray", no_ray)
    answer = ["answer", "--questions", "data/q.parquet", "--strategy", "direct", "--generator", "smollm2-135m-instruct"]
    assert main([*answer, "--output", "runs/x"]) == 2
    err = capsys.readouterr().err
    said = (f"--output runs/x: a relative path in a Ray job lands in Ray's copy of the uploaded working dir ({package}), "
            "not where you can keep or resume it; pass an absolute path or a URI")
    assert err.count("\n") == 1 and said in err, err
    assert main(["index", "--corpus", "data/q.parquet", "--index-dir", "idx"]) == 2
    assert "--index-dir idx: a relative path in a Ray job" in capsys.readouterr().err
    assert not (package / "runs").exists() and not (package / "idx").exists()
    # the relative questions inside the upload are read, and an absolute output or a URI is taken
    assert main([*answer, "--output", str(tmp_path / "kept")]) == 2
    assert "Ray would start here" in capsys.readouterr().err
    check_kept("s3://bucket/answers")
    monkeypatch.chdir(tmp_path)
    check_kept("runs/x")  # outside a Ray job a relative output is the user's own folder


def test_every_job_refuses_a_relative_output_in_a_ray_jobs_working_dir_before_it_writes_or_starts_ray(
        question_file, tmp_path, capsys, monkeypatch):
    """sweep was refused only after a local Ray had started; evaluate / report --out, export --to, train and
    demo --output were not checked at all; answer converted a JSON Lines input into the lost folder first."""
    import shutil

    import jobs.ray_session
    from jobs.cli import main

    package = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123abcd"
    (package / "data").mkdir(parents=True)
    shutil.copy(question_file, package / "data" / "q.parquet")
    (package / "data" / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    monkeypatch.chdir(package)

    def no_ray(*args):
        raise AssertionError("Ray started")

    monkeypatch.setattr(jobs.ray_session, "init_ray", no_ray)
    runs = {
        "--output out/a": ["answer", "--questions", "data/q.jsonl", "--strategy", "direct", "--output", "out/a"],
        "--output out/s": ["sweep", "--param", "retrieval.k", "--values", "1,2", "--questions", "data/q.parquet",
                           "--output", "out/s", "--strategy", "rag"],
        "--out out/e": ["evaluate", "--answers", str(tmp_path), "--questions", "data/q.parquet", "--out", "out/e"],
        "--out out/r.html": ["report", "--runs", str(tmp_path), "--questions", "data/q.parquet", "--out", "out/r.html"],
        "--to out/x.jsonl": ["export", "--answers", str(tmp_path), "--to", "out/x.jsonl"],
        "--output out/m": ["train", "know", "--labels", str(tmp_path), "--output", "out/m"],
        "--output out/d": ["demo", "--output", "out/d"],
    }
    for said, argv in runs.items():
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{said}: a relative path in a Ray job" in err and err.count("\n") == 1, err
    assert not (package / "out").exists()


def test_a_uri_with_credentials_in_an_error_is_said_without_them(capsys):
    """evaluate / calibrate / index / train errors quoted `s3://KEY:SECRET@bucket/...` as given."""
    error = UserError("s3://KEY:SECRET@bucket/nope?endpoint_override=127.0.0.1:5055 does not exist; "
                      "nor does gs://K:S/ECRET@b/x")
    assert _execute("evaluate", job_that_raises(error), argparse.Namespace(debug=False)) == 2
    assert capsys.readouterr().err == ("ragsift evaluate: error: s3://***@bucket/nope?endpoint_override=127.0.0.1:5055 "
                                       "does not exist; nor does gs://***@b/x\n")


def test_a_uri_whose_credentials_were_left_out_when_recorded_is_refused_saying_so():
    """`--config config.yaml` of a run whose URIs held credentials: pyarrow sent '***' as the key
    (ACCESS_DENIED), whatever the environment held."""
    from jobs.storage import filesystem

    with pytest.raises(UserError, match=r"s3://\*\*\*@b/out: its credentials were left out where it was recorded"):
        filesystem("s3://***@b/out")


def test_a_whole_number_written_with_an_exponent_is_a_whole_number():
    """YAML reads 1e0 as text, which pydantic refused for an int: `sweep --values 1,1e0` over retrieval.k failed
    where README says 1 and 1e0 are one value; a fractional one is still refused, naming the field."""
    from schemas.config import ConfigError, load_config
    from strategies.registry import AnswerConfig

    config = load_config(AnswerConfig, None, ["retrieval.k=1e0", "sampling.max_tokens=1E2", "think_act.beta_threshold=5e-1"])
    assert (config.retrieval.k, config.sampling.max_tokens, config.think_act.beta_threshold) == (1, 100, 0.5)
    with pytest.raises(ConfigError, match="retrieval.k: Input should be a valid integer, got a number with a fractional"):
        load_config(AnswerConfig, None, ["retrieval.k=1.5e0"])


def test_help_offers_each_job_the_strategies_it_takes():
    """calibrate's help offered --strategy, which it refuses; label's offered nine strategies of which it runs two."""
    import importlib

    from jobs.cli import JOBS, _parser

    helps = {job: _parser(job, importlib.import_module(JOBS[job][0])).format_help() for job in ("calibrate", "label", "answer")}
    assert "--strategy" not in helps["calibrate"]
    assert "raisf_labels (RA-ISF's kinds" in helps["label"] and "'rag'" not in helps["label"]
    assert "'rag'" in helps["answer"] and "calibration_probe" not in helps["answer"] and "CSV" in helps["answer"]


def test_answer_and_compare_exit_3_when_every_row_of_their_output_is_an_error_row(question_file, tmp_path, monkeypatch,
                                                                                  capsys):
    from jobs import answer as answer_job
    from jobs import compare as compare_job
    from jobs.cli import main

    def output(rows, errors):
        return lambda *args, **kwargs: {"exactly_once": {"rag": {"rows": rows, "errors": errors}}}

    monkeypatch.setattr(answer_job, "answer", output(1, 1))
    monkeypatch.setattr(compare_job, "evaluate", lambda *args, **kwargs: ([], []))
    monkeypatch.setattr(compare_job, "write_reports", lambda *args, **kwargs: [])
    monkeypatch.setattr(compare_job, "print_tables", lambda *args, **kwargs: None)
    flags = ["--questions", question_file, "--output", str(tmp_path / "o"), "--strategy", "rag"]
    assert main(["answer", *flags]) == 3
    assert main(["compare", *flags]) == 3
    assert capsys.readouterr().err.count("rows are error rows (all of them)") == 2
    monkeypatch.setattr(answer_job, "answer", output(2, 1))
    assert main(["answer", *flags]) == 0
    assert main(["answer", *flags, "--set", "commit.max_error_share=0.25"]) == 3


def test_label_exits_3_when_every_row_it_answered_is_an_error_row(question_file, tmp_path, monkeypatch, capsys):
    """A label run whose every prompt failed published an empty dataset and exited 0."""
    import json

    from jobs import label as label_job
    from jobs.cli import main

    def labelled(errors):
        def label(config, **kwargs):
            Path(config.output).mkdir(exist_ok=True)
            Path(config.output, "metrics.json").write_text(json.dumps(
                {"exactly_once": {"raisf_labels": {"rows": 4, "errors": errors}}}))
            return {}
        return label

    flags = ["--questions", question_file, "--output", str(tmp_path / "o")]
    pushed = []
    monkeypatch.setattr(label_job, "push_to_hub", lambda folder, repo: pushed.append(repo))
    monkeypatch.setattr(label_job, "check_hub_repo", lambda repo: None)
    monkeypatch.setattr(label_job, "label", labelled(4))
    assert main(["label", *flags, "--push-to-hub", "me/labels"]) == 3 and pushed == []  # nothing published
    err = capsys.readouterr().err
    assert "4 of the output's 4 rows are error rows (all of them)" in err and "a new --output labels them anew" in err
    assert "--retry-errors" not in err  # label has none
    monkeypatch.setattr(label_job, "label", labelled(1))
    assert main(["label", *flags, "--push-to-hub", "me/labels"]) == 0 and pushed == ["me/labels"]


def test_an_unknown_flag_is_refused_with_the_jobs_own_usage(capsys):
    """`ragsift answer --bogus` printed the top-level usage (`ragsift [-h] {demo,index,...}`), not answer's."""
    from jobs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["answer", "--questions", "q.parquet", "--bogus", "1"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "usage: ragsift answer" in err
    assert err.rstrip().endswith("ragsift answer: error: unrecognized arguments: --bogus 1")


def test_a_verdict_cut_with_strategies_that_answer_claims_in_text_is_said_to_pass_them_by():
    from jobs.answer import cut_not_taken
    from strategies.registry import AnswerConfig

    assert cut_not_taken(AnswerConfig(strategies=["rag", "self_reasoning"])) is None  # no cut
    said = cut_not_taken(AnswerConfig(strategies=["rag", "self_reasoning", "migres"], answer_form={"verdict_cut": 0.2}))
    assert said.startswith("answer_form.verdict_cut decides a claim's verdict where it is a choice; self_reasoning answers")
    assert cut_not_taken(AnswerConfig(strategies=["rag", "migres"], answer_form={"verdict_cut": 0.2})) is None
    assert "migres" in cut_not_taken(AnswerConfig(strategies=["migres"], answer_form={"verdict_cut": 0.2},
                                                  migres={"answer_step": "main"}))
