"""benchmarks/paired.py: the paired difference against a baseline and its bootstrap interval."""

import importlib.util

import pytest

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("paired", REPO / "benchmarks" / "paired.py")
paired = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired)


def test_a_strategy_ahead_on_most_questions_has_an_interval_above_zero_and_a_copy_of_the_baseline_none():
    base = {f"q{i}": (float(i % 3) * 40, float(i % 2) * 100) for i in range(100)}
    ahead = {q: (f1 + 10 if int(q[1:]) % 10 else f1 - 5, acc) for q, (f1, acc) in base.items()}
    table = {r["strategy"]: r for r in paired.compare({"rag": base, "copy": dict(base), "ahead": ahead}, "rag", draws=2000)}
    assert table["copy"]["F1 diff"] == 0 and table["copy"]["F1 95% CI"] == (0, 0)
    assert table["copy"]["F1 above / below"] == (0, 0)
    assert table["ahead"]["F1 diff"] == 8.5 and 0 < table["ahead"]["F1 95% CI"][0] < 8.5 < table["ahead"]["F1 95% CI"][1]
    assert table["ahead"]["F1 above / below"] == (90, 10) and table["ahead"]["acc diff"] == 0
    assert {r["n"] for r in table.values()} == {100}


def test_pooled_runs_are_one_comparison_over_all_their_questions_even_where_ids_repeat(monkeypatch):
    runs = {"a": {"rag": {"q1": (0.0, 0.0), "q2": (50.0, 100.0)}, "raisf": {"q1": (100.0, 100.0), "q2": (50.0, 100.0)}},
            "b": {"rag": {"q1": (20.0, 0.0)}, "raisf": {"q1": (0.0, 0.0)}, "migres": {"q1": (0.0, 0.0)}}}
    monkeypatch.setattr(paired, "per_question", lambda answers, questions: runs[answers])
    scores = paired.pooled([("a", "qa"), ("b", "qb")])
    assert sorted(scores) == ["rag", "raisf"]  # migres is in one run only
    (row,) = paired.compare(scores, "rag", draws=500)
    assert row["n"] == 3 and row["F1 diff"] == round((100 + 0 - 20) / 3, 1)
    assert row["F1 above / below"] == (1, 1) and row["acc above / below"] == (1, 0)


def test_answers_and_questions_must_pair_up():
    with pytest.raises(SystemExit):
        paired.main(["--answers", "a", "b", "--questions", "qa"])
