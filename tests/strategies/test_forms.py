"""The answer in the form the question asks: yes/no questions get yes or no, claims a verdict."""

import json

import pytest

from schemas.config import AnswerFormConfig
from schemas.records import Generate, Generation, Judge, Judgment, Passage, Retrieval
from strategies.base import Item, clean_answer
from strategies.forms import REASON_TOKENS, final_answer, final_request, form_of, is_yes_no_question, misnamed, traced
from strategies.registry import AnswerConfig, make_strategy


@pytest.mark.parametrize("question, yes_no", [
    ("Are Villa Paletti and Betrayal at House on the Hill both board games?", True),
    ("Do director of film X and director of film Y have the same nationality?", True),
    ("Would the top of Mount Fuji stick out of the Sea of Japan?", True),
    ("Did Ed Wood or Scott Derrickson die first?", False),  # an alternative asks for a name
    ("Which film came out first, Blind Shaft or The Mask Of Fu Manchu?", False),
    ("Who directed Levity?", False),
    ("Island is a novel by Aldous Huxley", False),
])
def test_yes_no_questions_are_recognised_by_their_phrasing(question, yes_no):
    assert is_yes_no_question(question) is yes_no


def test_the_form_comes_from_dataset_then_kind_then_phrasing():
    forms = AnswerFormConfig(by_dataset={"mine": "short"})
    assert form_of(Item("Is it?", kind="yes-no"), forms) == "yes_no"
    assert form_of(Item("Is it?", kind="yes-no", dataset="mine"), forms) == "short"
    assert form_of(Item("Paris is in France.", kind="claim"), forms) == "verdict"
    assert form_of(Item("Were both films American?", kind="multi-hop"), forms) == "yes_no"
    assert form_of(Item("Were the centers profitable", kind="single-hop"), forms) == "short"  # not detected there
    assert form_of(Item("Were both films American?"), forms) == "short"  # no kind: a short answer
    # a sub-question has no kind or dataset of its own: its phrasing decides
    assert form_of(Item("Is Paris in France?", depth=1, kind=None), forms) == "yes_no"
    assert form_of(Item("Who founded Paris?", depth=1), AnswerFormConfig(by_kind={"": "yes_no"})) == "short"


def test_a_kind_or_dataset_named_otherwise_than_in_answer_form_is_said_and_an_exact_or_own_name_is_not():
    """A kind spelt "yes_no" got short answers without a word, and so did a by_dataset entry no question had."""
    forms = AnswerFormConfig(by_dataset={"StrategyQA": "yes_no", "mine": "short"})
    said = misnamed({"yes_no": 3, "yes-no": 2, "Claim": 1, "multi_hop": 4, "single-hop": 5, "trivia": 6},
                    {"strategyqa": 7, "mine": 1}, forms)
    assert len(said) == 4
    assert said[0].startswith("1 questions of kind 'Claim', which answer_form.by_kind does not name (it names 'claim')")
    assert "--set 'answer_form.by_kind.Claim=verdict'" in said[0]
    assert "kind 'multi_hop', which answer_form.detect_yes_no does not name (it names 'multi-hop')" in said[1]
    assert said[2].startswith("3 questions of kind 'yes_no'") and "not 'yes_no' ones" in said[2]
    assert said[3] == ("answer_form.by_dataset names 'StrategyQA', which no question's dataset is (the input has "
                       "'strategyqa'): it sets no answer form")
    assert misnamed({"yes-no": 2, "trivia": 1}, {"mine": 1}, AnswerFormConfig(by_dataset={"mine": "short"})) == []


def test_choice_forms_are_guided_choices_on_the_generator_and_pick_the_likelier_answer():
    forms = AnswerFormConfig()
    assert isinstance(final_request("Question: q\nAnswer:", "short", forms), Generate)
    yes_no = final_request("Question: q\nAnswer:", "yes_no", forms)
    assert isinstance(yes_no, Judge) and yes_no.choices == ("yes", "no") and yes_no.stage == "generator"
    assert "yes or no" in yes_no.messages[0][1]
    verdict = final_request("Question: c\nAnswer:", "verdict", AnswerFormConfig(verdicts=["SUPPORTS", "REFUTES"]))
    assert verdict.choices == ("SUPPORTS", "REFUTES") and "SUPPORTS, REFUTES" in verdict.messages[0][1]
    # probabilities counted over every capitalisation beat the masked greedy label
    assert final_answer(Judgment("yes", {"yes": 0.4, "no": 0.6}), "yes_no") == "no"
    assert final_answer(Judgment("yes", None), "yes_no") == "yes"
    assert final_answer(Generation("Answer: Paris\nmore"), "short") == "Paris"


@pytest.mark.parametrize("strategy", ["direct", "rag"])
def test_baselines_answer_a_yes_no_question_yes_or_no(strategy):
    s = make_strategy(strategy, AnswerConfig(strategies=[strategy]))
    item = Item("Would the top of Mount Fuji stick out of the Sea of Japan?", kind="yes-no")
    step = s.start(item)
    if strategy == "rag":
        step = s.resume(item, [Retrieval([Passage("p", "Fuji", "Mount Fuji is 3,776 m high.", 1.0)])])
    (request,) = step.requests
    assert isinstance(request, Judge) and request.choices == ("yes", "no")
    assert s.resume(item, [Judgment("yes", {"yes": 0.8, "no": 0.2})]).answer == "yes"


@pytest.mark.parametrize("strategy", ["direct", "rag"])
def test_the_trace_of_a_choice_shows_the_answer_taken_and_its_probabilities_not_only_the_guided_label(strategy):
    """The trace showed the guided label (REFUTES) beside an answer taken by its first-token probabilities
    (SUPPORTS): the row contradicted itself and could not say why."""
    s = make_strategy(strategy, AnswerConfig(strategies=[strategy]))
    item = Item("Paris is the capital of France.", kind="claim")
    step = s.start(item)
    if strategy == "rag":
        step = s.resume(item, [Retrieval([Passage("p", "Paris", "Paris is the capital of France.", 1.0)])])
    done = s.resume(item, [Judgment("REFUTES", {"SUPPORTS": 0.61234, "REFUTES": 0.38766})])
    assert done.answer == "SUPPORTS"
    assert item.trace[-1] == {"step": step.requests[0].step, "output": "SUPPORTS",
                              "probs": {"SUPPORTS": 0.61234, "REFUTES": 0.38766}}  # six decimals: a cut between two


def test_a_reasoned_yes_no_writes_its_reasoning_before_the_answer_and_is_read_from_the_answer_field():
    forms = AnswerFormConfig(by_kind={"yes-no": "yes_no_reasoned"})
    assert form_of(Item("Is it?", kind="yes-no"), forms) == "yes_no_reasoned"
    request = final_request("Question: q\nAnswer:", "yes_no_reasoned", forms)
    assert isinstance(request, Generate) and request.json_schema and request.max_tokens == REASON_TOKENS
    assert "reasoning" in request.messages[0][1] and request.messages[1] == ("user", "Question: q\nAnswer:")
    schema = json.loads(request.json_schema)
    assert list(schema["properties"]) == ["reasoning", "answer"]  # the order guided decoding writes them in
    assert schema["properties"]["answer"]["enum"] == ["yes", "no"]
    reasoned = '{"reasoning": "Fuji is 3,776 m; the sea is 4 km deep.", "answer": "no"}'
    assert final_answer(Generation(reasoned), "yes_no_reasoned") == "no"
    over_length = '{"reasoning": "' + "x" * 700 + '", "answer": "Yes"}'
    assert final_answer(Generation(over_length), "yes_no_reasoned") == "yes"  # a backend that does not enforce it
    cut_off = '{"reasoning": "Fuji is 3,776 m and'
    assert final_answer(Generation(cut_off), "yes_no_reasoned") == ""  # no answer, not a guess
    # the form asked decides how the output is read, not what the output looks like
    assert final_answer(Generation(reasoned), "short") == clean_answer(reasoned) != "no"
    assert final_answer(Generation("Answer: Paris"), "short") == "Paris"


def test_a_reasoned_yes_no_keeps_its_choices_where_a_structured_step_embeds_them():
    from strategies.forms import choices

    assert choices("yes_no_reasoned", AnswerFormConfig()) == choices("yes_no", AnswerFormConfig()) == ("yes", "no")


@pytest.mark.parametrize("strategy", ["direct", "rag"])
def test_baselines_answer_a_reasoned_yes_no_question_from_its_answer_field(strategy):
    config = AnswerConfig(strategies=[strategy], answer_form=AnswerFormConfig(by_kind={"yes-no": "yes_no_reasoned"}))
    s = make_strategy(strategy, config)
    item = Item("Would the top of Mount Fuji stick out of the Sea of Japan?", kind="yes-no")
    step = s.start(item)
    if strategy == "rag":
        step = s.resume(item, [Retrieval([Passage("p", "Fuji", "Mount Fuji is 3,776 m high.", 1.0)])])
    (request,) = step.requests
    assert isinstance(request, Generate) and "reasoning" in request.json_schema
    assert s.resume(item, [Generation('{"reasoning": "The sea is deeper.", "answer": "no"}')]).answer == "no"


def test_an_unknown_answer_form_is_a_config_error_naming_the_field():
    with pytest.raises(ValueError, match="by_kind"):
        AnswerFormConfig(by_kind={"yes-no": "yes_no_reasoning"})


def test_setting_one_kinds_form_keeps_the_other_kinds_defaults():
    forms = AnswerFormConfig(by_kind={"yes-no": "yes_no_reasoned"})
    assert forms.by_kind == {"yes-no": "yes_no_reasoned", "claim": "verdict"}
    assert AnswerFormConfig(by_kind={"claim": "short"}).by_kind["claim"] == "short"


def test_a_verdict_cut_answers_the_first_label_at_or_above_it_and_otherwise_the_likelier_label_stands():
    """The 0.5B model gave REFUTES the larger probability for every FEVER claim, yet its P(SUPPORTS) ranks
    them (AUC 0.69): a cut on it answers both labels."""
    judged = Judgment("REFUTES", {"SUPPORTS": 0.2, "REFUTES": 0.8})
    assert final_answer(judged, "verdict", AnswerFormConfig()) == "REFUTES"  # no cut: the likelier
    assert final_answer(judged, "verdict") == "REFUTES"
    assert final_answer(judged, "verdict", AnswerFormConfig(verdict_cut=0.15)) == "SUPPORTS"
    assert final_answer(judged, "verdict", AnswerFormConfig(verdict_cut=0.25)) == "REFUTES"
    assert final_answer(Judgment("SUPPORTS", {"SUPPORTS": 1.0, "REFUTES": 0.0}), "verdict",
                        AnswerFormConfig(verdict_cut=1.0)) == "REFUTES"  # a cut of 1 passes nothing
    with pytest.raises(ValueError, match="verdict_cut decides between two verdicts; these are 3"):
        AnswerFormConfig(verdicts=["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"], verdict_cut=0.1)  # it would do nothing
    # the trace says the label taken, not the likelier one
    assert traced("read", judged, "verdict", AnswerFormConfig(verdict_cut=0.15)) == {
        "step": "read", "output": "SUPPORTS", "probs": {"SUPPORTS": 0.2, "REFUTES": 0.8}}
    assert final_answer(Judgment("yes", {"yes": 0.2, "no": 0.8}), "yes_no", AnswerFormConfig(verdict_cut=0.1)) == "no"


def test_choices_that_share_their_first_token_are_answered_by_the_label_the_model_wrote_not_by_their_order():
    """[MOSTLY TRUE, MOSTLY FALSE]: their first token's probability is shared, 0.5 each, and the first label
    listed answered every claim (reversing the list reversed every answer)."""
    tied = {"MOSTLY TRUE": 0.5, "MOSTLY FALSE": 0.5}
    forms = AnswerFormConfig(verdicts=["MOSTLY TRUE", "MOSTLY FALSE"])
    for label in tied:
        assert final_answer(Judgment(label, tied), "verdict", forms) == label
        assert traced("read", Judgment(label, tied), "verdict", forms)["output"] == label
    assert final_answer(Judgment("no", {"yes": 0.3, "no": 0.7}), "yes_no") == "no"  # untied: the likelier, as before
    assert final_answer(Judgment("yes", {"yes": 0.3, "no": 0.7}), "yes_no") == "no"
    assert traced("read", Judgment("MOSTLY TRUE", tied), "verdict", forms)["tied"] is True
    # a third, less likely label is never taken for a tie of the other two
    assert final_answer(Judgment("C", {"A": 0.4, "B": 0.4, "C": 0.2}), "verdict",
                        AnswerFormConfig(verdicts=["A", "B", "C"])) == "A"
    # a cut on such labels would read 0.5 for every claim: refused, naming why (SUPPORTS / SUPPORTED share "SUP")
    for labels in (["MOSTLY TRUE", "MOSTLY FALSE"], ["SUPPORTS", "SUPPORTED"]):
        with pytest.raises(ValueError, match="verdict_cut reads each verdict's probability from its first token"):
            AnswerFormConfig(verdicts=labels, verdict_cut=0.4)
    AnswerFormConfig(verdicts=["TRUE", "FALSE"], verdict_cut=0.4)
