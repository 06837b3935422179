"""benchmarks/variants.py's score: the tuning passes' EM / F1 / accuracy, averaged as ``ragsift evaluate``."""

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("variants", REPO / "benchmarks" / "variants.py")
variants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants)


def test_a_question_without_a_gold_answer_is_left_out_of_the_tuning_scores_as_evaluate_leaves_it_out():
    questions = [{"answers": ["Paris"]}, {"answers": [None]}, {"answers": ["The"]}, {"answers": ["Rome"]}]
    assert variants.score(["Paris", "x", "y", "Milan"], questions) == {"EM": 50.0, "F1": 50.0, "acc": 50.0}
