"""Think-then-Act transitions with a scripted model: assessment branches, both capability checks,
the beta' extremes, sentence ranking as context, sub-queries as children."""

import json

import pytest

from schemas.records import (
    Generate,
    Generation,
    Judge,
    Judgment,
    Passage,
    Rank,
    Ranking,
    Retrieval,
    Retrieve,
)
from strategies.think_act import ThinkActConfig, ThinkThenAct, rewritten, sentences
from tests.strategies.scripted import drive

PASSAGES = [Passage("p0", "Paris", "Paris is the capital of France. It is large.", 0.9),
            Passage("p1", "Lyon", "Lyon is a city. Lyon is in France!", 0.5)]


class Script:
    def __init__(self, assess="CLEAR AND COMPLETE", beta=0.2, decision="RETRIEVAL", subs=(), rewrite="Q full?",
                 assess_probs=None):
        self.assess, self.beta, self.decision, self.subs, self.rewrite = assess, beta, decision, subs, rewrite
        self.assess_probs = assess_probs

    def __call__(self, request, item):
        if request.step == "assess":
            return Judgment(self.assess, self.assess_probs, 30, 3)
        if request.step == "capability":
            if "RETRIEVAL" in request.choices:
                return Judgment(self.decision, None, 30, 2)
            beta = self.beta(item.question) if callable(self.beta) else self.beta
            return Judgment("yes" if beta >= .5 else "no", {"yes": beta, "no": 1 - beta}, 30, 1)
        if isinstance(request, Retrieve):
            return Retrieval(PASSAGES[: request.k])
        if isinstance(request, Rank):  # rank by length, longest first
            order = sorted(range(len(request.texts)), key=lambda i: -len(request.texts[i]))[: request.top]
            return Ranking(order, [1.0] * len(order))
        assert isinstance(request, Generate)
        user = request.messages[-1][1]
        if request.step == "split":
            return Generation(json.dumps({"sub_questions": list(self.subs)}), 20, 9)
        if request.step == "rewrite":
            return Generation(self.rewrite, 20, 4)
        return Generation(f"ans[{user.splitlines()[-2]}]", 40, 3)


def steps(item):
    return [t["step"] for t in item.trace]


def test_clear_query_low_confidence_retrieves_and_answers_from_the_top_sentences():
    log = []
    done, item = drive(ThinkThenAct(ThinkActConfig(top_sentences=2)), "Q?", Script(beta=0.2), log=log)
    assert steps(item) == ["assess", "capability", "retrieve", "rank", "answer"]
    (rank,) = [r for _, r in log if isinstance(r, Rank)]
    assert rank.texts == ("Paris is the capital of France.", "It is large.", "Lyon is a city.", "Lyon is in France!")
    answer_prompt = log[-1][1].messages[-1][1]
    assert "- Paris is the capital of France.\n- Lyon is in France!" in answer_prompt
    assert done.resolved_by == "retrieval" and done.citations == []  # the ranker chose the sentences, not the model
    assert [p.id for p in item.passages] == ["p0", "p1"]
    assert item.trace[1] == {"step": "capability", "beta": 0.2, "label": None, "retrieve": True}


def test_confident_model_answers_closed_book():
    done, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", Script(beta=0.7))
    assert done.resolved_by == "closed_book" and "retrieve" not in steps(item)


@pytest.mark.parametrize("beta_threshold, retrieves", [(0.0, False), (1.0, True)])
def test_beta_threshold_extremes_never_or_always_retrieve_without_asking(beta_threshold, retrieves):
    log = []
    done, item = drive(ThinkThenAct(ThinkActConfig(beta_threshold=beta_threshold)), "Q?", Script(beta=0.5), log=log)
    assert sum(isinstance(r, Judge) for _, r in log) == 1  # only the assessment
    assert (done.resolved_by == "retrieval") is retrieves


def test_direct_decision_variant():
    done, _ = drive(ThinkThenAct(ThinkActConfig(capability="decision")), "Q?", Script(decision="NO RETRIEVAL"))
    assert done.resolved_by == "closed_book"
    done, _ = drive(ThinkThenAct(ThinkActConfig(capability="decision")), "Q?", Script(decision="RETRIEVAL"))
    assert done.resolved_by == "retrieval"


def test_incomplete_query_is_rewritten_and_the_rewrite_is_used_downstream():
    log = []
    done, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", Script(assess="INCOMPLETE", beta=0.1), log=log)
    assert next(t["query"] for t in item.trace if t["step"] == "rewrite") == "Q full?"
    assert [r.query for _, r in log if isinstance(r, Retrieve)] == ["Q full?"]
    assert "Question: Q full?" in log[-1][1].messages[-1][1]


@pytest.mark.parametrize("output, query", [
    ("The answer is: The Bellas.", "Q?"),  # answered instead of rewritten (SmolLM2, real stack)
    ("The question is incomplete. The answer to this question is:", "Q?"),
    ("Sure! Here is the rewritten question:\n\nWho wrote Dune?", "Who wrote Dune?"),
    ("**Rewritten question:** Who wrote Dune?", "Who wrote Dune?"),
])
def test_a_rewrite_that_is_no_question_leaves_the_users_question_in_place(output, query):
    log = []
    _, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", Script(assess="INCOMPLETE", beta=0.1, rewrite=output), log=log)
    rewrite = next(t for t in item.trace if t["step"] == "rewrite")
    assert rewrite["query"] == query and rewrite["taken"] is (query != "Q?") and rewrite["output"] == output
    assert [r.query for _, r in log if isinstance(r, Retrieve)] == [query]
    assert f"Question: {query}" in log[-1][1].messages[-1][1]


@pytest.mark.parametrize("output, query", [
    ("The answer is: Whitney Houston", "who sang i want to dance with somebody"),
    ("Who sang the 1987 song I Wanna Dance with Somebody?", "Who sang the 1987 song I Wanna Dance with Somebody?"),
])
def test_a_question_written_without_a_question_mark_is_still_a_question_to_its_rewrite(output, query):
    """NQ writes its questions without "?": before, such a question was taken for a claim, and any output
    of the rewrite, an answer or a comment, became the query retrieved for and answered."""
    log = []
    question = "who sang i want to dance with somebody"
    _, item = drive(ThinkThenAct(ThinkActConfig()), question, Script(assess="INCOMPLETE", beta=0.1, rewrite=output),
                    log=log, kind="single-hop")
    assert next(t["query"] for t in item.trace if t["step"] == "rewrite") == query
    assert [r.query for _, r in log if isinstance(r, Retrieve)] == [query]
    assert f"Question: {query}" in log[-1][1].messages[-1][1]


def test_a_claims_rewrite_is_taken_as_written():
    log = []
    claim = "Whitney Houston sang it."
    class Verdicts(Script):
        def __call__(self, request, item):
            if request.step == "answer":  # a claim's verdict, a guided choice
                return Judgment(request.choices[0], None, 30, 2)
            return super().__call__(request, item)
    _, item = drive(ThinkThenAct(ThinkActConfig()), claim, Verdicts(assess="INCOMPLETE", beta=0.1,
                    rewrite="Whitney Houston sang I Wanna Dance with Somebody."), log=log, kind="claim")
    assert [r.query for _, r in log if isinstance(r, Retrieve)] == ["Whitney Houston sang I Wanna Dance with Somebody."]


@pytest.mark.parametrize("output, finish_reason", [
    ("Whitney Houston sang I Wanna Dance with Somebody, the 1987 single from her", "length"),
    ("The claim is incomplete because it does not say which song.", "stop"),
    ("The question is incomplete.", "stop"),
    ("**This claim** lacks the song's name.", "stop"),
])
def test_a_claims_rewrite_cut_off_by_its_budget_or_commenting_on_it_leaves_the_users_claim_to_be_judged(
        output, finish_reason):
    """Any rewrite of a claim was taken as written: one cut off at its 64 tokens, or a comment on the claim,
    was retrieved for and judged in place of the claim."""
    log, claim = [], "Whitney Houston sang it."

    class Verdicts(Script):
        def __call__(self, request, item):
            if request.step == "rewrite":
                return Generation(output, 20, 64, finish_reason=finish_reason)
            if request.step == "answer":
                return Judgment(request.choices[0], None, 30, 2)
            return super().__call__(request, item)
    _, item = drive(ThinkThenAct(ThinkActConfig()), claim, Verdicts(assess="INCOMPLETE", beta=0.1), log=log, kind="claim")
    rewrite = next(t for t in item.trace if t["step"] == "rewrite")
    assert (rewrite["query"], rewrite["taken"], rewrite["output"]) == (claim, False, output)
    assert [r.query for _, r in log if isinstance(r, Retrieve)] == [claim]
    assert claim in log[-1][1].messages[-1][1] and output not in log[-1][1].messages[-1][1]
    # a claim about "The Question" (a comics hero) is a claim, not a comment on one
    assert rewritten("The Question was created by Steve Ditko.", "The Question exists.", claim=True) == (
        "The Question was created by Steve Ditko.")


def test_a_whole_claim_rewrite_is_taken_though_what_follows_it_was_cut_off_or_it_comes_after_a_lead_in():
    """A whole first line was dropped when an explanation after it ran out of tokens, and "The claim: X" was read
    as a comment on the claim."""
    claim, whole = "Houston sang it.", "Whitney Houston sang I Wanna Dance with Somebody."
    assert rewritten(f"{whole}\nThis rewrite adds the singer's full name because the original", claim, claim=True,
                     cut_off=True) == whole
    assert rewritten(f"The claim: {whole}", claim, claim=True) == whole
    assert rewritten(f"**Rewritten claim:** {whole}", claim, claim=True) == whole
    assert rewritten("Whitney Houston sang I Wanna Dance with", claim, claim=True, cut_off=True) == claim
    assert rewritten("This claim lacks the song's name.", claim, claim=True) == claim


def test_ambiguous_query_spawns_sub_queries_that_skip_assessment_and_are_aggregated():
    log = []
    script = Script(assess="AMBIGUOUS", subs=["A?", "B?"], beta=lambda q: 0.9 if q == "A?" else 0.1)
    done, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", script, log=log)
    assert sum("AMBIGUOUS" in r.choices for _, r in log if isinstance(r, Judge)) == 1
    assert done.resolved_by == "sub_queries" and done.citations == []
    aggregate = log[-1][1].messages[-1][1]
    assert "Sub-query 1: A?\nAnswer 1: ans[Question: A?]" in aggregate and "Sub-query 2: B?" in aggregate


def test_sub_queries_naming_an_earlier_answer_are_asked_in_order_with_it_filled_in():
    # the paper's samples: "Sub-Question: When was #1 invented?" went to retrieval as written
    log = []
    script = Script(assess="AMBIGUOUS", subs=["Who invented the telephone?", "When was #1 invented?"], beta=0.9)
    done, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", script, log=log)
    asked = [r.messages[-1][1] for d, r in log if d == 1 and r.step == "answer"]
    assert "When was ans[Question: Who invented the telephone?] invented?" in asked[1] and "#1" not in asked[1]
    aggregate = log[-1][1].messages[-1][1]
    assert "Sub-query 2: When was ans[Question: Who invented the telephone?] invented?" in aggregate
    assert done.resolved_by == "sub_queries" and "sub_queries_chained" in steps(item)
    # "#1" that names no earlier step (the first sub-query's own text, C#1) is text, and nothing is chained
    plain = Script(assess="AMBIGUOUS", subs=["Who was the #1 ranked player?", "What is C#1?"], beta=0.9)
    log = []
    done, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", plain, log=log)
    assert "sub_queries_chained" not in steps(item)
    assert "Sub-query 1: Who was the #1 ranked player?" in log[-1][1].messages[-1][1]


AMBIGUOUS_AT_0_4 = {"CLEAR AND COMPLETE": 0.25, "INCOMPLETE": 0.35, "AMBIGUOUS": 0.4}


@pytest.mark.parametrize("cut, taken, first_steps", [
    (None, "AMBIGUOUS", ["assess", "split", "aggregate"]),  # the paper: the judge's label
    (0.3, "AMBIGUOUS", ["assess", "split", "aggregate"]),
    (0.5, "INCOMPLETE", ["assess", "rewrite", "capability"]),  # below the cut: the likelier of the other two
])
def test_an_ambiguity_threshold_splits_only_queries_the_judge_finds_ambiguous_enough(cut, taken, first_steps):
    script = Script(assess="AMBIGUOUS", subs=["A?", "B?"], assess_probs=AMBIGUOUS_AT_0_4)
    done, item = drive(ThinkThenAct(ThinkActConfig(ambiguity_threshold=cut)), "Q?", script)
    assert item.trace[0]["taken"] == taken and steps(item)[:3] == first_steps
    assert done.resolved_by == ("sub_queries" if taken == "AMBIGUOUS" else "retrieval")


def test_an_ambiguity_threshold_can_split_a_query_the_judge_labelled_otherwise():
    script = Script(assess="INCOMPLETE", subs=["A?", "B?"], assess_probs=AMBIGUOUS_AT_0_4)
    done, item = drive(ThinkThenAct(ThinkActConfig(ambiguity_threshold=0.4)), "Q?", script)
    assert item.trace[0]["taken"] == "AMBIGUOUS" and done.resolved_by == "sub_queries"


def test_no_assessment_switch_and_errors():
    done, item = drive(ThinkThenAct(ThinkActConfig(assess=False)), "Q?", Script(beta=0.9))
    assert steps(item) == ["capability", "answer"]
    done, _ = drive(ThinkThenAct(ThinkActConfig()), "Q?", lambda r, i: Judgment("", error="judge down"))
    assert done.error == "judge down"


def test_sentences_split_at_end_punctuation_before_a_capital_or_a_digit_not_a_lowercase_word():
    assert sentences("One. Two! 3 three? four.") == ["One.", "Two!", "3 three? four."]


def test_the_context_may_be_the_top_passages_instead_of_sentences():
    log = []
    done, item = drive(ThinkThenAct(ThinkActConfig(top_sentences=1, context="passages")), "Q?", Script(beta=0.2), log=log)
    (rank,) = [r for _, r in log if isinstance(r, Rank)]
    assert rank.texts == ("Paris: Paris is the capital of France. It is large.", "Lyon: Lyon is a city. Lyon is in France!")
    assert "- Paris: Paris is the capital of France. It is large." in log[-1][1].messages[-1][1]


def test_with_rags_instruction_over_all_k_passages_the_read_is_rags_own_request():
    """answer_prompt: rag leaves the method as the only difference from rag: where the query is read as
    it is and D is every retrieved passage (in rag's order), the answer request is rag's, to the byte."""
    from strategies.base import StrategySettings
    from strategies.rag import RetrieveThenRead

    def in_order(request, item):  # a ranker that keeps the retrieval's order
        if isinstance(request, Rank):
            return Ranking(list(range(request.top)), [1.0] * request.top)
        return Script(beta=0.2)(request, item)

    ta_log, rag_log = [], []
    drive(ThinkThenAct(ThinkActConfig(k=2, top_sentences=2, context="passages", answer_prompt="rag")), "Q?", in_order,
          log=ta_log)
    drive(RetrieveThenRead(StrategySettings(k=2)), "Q?", in_order, log=rag_log)
    assert ta_log[-1][1].messages == rag_log[-1][1].messages and "[2] Lyon: Lyon is a city." in rag_log[-1][1].messages[-1][1]
    ours = []
    drive(ThinkThenAct(ThinkActConfig(k=2, top_sentences=2, context="passages")), "Q?", in_order, log=ours)
    assert ours[-1][1].messages != rag_log[-1][1].messages  # the default: our instruction


def test_a_failed_sub_query_is_unknown_in_the_aggregate_and_if_all_fail_the_query_is_read_as_asked():
    from engine.steps import Done, Item

    strategy, script = ThinkThenAct(ThinkActConfig()), Script(assess="AMBIGUOUS", subs=["A?", "B?"])
    item = Item("Q?")
    step = strategy.start(item)  # assess
    step = strategy.resume(item, [script(r, item) for r in step.requests])  # split
    spawn = strategy.resume(item, [script(r, item) for r in step.requests])
    assert spawn.questions == ["A?", "B?"]
    failed = Done("", "error", error="generator failed 3 times")
    step = strategy.resume(item, [Done("Paris", "retrieval"), failed])
    aggregate = step.requests[0].messages[-1][1]
    assert "Answer 1: Paris" in aggregate and "Answer 2: unknown" in aggregate

    done, item = drive(ThinkThenAct(ThinkActConfig()), "Q?", lambda r, i: (
        Generation("", error="down") if i.depth and isinstance(r, Generate) else script(r, i)))
    assert done.resolved_by == "retrieval" and "sub_queries_failed" in steps(item)


def test_a_retrieval_that_finds_nothing_answers_closed_book_and_says_so():
    """BM25 finds no passage for "Is it?": the answer read "(nothing found)" and was labelled `retrieval`, where
    rag's same case is `closed_book`: evaluate's resolution table miscounted it."""
    class Nothing(Script):
        def __call__(self, request, item):
            return Retrieval([]) if isinstance(request, Retrieve) else super().__call__(request, item)

    done, item = drive(ThinkThenAct(ThinkActConfig()), "Is it?", Nothing(beta=0.2))
    assert steps(item)[-2:] == ["retrieve", "answer"] and done.resolved_by == "closed_book"


def test_an_engine_with_no_depth_or_too_few_nodes_for_the_sub_queries_is_refused_at_config_time():
    """engine.max_depth 0 validated, and every AMBIGUOUS query paid for a split whose sub-queries were all dropped."""
    from strategies.registry import AnswerConfig
    with pytest.raises(ValueError, match="engine.max_depth 0 leaves no depth for think_act's sub-queries"):
        AnswerConfig(strategies=["think_act"], engine={"max_depth": 0})
    with pytest.raises(ValueError, match="engine.max_nodes_per_root 4 cannot hold .* think_act.max_subqueries 4"):
        AnswerConfig(strategies=["think_act"], engine={"max_nodes_per_root": 4})
    AnswerConfig(strategies=["think_act"], engine={"max_depth": 0}, think_act={"assess": False})  # it never splits
    AnswerConfig(strategies=["think_act"], engine={"max_depth": 1, "max_nodes_per_root": 5})
    AnswerConfig(strategies=["rag"], engine={"max_depth": 0})
