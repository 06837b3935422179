"""The driver is killed mid-run (SIGKILL); the same command resumes and the output is exactly once and
equal to an undisturbed run. Stub actors (tests/jobs/resume_run.py) keep it fast."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]


def start(questions, output, *flags):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen([sys.executable, "-m", "tests.jobs.resume_run", str(questions), str(output), *flags],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc):
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    return out


def rows(output):
    table = pq.read_table(output / "rag").to_pylist() + pq.read_table(output / "direct").to_pylist()
    return sorted((r["strategy"], r["id"], r["answer"], tuple(r["retrieved_ids"]), r["error"]) for r in table)


def test_killed_driver_resumes_exactly_once(tmp_path):
    questions = tmp_path / "q.parquet"
    ids = [f"q{i}" for i in range(60)] + ["q5"]  # a duplicate id: answered once
    pq.write_table(pa.table({"id": ids, "question": [f"question {i}" for i in range(61)]}), questions,
                   row_group_size=16)
    calm = tmp_path / "calm"
    finish(start(questions, calm))

    out = tmp_path / "out"
    proc = start(questions, out)
    deadline = time.time() + 120
    while len(list((out / "rag").glob("part-*.parquet"))) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.name for p in (out / "rag").glob("part-*.parquet")}
    assert 2 <= len(done_before) < 7

    log = finish(start(questions, out))
    assert "resuming" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["shards_resumed"] >= 1 and metrics["duplicate_ids_dropped"] == 1
    assert all(c == {"rows": 60, "expected": 60, "duplicated": 0, "missing": 0, "unexpected": 0, "errors": 0,
                   "ok": True}
               for c in metrics["exactly_once"].values())
    assert metrics["roots_done"] < 2 * 60  # committed shards were not answered again
    assert rows(out) == rows(calm) and len(rows(out)) == 120
    assert not list(out.rglob("*.tmp"))


def test_sigterm_ends_a_run_as_ctrl_c_does_and_the_same_command_resumes_it(tmp_path):
    """SIGTERM (a scheduler's stop, `timeout`, `ray job stop`) went to Ray's handler: a stack dump and exit
    134, as if the job had crashed, without a word of what was kept."""
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(60)], "question": [f"question {i}" for i in range(60)]}),
                   questions, row_group_size=16)
    out = tmp_path / "out"
    proc = start(questions, out, "--as-cli")
    deadline = time.time() + 120
    while len(list((out / "rag").glob("part-*.parquet"))) < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    said, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, said[-3000:]
    assert said.rstrip().endswith("ragsift answer: terminated (SIGTERM); what was committed is kept, and the same "
                                  "command resumes from it"), said[-3000:]
    assert "SIGTERM received" not in said and not (out / "_lease.json").exists()
    committed = len(list((out / "rag").glob("part-*.parquet")))
    assert 1 <= committed < 6

    log = finish(start(questions, out, "--as-cli"))
    assert "resuming" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert all(c["ok"] and c["rows"] == 60 for c in metrics["exactly_once"].values())


def test_a_resume_with_nothing_to_do_starts_nothing_and_keeps_the_runs_metrics(tmp_path, monkeypatch):
    """Before, it started Ray (17 s) and overwrote metrics.json with zeros."""
    import jobs.ray_session
    from jobs.answer import answer
    from strategies.registry import AnswerConfig

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(15)], "question": [f"question {i}" for i in range(15)]}),
                   questions)
    finish(start(questions, out))  # the same settings as tests/jobs/resume_run.py
    before = (out / "metrics.json").read_bytes()

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started with nothing to do")
    monkeypatch.setattr(jobs.ray_session, "init_ray", no_ray)
    log = []
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct", "rag"],
                          commit={"shard_rows": 10}, engine={"window": 8})
    metrics = answer(config, log=log.append)
    assert "nothing to do" in log[-1] and (out / "metrics.json").read_bytes() == before
    assert metrics["roots_done"] == 30 and all(c["ok"] for c in metrics["exactly_once"].values())


def test_a_run_killed_after_its_last_commit_gets_its_record_from_the_rerun(tmp_path, monkeypatch):
    """Before, a kill between the last part's rename and metrics.json left no metrics.json / config.yaml
    (or one of fewer strategies) that no rerun wrote: "nothing to do" returned and wrote nothing."""
    import json

    import jobs.ray_session
    from jobs.answer import answer
    from strategies.registry import AnswerConfig

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(15)], "question": [f"question {i}" for i in range(15)]}),
                   questions)
    finish(start(questions, out))
    earlier = json.loads((out / "metrics.json").read_text())
    (out / "metrics.json").unlink()
    (out / "config.yaml").unlink()
    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *a, **k: (_ for _ in ()).throw(AssertionError("Ray")))
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct", "rag"],
                          commit={"shard_rows": 10}, engine={"window": 8})
    metrics = answer(config, log=lambda *_: None)
    recorded = json.loads((out / "metrics.json").read_text())
    assert recorded == metrics and recorded["exactly_once"] == earlier["exactly_once"]
    assert recorded["files"] == earlier["files"] and recorded["config_sha256"] == earlier["config_sha256"]
    assert "strategies:\n- direct\n- rag" in (out / "config.yaml").read_text()
    assert answer(config, log=lambda *_: None) == recorded  # and is kept from then on
    before = (out / "metrics.json").read_bytes()
    one = AnswerConfig(questions=str(questions), output=str(out), strategies=["rag"], commit={"shard_rows": 10},
                       engine={"window": 8})
    answer(one, log=lambda *_: None)  # a rerun of one of the strategies: the record already covers it
    assert (out / "metrics.json").read_bytes() == before


def test_a_finished_run_on_a_read_only_mount_has_nothing_to_do_and_an_unfinished_one_is_refused(tmp_path, monkeypatch):
    """A pipeline that runs `answer` before it evaluates, on a node that mounts the runs read-only: the rerun of
    a finished run failed with EROFS at its lease, a file, instead of saying there is nothing to do. On a real
    read-only bind mount (this needs root, as CI and the dev box have)."""
    import shutil

    import jobs.ray_session
    from jobs.answer import answer
    from schemas.errors import UserError
    from strategies.registry import AnswerConfig

    questions, out = tmp_path / "q.parquet", tmp_path / "runs" / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(15)], "question": [f"question {i}" for i in range(15)]}),
                   questions)
    finish(start(questions, out))
    before = (out / "metrics.json").read_bytes()
    shutil.copytree(out, tmp_path / "runs" / "half")
    (tmp_path / "runs" / "half" / "rag" / "part-00001.parquet").unlink()
    # a part whose bytes changed after its commit, and one rewritten whole with a question twice: "nothing to do"
    # read only the manifest's counts, where a resume would answer the first again and refuse the second
    shutil.copytree(out, tmp_path / "runs" / "damaged")
    with open(tmp_path / "runs" / "damaged" / "rag" / "part-00001.parquet", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    shutil.copytree(out, tmp_path / "runs" / "twice")
    twice(tmp_path / "runs" / "twice" / "direct" / "part-00000.parquet")
    runs = tmp_path / "ro"
    runs.mkdir()
    mounted = runs / "out"
    if subprocess.run(["mount", "--bind", str(tmp_path / "runs"), str(runs)], capture_output=True).returncode:
        pytest.skip("no bind mounts here (not root)")
    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *a, **k: (_ for _ in ()).throw(AssertionError("Ray")))
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(runs)], check=True, capture_output=True)
        config = AnswerConfig(questions=str(questions), output=str(mounted), strategies=["direct", "rag"],
                              commit={"shard_rows": 10}, engine={"window": 8})
        log = []
        metrics = answer(config, log=log.append)
        assert log == [f"nothing to do: every strategy's parts of {mounted} are committed (read-only here: nothing written)"]
        assert metrics["roots_done"] == 30 and (mounted / "metrics.json").read_bytes() == before
        with pytest.raises(UserError, match="cannot write there .*--force and --retry-errors write there"):
            answer(config, log=log.append, retry_errors=True)
        with pytest.raises(UserError, match="cannot write there .*it has no answers of least_to_most"):
            answer(config.model_copy(update={"strategies": ["direct", "least_to_most"]}), log=log.append)
        with pytest.raises(UserError, match=r"cannot write there .*is not finished .*rag has 1 of its 2 parts"):
            answer(config.model_copy(update={"output": str(runs / "half")}), log=log.append)
        with pytest.raises(UserError, match=r"cannot write there .*1 part\(s\) fail the checks a resume makes "
                                            r"\(rag/part-00001.parquet: damaged"):
            answer(config.model_copy(update={"output": str(runs / "damaged")}), log=log.append)
        with pytest.raises(UserError, match=r"cannot write there .*exactly-once check fails "
                                            r"\(direct: 0 missing, 1 duplicated, e.g. q0 2 times\)"):
            answer(config.model_copy(update={"output": str(runs / "twice")}), log=log.append)
        with pytest.raises(UserError, match="holds output of a different run"):
            answer(config.model_copy(update={"commit": config.commit.model_copy(update={"shard_rows": 5})}), log=log.append)
    finally:
        subprocess.run(["umount", str(runs)], capture_output=True)


def twice(part):
    """``part`` rewritten whole with its first row again, its checksum made to match: a part changed after its commit."""
    table = pq.read_table(part)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]).replace_schema_metadata(table.schema.metadata), part)
    (part.parent / f"_{part.name}.sha256").write_text(json.dumps(
        {"sha256": hashlib.sha256(part.read_bytes()).hexdigest(), "rows": table.num_rows + 1}))


def test_a_finished_output_holding_a_question_twice_is_refused_in_one_line_not_a_traceback(tmp_path, monkeypatch):
    """Every part committed and whole, but one holds a question twice: the rerun raised RuntimeError("output
    incomplete: check {...}") with a traceback (exit 1), where the read-only path refuses it in one line."""
    import jobs.ray_session
    from jobs.answer import answer
    from schemas.errors import UserError
    from strategies.registry import AnswerConfig

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(15)], "question": [f"question {i}" for i in range(15)]}),
                   questions)
    finish(start(questions, out))
    twice(out / "direct" / "part-00000.parquet")
    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *a, **k: (_ for _ in ()).throw(AssertionError("Ray")))
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct", "rag"],
                          commit={"shard_rows": 10}, engine={"window": 8})
    with pytest.raises(UserError, match=r"every part is committed, but its exactly-once check fails "
                                        r"\(direct: 0 missing, 1 duplicated, e.g. q0 2 times\).* --force answers"):
        answer(config, log=lambda *_: None)


def test_questions_converted_before_are_found_on_a_read_only_mount_and_new_ones_are_refused_in_one_line(tmp_path):
    """A JSON Lines / CSV / datasets input is converted into <output>/_input before the run looks at its output:
    on a read-only mount that write failed with EROFS, before "nothing to do" could be said."""
    from jobs.question_sources import write_input
    from schemas.errors import UserError

    runs, mounted = tmp_path / "runs", tmp_path / "ro"
    (runs / "out").mkdir(parents=True)
    mounted.mkdir()
    table = pa.table({"id": ["a", "b"], "question": ["Who?", "Where?"]})
    copy = write_input(table, str(runs / "out"))
    if subprocess.run(["mount", "--bind", str(runs), str(mounted)], capture_output=True).returncode:
        pytest.skip("no bind mounts here (not root)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)], check=True, capture_output=True)
        assert write_input(table, str(mounted / "out")) == copy.replace(str(runs), str(mounted))
        with pytest.raises(UserError, match="cannot write there .*converted copy is not in it"):
            write_input(pa.table({"id": ["c"], "question": ["When?"]}), str(mounted / "out"))
    finally:
        subprocess.run(["umount", str(mounted)], capture_output=True)
