import math
from types import SimpleNamespace

import pytest

from actors.generator import choice_probs, completion_budget


def lp(token, p):
    return SimpleNamespace(decoded_token=token, logprob=math.log(p))


def test_choice_probs_sums_case_and_space_variants_and_normalises():
    first = {1: lp("Yes", 0.5), 2: lp(" yes", 0.1), 3: lp("No", 0.2), 4: lp("Maybe", 0.2)}
    probs = choice_probs(first, ("yes", "no"))
    assert probs["yes"] == pytest.approx(0.75) and probs["no"] == pytest.approx(0.25)


def test_choice_prefix_tokens_count_and_no_mass_gives_none():
    probs = choice_probs({1: lp("AMB", 0.3), 2: lp("CLEAR", 0.6)}, ("CLEAR AND COMPLETE", "AMBIGUOUS"))
    assert probs["CLEAR AND COMPLETE"] == pytest.approx(2 / 3)
    assert choice_probs({1: lp("Paris", 0.9), 2: lp("  ", 0.1)}, ("yes", "no")) is None


def test_completion_budget_is_cut_to_the_context_left_and_errors_only_without_room():
    assert completion_budget(1000, 384, 2048) == 384
    assert completion_budget(1300, 768, 2048) == 748  # a retry with a doubled budget still runs
    assert completion_budget(2047, 64, 2048) == 1
    assert "leaves 0 of max_model_len 2048" in completion_budget(2100, 64, 2048)
    assert "needs 3" in completion_budget(2046, 3, 2048, minimum=3)  # a judgment needs its whole choice
