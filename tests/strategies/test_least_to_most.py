"""Least-to-most transitions with a scripted model."""

import json

from schemas.records import Generate, Generation
from strategies.least_to_most import LeastToMost, LeastToMostConfig
from tests.strategies.scripted import drive


def script(subs):
    def respond(request, item):
        assert isinstance(request, Generate)
        if request.json_schema:
            return Generation(subs if isinstance(subs, str) else json.dumps({"sub_questions": subs}), 20, 9)
        user = request.messages[-1][1]
        asked = user.rsplit("Question: ", 1)[1].split("\n")[0]
        return Generation(f"ans({asked})|seen={user.count('Answer: ans(')}", 30, 3)
    return respond


def test_sub_questions_are_solved_in_order_with_earlier_answers_in_context():
    log = []
    done, item = drive(LeastToMost(LeastToMostConfig()), "Q", script(["A?", "B?"]), log=log)
    prompts = [r.messages[-1][1] for _, r in log[1:]]
    assert [p.rsplit("Question: ", 1)[1].split("\n")[0] for p in prompts] == ["A?", "B?", "Q"]
    assert done.answer == "ans(Q)|seen=2" and done.resolved_by == "decomposition"
    assert [t["output"] for t in item.trace if t["step"] == "solve"] == ["ans(A?)|seen=0", "ans(B?)|seen=1"]
    assert "Question: A?\nAnswer: ans(A?)|seen=0" in prompts[1]
    assert item.counts["subquestions"] == 2


def test_a_sub_answer_that_cleans_to_nothing_is_passed_on_as_unknown():
    """It was passed on blank ("Answer: \\n"), where RA-ISF and Think-then-Act show "unknown"."""
    log, answers = [], script(["A?", "B?"])

    def blank_first(request, item):
        return Generation("Answer:\n", 30, 3) if "Question: A?" in request.messages[-1][1] else answers(request, item)
    done, item = drive(LeastToMost(LeastToMostConfig()), "Q", blank_first, log=log)
    prompts = [r.messages[-1][1] for _, r in log[1:]]
    assert "Question: A?\nAnswer: unknown\n\nQuestion: B?" in prompts[1] and "Answer: unknown" in prompts[2]
    assert [t["output"] for t in item.trace if t["step"] == "solve"][0] == "Answer:\n"  # what the model wrote


def test_an_unparseable_decomposition_is_retried_once_then_answered_directly():
    log = []
    done, item = drive(LeastToMost(LeastToMostConfig()), "Q", script("no idea"), log=log)
    assert [r.max_tokens for _, r in log if r.json_schema] == [160, 320]
    assert done.resolved_by == "closed_book" and done.answer == "ans(Q)|seen=0"
    assert item.counts["parse_failures"] == 2 and item.trace[0]["retry"] is True


def test_sub_questions_are_capped():
    done, item = drive(LeastToMost(LeastToMostConfig(max_subquestions=2)), "Q", script(["A?", "B?", "C?"]))
    assert item.trace[0]["sub_questions"] == ["A?", "B?"]


def test_a_failed_generation_ends_with_an_error():
    s = LeastToMost(LeastToMostConfig())
    from strategies.base import Item
    item = Item("Q")
    s.start(item)
    assert s.resume(item, [Generation("", error="replica died")]).error == "replica died"


def test_a_decomposition_that_only_repeats_the_question_is_no_decomposition():
    """It was answered as its own sub-question and reported as resolved by decomposition."""
    done, item = drive(LeastToMost(LeastToMostConfig()), "Who wrote Hamlet?", script(["who wrote hamlet"]))
    assert (done.resolved_by, item.counts["subquestions"]) == ("closed_book", 0)


def test_the_prompts_placeholder_copied_as_a_sub_question_is_no_decomposition():
    """SmolLM2 copies the prompt's {"sub_questions": ["...", "..."]}: "..." was asked as a sub-question,
    answered with an echo of the system prompt, and that echo became the final answer."""
    log = []
    done, item = drive(LeastToMost(LeastToMostConfig()), "Q", script(["...", ",", "…"]), log=log)
    assert done.resolved_by == "closed_book" and done.answer == "ans(Q)|seen=0"
    assert item.counts["parse_failures"] == 2 and not item.counts.get("subquestions")
