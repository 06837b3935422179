import pytest

from jobs import metrics as M


@pytest.mark.parametrize(
    "pred, golds, em, f1",
    [
        ("The Eiffel Tower", ["Eiffel Tower"], 1.0, 1.0),  # article and case
        ("Paris, France.", ["paris france"], 1.0, 1.0),  # punctuation
        ("in Paris", ["Paris"], 0.0, 2 / 3),  # precision 1/2, recall 1
        ("London", ["Paris", "London"], 1.0, 1.0),  # any gold
        ("", ["Paris"], 0.0, 0.0),
        ("New York City", ["York"], 0.0, 0.5),
    ],
)
def test_em_f1_known_cases(pred, golds, em, f1):
    assert M.exact_match(pred, golds) == em
    assert M.f1(pred, golds) == pytest.approx(f1)


def test_accuracy_is_containment_on_word_boundaries():
    assert M.accuracy("It was Barack Obama in 2009", ["Barack Obama"]) == 1.0
    assert M.accuracy("Obamacare", ["Obama"]) == 0.0


def test_a_yes_no_gold_is_recognised_and_an_answer_is_read_as_yes_no_or_neither():
    assert M.is_yes_no(["yes"]) and not M.is_yes_no(["Paris"])
    assert M.yes_no("No, it is not.") == "no"
    assert M.yes_no("maybe") is None


def test_recall_at_k_any_and_all():
    assert M.recall_at_k(["a", "b", "c"], ["b", "z"], 2) == (1.0, 0.0)
    assert M.recall_at_k(["a", "b", "c"], ["a", "c"], 3) == (1.0, 1.0)
    assert M.recall_at_k(["a", "b", "c"], ["c"], 2) == (0.0, 0.0)


def test_a_gold_that_is_null_or_normalises_to_nothing_makes_no_empty_answer_right():
    for golds in ([""], [" . "], [None], ["", None]):
        assert M.gold_answers(golds) == []
    for golds in ([""], ["The"], [None], ["", None]):
        assert (M.exact_match("", golds), M.f1("", golds), M.accuracy("", golds)) == (0.0, 0.0, 0.0)
    assert M.exact_match("Paris", [None, "Paris"]) == 1.0  # a null beside a real gold is only skipped


def test_a_yes_no_gold_is_scored_by_the_answers_first_yes_no_word_not_by_containment():
    assert M.accuracy("Yes, there is no doubt", ["no"]) == 0.0
    assert M.accuracy("Yes, there is no doubt", ["yes"]) == 1.0
    assert M.accuracy("yes or no", ["no"]) == 0.0
    assert M.accuracy("Norway", ["no"]) == 0.0


def test_a_gold_answer_that_is_only_an_article_like_a_is_scored_not_dropped():
    """SQuAD's normalisation makes "A" (a choice's letter, a blood type) nothing: the question left the scores."""
    assert M.gold_answers(["A", "B", "A+"]) == ["A", "B", "A+"]
    assert (M.exact_match("A.", ["A"]), M.f1("a", ["A"]), M.accuracy("Answer: A", ["A"])) == (1.0, 1.0, 1.0)
    assert (M.exact_match("B", ["A"]), M.accuracy("B", ["A"])) == (0.0, 0.0)
    assert M.exact_match("The Eiffel Tower", ["Eiffel Tower"]) == 1.0  # articles beside other words still go


def test_a_verdict_answer_is_correct_only_when_it_is_the_gold_label_not_a_label_that_contains_it():
    labels = ("SUPPORTED", "NOT SUPPORTED")
    assert M.accuracy("NOT SUPPORTED", ["SUPPORTED"], labels) == 0.0
    assert M.accuracy("SUPPORTED", ["SUPPORTED"], labels) == 1.0
    assert M.accuracy("The claim is not supported.", ["NOT SUPPORTED"], labels) == 1.0
    assert M.accuracy("HALF TRUE", ["TRUE"], ("TRUE", "HALF TRUE", "FALSE")) == 0.0
    assert M.accuracy("NOT SUPPORTED", ["SUPPORTED"]) == 1.0  # without the labels: containment, as for any answer
    assert M.accuracy("Paris, France", ["Paris"], labels) == 1.0  # a gold that is no label: containment
