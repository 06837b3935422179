"""Every bad-row case of tests/data/bad_questions.parquet through ``answer()`` (stub actors): each
follows the documented policy, no row is lost or duplicated, the good rows are answered."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine.stages import GeneratorStage, RetrieverStage
from jobs.answer import answer
from schemas.config import StageBatching
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeEncoder, FakeGenerator, FakeShard

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

BAD = Path(__file__).parent.parent / "data" / "bad_questions.parquet"


def test_bad_rows_follow_the_policy_and_nothing_is_lost(ray_session, tmp_path):
    ray = ray_session
    stages = {
        "generator": GeneratorStage([ray.remote(FakeGenerator).options(num_cpus=0).remote()], StageBatching()),
        "retriever": RetrieverStage([ray.remote(FakeEncoder).options(num_cpus=0).remote()],
                                    [ray.remote(FakeShard).options(num_cpus=0).remote("a")], StageBatching()),
    }
    config = AnswerConfig(questions=str(BAD), output=str(tmp_path / "out"), strategies=["direct", "rag"])
    said = []
    metrics = answer(config, log=said.append, stages=stages)

    assert metrics["duplicate_ids_dropped"] == 1
    assert "1 question row repeats an earlier row's id: each id is answered once, for its first row" in said[0]
    assert all(c["ok"] and c["rows"] == 11 for c in metrics["exactly_once"].values())
    expected = {r["id"] or "<row 1>": r["expected"] for r in pq.read_table(BAD, columns=["id", "expected"]).to_pylist()}
    for strategy in ("direct", "rag"):
        rows = {r["id"]: r for r in pq.read_table(tmp_path / "out" / strategy).to_pylist()}
        assert rows.keys() == expected.keys()
        for qid, row in rows.items():
            if expected[qid].startswith("error"):
                assert expected[qid].removeprefix("error: ") in (row["error"] or ""), (qid, row["error"])
            else:
                assert row["error"] is None and row["answer"].startswith("echo:"), (qid, row)
        assert rows["control"]["question"] == "What is the capital of France?"
        assert rows["dup"]["question"] == "Which river flows through Paris?"
        assert len(rows["huge"]["question"]) == 200  # the output keeps the start of a too-long question
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["roots_done"] == 22
    # the last line says how many rows are errors, and why most of them are (before: as if all were answered)
    errors = sum(e.startswith("error") for e in expected.values())
    assert metrics["error_rows"] == {"direct": errors, "rag": errors}
    assert f"; {2 * errors} of them error rows (direct {errors}, rag {errors}), most often " in said[-1]


def test_a_run_says_which_kinds_its_answer_forms_name_otherwise_within_its_limit(ray_session, tmp_path):
    import pyarrow as pa

    from jobs.questions import value_counts

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(5)], "question": [f"Is {i} odd?" for i in range(5)],
                             "kind": ["yes_no", "yes_no", None, "yes-no", "Yes-No"]}), questions)
    assert value_counts(str(questions), "kind", 3, batch_rows=2) == {"yes_no": 2}
    assert value_counts(str(questions), "dataset", 5) == {}
    stages = {"generator": GeneratorStage([ray_session.remote(FakeGenerator).options(num_cpus=0).remote()],
                                          StageBatching())}
    said = []
    answer(AnswerConfig(questions=str(questions), output=str(tmp_path / "out"), strategies=["direct"], limit=4),
           log=said.append, stages=stages)
    warned = [line for line in said if line.startswith("warning: ")]
    assert len(warned) == 1 and warned[0].startswith("warning: 2 questions of kind 'yes_no'")  # row 5 is past the limit



def test_a_questions_file_without_rows_is_refused_before_ray_or_a_model_starts(tmp_path):
    """Before, the run started Ray, loaded the models, answered nothing and exited 0."""
    import pyarrow as pa

    from schemas.errors import UserError
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "question": pa.array([], pa.string())}), empty)
    config = AnswerConfig(questions=str(empty), output=str(tmp_path / "out"), strategies=["direct"])
    with pytest.raises(UserError, match=r"empty.parquet holds no questions to answer \(0 rows\)"):
        answer(config, log=lambda *_: None, stages={})  # (stand-in pools: the run before answered nothing with them)
    assert not (tmp_path / "out" / "_manifest.json").exists()
