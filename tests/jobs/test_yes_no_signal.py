"""benchmarks/yes_no_signal.py's scores of P("yes") against the gold."""

import importlib.util
import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # it imports its sibling variants.py
spec = importlib.util.spec_from_file_location("yes_no_signal", REPO / "benchmarks" / "yes_no_signal.py")
yes_no_signal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(yes_no_signal)


def test_a_choice_without_a_probability_is_counted_apart_not_scored_as_no():
    questions = [{"dataset": "strategyqa", "answers": [a]} for a in ("yes", "no", "no", "yes")]
    scores = yes_no_signal.part_scores(questions, [0.9, 0.2, 0.1, None])["all"]
    assert scores["n"] == 3 and scores["no_probability"] == 1
    assert scores["acc_likelier"] == 100.0 and scores["auc"] == 1.0
