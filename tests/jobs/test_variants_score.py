"""benchmarks/variants.py's score: the tuning passes' EM / F1 / accuracy, averaged as ``ragsift evaluate``."""

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("variants", REPO / "benchmarks" / "variants.py")
variants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants)


def test_a_question_without_a_gold_answer_is_left_out_of_the_tuning_scores_as_evaluate_leaves_it_out():
    questions = [{"answers": ["Paris"]}, {"answers": [None]}, {"answers": [" . "]}, {"answers": ["Rome"]}]
    assert variants.score(["Paris", "x", "y", "Milan"], questions) == {"EM": 50.0, "F1": 50.0, "acc": 50.0}


def test_a_claim_label_is_scored_as_the_answers_first_label_as_evaluate_scores_it():
    """Scored without the claim labels, 'REFUTES: it SUPPORTS nothing' counted as the gold 'SUPPORTS'."""
    questions = [{"answers": ["SUPPORTS"]}, {"answers": ["SUPPORTED"]}]
    assert variants.score(["REFUTES: it SUPPORTS nothing"], questions[:1])["acc"] == 0.0
    assert variants.score(["NOT SUPPORTED"], questions[1:], ("SUPPORTED", "NOT SUPPORTED"))["acc"] == 0.0
