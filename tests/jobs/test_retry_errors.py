"""``ragsift answer --retry-errors``: the error rows of a finished run are answered again in place; every
other row and every part without errors stays as it was, and each id is still there once."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.stages import GeneratorStage
from jobs.answer import answer
from schemas.config import ConfigError, StageBatching
from schemas.records import Generation
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeGenerator

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


class Healed:
    """The replica once its fault is fixed: answers every request (the question with POISON cleaned
    out), and says what it was asked."""

    def __init__(self):
        self.asked = []

    def generate(self, batch):
        texts = [r.messages[-1][1].splitlines()[0].replace("POISON", "p") for r in batch]
        self.asked += texts
        return [Generation("healed:" + t, 3, 2) for t in texts]

    def requests(self):
        return self.asked


def run(ray, questions, output, generator, retry_errors=False):
    actor = ray.remote(generator).options(num_cpus=0).remote()
    config = AnswerConfig(questions=str(questions), output=str(output), strategies=["direct"],
                          commit={"shard_rows": 10}, engine={"window": 8, "max_attempts": 2})
    metrics = answer(config, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())},
                     retry_errors=retry_errors)
    return metrics, actor


def test_retry_errors_answers_only_the_error_rows_again_and_keeps_every_other_row(ray_session, tmp_path):
    ray = ray_session
    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    texts = [f"question {i}" + (" POISON" if i in (3, 24) else "") for i in range(25)]
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(25)], "question": texts}), questions)
    run(ray, questions, out, FakeGenerator)
    before = {r["id"]: r for r in pq.read_table(out / "direct").to_pylist()}
    assert {i for i, r in before.items() if r["error"]} == {"q3", "q24"}
    untouched = (out / "direct" / "part-00001.parquet").read_bytes()  # shard 1 (q10..q19) has no error

    metrics, healed = run(ray, questions, out, Healed, retry_errors=True)
    after = {r["id"]: r for r in pq.read_table(out / "direct").to_pylist()}
    assert sorted(ray.get(healed.requests.remote())) == ["Question: question 24 p", "Question: question 3 p"]  # nothing else
    assert metrics["errors_retried"] == 2 and metrics["roots_done"] == 2
    assert all(c["ok"] and c["rows"] == 25 for c in metrics["exactly_once"].values())
    assert after["q3"]["error"] is None and after["q3"]["answer"] == "healed:Question: question 3 p"
    assert after["q24"]["error"] is None
    assert {i: r for i, r in after.items() if i not in ("q3", "q24")} == \
        {i: r for i, r in before.items() if i not in ("q3", "q24")}
    assert (out / "direct" / "part-00001.parquet").read_bytes() == untouched
    assert not list(out.rglob("*.tmp"))

    log = []
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct"],
                          commit={"shard_rows": 10}, engine={"window": 8, "max_attempts": 2})
    answer(config, log=log.append, retry_errors=True)  # no error left: nothing starts
    assert "nothing to do" in log[-1]


def test_a_part_written_before_a_column_was_added_is_retried_with_that_column_null(ray_session, tmp_path):
    """Reopening a part cast its rows to today's schema, which failed for a part without n_truncated."""
    import hashlib
    import json

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    texts = [f"question {i}" + (" POISON" if i == 3 else "") for i in range(10)]
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(10)], "question": texts}), questions)
    run(ray_session, questions, out, FakeGenerator)
    part = out / "direct" / "part-00000.parquet"
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["n_truncated"]), part)  # as an earlier ragsift wrote it, metadata kept
    (out / "direct" / "_part-00000.parquet.sha256").write_text(
        json.dumps({"sha256": hashlib.sha256(part.read_bytes()).hexdigest(), "rows": 10}))

    metrics, _ = run(ray_session, questions, out, Healed, retry_errors=True)
    after = {r["id"]: r for r in pq.read_table(part).to_pylist()}
    assert metrics["errors_retried"] == 1 and after["q3"]["error"] is None and after["q3"]["n_truncated"] == 0
    before = {r["id"]: r for r in table.to_pylist()}
    assert after["q0"]["n_truncated"] is None and after["q0"]["answer"] == before["q0"]["answer"]


def test_a_retry_whose_start_fails_leaves_no_reopened_part_open_and_the_old_parts_as_they_were(
        ray_session, tmp_path, monkeypatch):
    import jobs.answer as answer_job

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    texts = [f"question {i}" + (" POISON" if i == 3 else "") for i in range(10)]
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(10)], "question": texts}), questions)
    run(ray_session, questions, out, FakeGenerator)
    committed = (out / "direct" / "part-00000.parquet").read_bytes()
    outputs = []

    class Recorded(answer_job.ShardedOutput):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            outputs.append(self)

    def no_metrics(*_):
        raise RuntimeError("metrics exporter down")

    monkeypatch.setattr(answer_job, "ShardedOutput", Recorded)
    monkeypatch.setattr(answer_job, "RayMetrics", no_metrics)  # fails after the error part was reopened
    with pytest.raises(RuntimeError, match="exporter down"):
        run(ray_session, questions, out, Healed, retry_errors=True)
    assert len(outputs) == 1 and outputs[0].retrying and outputs[0].open == {}  # reopened, then closed
    assert (out / "direct" / "part-00000.parquet").read_bytes() == committed


def test_a_resume_says_what_each_strategy_had_committed_though_no_shard_is_done_for_all(ray_session, tmp_path):
    """A killed run leaves parts of some strategies only: the resume said nothing of them and recorded
    shards_resumed 0, as if the run had started afresh."""
    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(25)], "question": [f"question {i}" for i in range(25)]}),
                   questions)
    run(ray_session, questions, out, FakeGenerator)  # direct: parts 0-2
    actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct", "least_to_most"],
                          commit={"shard_rows": 10}, engine={"window": 8})
    lines = []
    metrics = answer(config, log=lines.append, stages={"generator": GeneratorStage([actor], StageBatching())})
    assert "resuming: 0 of 3 input shards committed for every strategy; parts committed before: direct 3/3, " \
           "least_to_most 0/3" in lines
    assert metrics["shards_resumed"] == 0 and metrics["parts_resumed"] == {"direct": 3, "least_to_most": 0}
    assert metrics["roots_done"] == 25  # least_to_most's only


def test_a_model_named_by_a_relative_path_is_the_folder_it_named_in_the_record_and_on_resume(ray_session, tmp_path,
                                                                                             monkeypatch):
    """config.yaml said `model: ./m`: `--config config.yaml` from another folder loaded that folder's ./m and
    resumed the run with it, two models' answers in one output."""
    import yaml

    from schemas.config import load_config
    from schemas.errors import UserError

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["question 0", "question 1"]}), questions)
    for folder in ("a", "b"):
        (tmp_path / folder / "m").mkdir(parents=True)
    stages = lambda: {"generator": GeneratorStage([ray_session.remote(FakeGenerator).options(num_cpus=0).remote()],  # noqa: E731
                                                  StageBatching())}
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct"], generator={"model": "./m"})
    monkeypatch.chdir(tmp_path / "a")
    answer(config, log=lambda *_: None, stages=stages())
    assert yaml.safe_load((out / "config.yaml").read_text())["generator"]["model"] == str(tmp_path / "a" / "m")
    monkeypatch.chdir(tmp_path / "b")
    lines = []
    answer(load_config(AnswerConfig, str(out / "config.yaml")), log=lines.append, stages=stages())
    assert "nothing to do" in lines[-1]  # the record names a/m: the same run
    with pytest.raises(UserError, match="generator.model"):  # ./m here is b/m: another model
        answer(config, log=lambda *_: None, stages=stages())


def test_a_run_whose_rows_are_all_errors_or_over_the_configured_share_exits_3_with_everything_committed(
        ray_session, tmp_path, capsys):
    """Every prompt over the context window: the run said "5 of them error rows" and exited 0, so a `set -e`
    pipeline went on to publish error rows as answers. Counted over the whole output: a resume that answers
    the last questions well does not make a run of error rows a success."""
    from jobs.answer import ERROR_ROWS_STATUS, error_status

    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(4)],
                             "question": [f"question {i}" + (" POISON" if i else "") for i in range(4)]}), questions)
    actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct"], engine={"max_attempts": 1},
                          commit={"shard_rows": 2})
    metrics = answer(config, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())})
    assert metrics["exactly_once"]["direct"]["errors"] == 3 and metrics["exactly_once"]["direct"]["rows"] == 4
    assert error_status("answer", metrics, None) == 0  # not all: by default a pipeline goes on
    assert error_status("answer", metrics, 0.5) == ERROR_ROWS_STATUS == 3
    assert "3 of the output's 4 rows are error rows (more than commit.max_error_share 0.5)" in capsys.readouterr().err
    assert error_status("answer", metrics, 0.75) == 0 and error_status("answer", {"roots_done": 0}, 0.0) == 0
    # the rerun that finds every part committed answers nothing, and says what the output holds
    again = answer(config, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())})
    assert error_status("answer", again, 0.5) == 3


def test_retry_errors_with_force_over_a_changed_config_is_refused_and_keeps_the_output(ray_session, tmp_path):
    """`--retry-errors --force` with a changed config discarded every committed answer, then answered them all."""
    ray = ray_session
    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["question 0", "question 1 POISON"]}), questions)
    run(ray, questions, out, FakeGenerator)
    before = (out / "direct" / "part-00000.parquet").read_bytes()
    actor = ray.remote(Healed).options(num_cpus=0).remote()
    changed = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct"], sampling={"max_tokens": 9},
                           commit={"shard_rows": 10}, engine={"window": 8, "max_attempts": 2})
    with pytest.raises(ConfigError, match=r"differs in: sampling\.max_tokens.*leave out --retry-errors"):
        answer(changed, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())},
               force=True, retry_errors=True)
    assert (out / "direct" / "part-00000.parquet").read_bytes() == before
    assert ray.get(actor.requests.remote()) == []
