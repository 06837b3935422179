"""Self-Reasoning transitions with a scripted model: trajectory, citations, irrelevant evidence,
fact verification, the retry and the fallback."""

import json

import pytest

from schemas.config import AnswerFormConfig
from schemas.records import (
    Generate,
    Generation,
    Judge,
    Judgment,
    Passage,
    Retrieval,
    Retrieve,
)
from strategies.base import Item
from strategies.self_reasoning import SelfReasoning, SelfReasoningConfig
from tests.strategies.scripted import drive

PASSAGES = [Passage(f"p{i}", f"T{i}", f"text {i}", 1.0 - i / 10) for i in range(5)]


def script(*trajectories, read="Paris"):
    """Trajectories (dicts or raw text) answer the guided generations in order; plain reads get ``read``."""
    queue = list(trajectories)

    def respond(request, item):
        if isinstance(request, Retrieve):
            return Retrieval(PASSAGES[: request.k])
        assert isinstance(request, Generate)
        if request.json_schema:
            t = queue.pop(0)
            return Generation(t if isinstance(t, str) else json.dumps(t), 300, 120)
        return Generation(read, 300, 2)
    return respond


def trajectory(relevant=True, cites=(2,), analysis="Paris is the capital [2][1,9].", answer="Paris"):
    return {"relevant": relevant, "relevant_reason": "", "analysis": analysis, "answer": answer,
            "cite_list": [{"cite_index": i, "cite_content": "...", "cite_reason": "why"} for i in cites]}


def test_one_guided_trajectory_over_the_top_k_with_citations_as_passage_ids():
    log = []
    config = SelfReasoningConfig(answer_step="trajectory")  # the trajectory alone (answer_step: its own test)
    done, item = drive(SelfReasoning(config), "capital of France?", script(trajectory()), log=log)
    assert [type(r).__name__ for _, r in log] == ["Retrieve", "Generate"]
    schema = json.loads(log[1][1].json_schema)
    (citation,) = schema["$defs"].values()
    assert citation["properties"]["cite_index"]["maximum"] == 5
    assert "[5] T4: text 4" in log[1][1].messages[-1][1]
    assert (done.answer, done.resolved_by) == ("Paris", "passages")
    assert done.citations == ["p1", "p0"]  # cite_list first, then [n] markers; index 9 is not a passage
    assert item.trace[-1]["cite_list"][0]["cite_reason"] == "why"


def test_irrelevant_evidence_answers_from_internal_knowledge_without_citations():
    done, _ = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q",
                    script(trajectory(relevant=False, answer="Lyon")))
    assert (done.answer, done.resolved_by, done.citations) == ("Lyon", "internal_knowledge", [])


def test_the_schema_keeps_the_papers_order_relevance_then_evidence_then_answer():
    # guided decoding writes fields in schema order: sorted keys wrote `analysis` and `answer` first
    log = []
    drive(SelfReasoning(SelfReasoningConfig()), "Q", script(trajectory()), log=log)
    schema = json.loads(log[1][1].json_schema)
    assert list(schema["properties"]) == ["relevant", "relevant_reason", "cite_list", "analysis", "answer"]
    assert schema["required"] == ["relevant", "relevant_reason", "cite_list", "analysis", "answer"]
    (citation,) = schema["$defs"].values()
    assert list(citation["properties"]) == ["cite_index", "cite_content", "cite_reason"]


def test_what_the_trajectory_may_copy_is_bounded():
    config = SelfReasoningConfig(max_citations=2, quote_chars=100, reason_chars=50, analysis_chars=300, answer_chars=40)
    log = []
    drive(SelfReasoning(config), "Q", script(trajectory()), log=log)
    schema = json.loads(log[1][1].json_schema)
    props, (citation,) = schema["properties"], schema["$defs"].values()
    assert props["cite_list"]["maxItems"] == 2 and props["analysis"]["maxLength"] == 300
    assert props["relevant_reason"]["maxLength"] == 50 and props["answer"]["maxLength"] == 40
    assert citation["properties"]["cite_content"]["maxLength"] == 100
    assert citation["properties"]["cite_reason"]["maxLength"] == 50


def test_the_instruction_describes_the_short_answer_as_configured():
    log = []
    drive(SelfReasoning(SelfReasoningConfig()), "Q", script(trajectory()), log=log)
    assert "short answer (no more than 10 words)" in log[1][1].messages[-1][1]  # the paper's words
    log = []
    drive(SelfReasoning(SelfReasoningConfig(short_answer="a name")), "Q", script(trajectory()), log=log)
    assert "short answer (a name)" in log[1][1].messages[-1][1]


def test_with_answer_step_read_the_short_answer_is_read_from_the_analysis_in_the_questions_form():
    """The untuned 0.5B model writes sentences in the short `answer` field (median 11 words on calib)."""
    log = []
    wordy = trajectory(analysis="The capital of France is Paris [1].", answer="The capital of France is Paris.")
    config = SelfReasoningConfig(answer_step="read")
    done, item = drive(SelfReasoning(config), "capital of France?", script(wordy, read="Paris"), log=log)
    read = log[-1][1]
    assert read.step == "read_analysis" and not read.json_schema and "The capital of France is Paris [1]." in read.messages[-1][1]
    assert (done.answer, done.resolved_by, done.citations) == ("Paris", "passages", ["p1", "p0"])
    assert item.trace[-1] == {"step": "read_analysis", "output": "Paris"}
    done, _ = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "capital of France?", script(wordy))
    assert done.answer == "The capital of France is Paris."  # the paper's: the trajectory's own answer
    assert SelfReasoningConfig().answer_step == "read"  # chosen on the calib slice
    # a choice form keeps the trajectory's guided choice: nothing to read
    s, item = SelfReasoning(config), Item("Is Paris in France?", kind="yes-no")
    s.start(item)
    s.resume(item, [Retrieval(PASSAGES)])
    done = s.resume(item, [Generation(json.dumps(trajectory(answer="yes")))])
    assert done.answer == "yes"


def test_a_yes_no_question_gets_a_yes_or_no_answer_in_the_trajectory_and_the_fallback():
    s = SelfReasoning(SelfReasoningConfig())
    item = Item("Is Paris in France?", kind="yes-no")
    s.start(item)
    step = s.resume(item, [Retrieval(PASSAGES)])
    assert json.loads(step.requests[0].json_schema)["properties"]["answer"]["enum"] == ["yes", "no"]
    assert "short answer (yes or no)" in step.requests[0].messages[-1][1]
    s.resume(item, [Generation("not json")])
    (read,) = s.resume(item, [Generation("{")]).requests
    assert isinstance(read, Judge) and read.choices == ("yes", "no") and read.stage == "generator"
    done = s.resume(item, [Judgment("yes", {"yes": 0.3, "no": 0.7})])
    assert (done.answer, done.resolved_by, done.citations) == ("no", "fallback", [])


@pytest.mark.parametrize("said, verdict", [("SUPPORT", "SUPPORTS"), ("REFUTE", "REFUTES")])
def test_claims_use_the_fact_verification_variant(said, verdict):
    s = SelfReasoning(SelfReasoningConfig())
    item = Item("The Eiffel Tower is in Rome.", kind="claim")
    s.start(item)
    step = s.resume(item, [Retrieval(PASSAGES)])
    user = step.requests[0].messages[-1][1]
    assert "check whether the given claim" in user and "decide with your own knowledge" in user
    assert json.loads(step.requests[0].json_schema)["properties"]["answer"]["enum"] == ["SUPPORT", "REFUTE"]
    assert s.resume(item, [Generation(json.dumps(trajectory(answer=said)))]).answer == verdict


def test_not_enough_info_is_a_verdict_only_when_configured():
    forms = AnswerFormConfig(verdicts=["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"])
    s = SelfReasoning(SelfReasoningConfig(), forms)
    item = Item("The Eiffel Tower is in Rome.", kind="claim")
    s.start(item)
    step = s.resume(item, [Retrieval(PASSAGES)])
    assert "output NOT ENOUGH INFO" in step.requests[0].messages[-1][1]
    assert json.loads(step.requests[0].json_schema)["properties"]["answer"]["enum"] == [
        "SUPPORT", "REFUTE", "NOT ENOUGH INFO"]
    assert s.resume(item, [Generation(json.dumps(trajectory(answer="NOT ENOUGH INFO")))]).answer == "NOT ENOUGH INFO"


@pytest.mark.parametrize("verdicts, said, answer, nei", [
    (["SUPPORT", "CONTRADICT"], "SUPPORT", "SUPPORT", False),  # SciFact's labels: SUPPORTS before, scored 0
    (["SUPPORT", "REFUTE"], "REFUTE", "REFUTE", False),
    (["supports", "refutes", "not enough info"], "NOT ENOUGH INFO", "not enough info", True),
    (["supports", "refutes"], "SUPPORT", "supports", False),
])
def test_a_claims_verdict_is_one_of_the_configured_labels_as_they_are_spelt(verdicts, said, answer, nei):
    s = SelfReasoning(SelfReasoningConfig(answer_step="trajectory"), AnswerFormConfig(verdicts=verdicts))
    item = Item("The Eiffel Tower is in Rome.", kind="claim")
    s.start(item)
    step = s.resume(item, [Retrieval(PASSAGES)])
    assert ("output NOT ENOUGH INFO" in step.requests[0].messages[-1][1]) is nei
    assert said in json.loads(step.requests[0].json_schema)["properties"]["answer"]["enum"]
    assert s.resume(item, [Generation(json.dumps(trajectory(answer=said)))]).answer == answer


def test_an_unparseable_trajectory_is_retried_once_then_falls_back_to_a_plain_read():
    log = []
    done, item = drive(SelfReasoning(SelfReasoningConfig(max_tokens=100)), "Q",
                       script('{"relevant": true, "analysis": "cut o', "not json"), log=log)
    assert [r.max_tokens for _, r in log if isinstance(r, Generate)] == [100, 200, None]
    assert item.counts["parse_failures"] == 2
    # a plain read cites nothing: its passages are the retrieval, not citations
    assert (done.answer, done.resolved_by, done.citations) == ("Paris", "fallback", [])
    # the retry succeeding needs no fallback
    done, item = drive(SelfReasoning(SelfReasoningConfig()), "Q", script("{", trajectory()))
    assert done.resolved_by == "passages" and item.counts["parse_failures"] == 1


def test_a_whole_trajectory_whose_answer_is_empty_is_not_asked_again_but_one_cut_off_is():
    """The model filled its analysis to the schema's bound and wrote "answer": "", a JSON it had finished:
    asked again with twice the tokens, greedy decoding wrote the same, a long generation for nothing."""
    def respond(finish):
        def answer(request, item):
            if isinstance(request, Retrieve):
                return Retrieval(PASSAGES[: request.k])
            if request.json_schema:
                return Generation(json.dumps(trajectory(answer="")), 300, 120, finish_reason=finish)
            return Generation("Paris", 300, 2)
        return answer

    for finish, tries in (("stop", 1), ("length", 2), (None, 2)):  # None: not known (a response cached before)
        log = []
        done, item = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q", respond(finish), log=log)
        assert len([r for _, r in log if isinstance(r, Generate) and r.json_schema]) == tries
        assert (done.answer, done.resolved_by) == ("Paris", "fallback") and item.counts["parse_failures"] == tries


def test_a_claim_whose_trajectory_fails_falls_back_to_a_verdict_not_free_text():
    s = SelfReasoning(SelfReasoningConfig())
    item = Item("The Eiffel Tower is in Rome.", kind="claim")
    s.start(item)
    s.resume(item, [Retrieval(PASSAGES)])
    s.resume(item, [Generation("not json")])
    step = s.resume(item, [Generation("{")])
    (judge,) = step.requests
    assert isinstance(judge, Judge) and judge.choices == ("SUPPORTS", "REFUTES") and judge.stage == "generator"
    assert "Claim: The Eiffel Tower is in Rome." in judge.messages[-1][1] and "[1] T0: text 0" in judge.messages[-1][1]
    done = s.resume(item, [Judgment("REFUTES", {"SUPPORTS": 0.2, "REFUTES": 0.8})])
    assert (done.answer, done.resolved_by, done.citations) == ("REFUTES", "fallback", [])
    assert item.trace[-1]["step"] == "fallback_read" and s.stages == {"generator", "retriever"}


def test_a_failed_retrieval_ends_with_an_error():
    done, _ = drive(SelfReasoning(SelfReasoningConfig()), "Q", lambda r, i: Retrieval(error="shard down"))
    assert done.error == "shard down"


def test_with_answer_step_follow_up_the_short_answer_is_the_next_turn_of_the_trajectorys_conversation():
    """The paper's model writes its short answer with the passages in view; a follow-up turn keeps them."""
    log = []
    wordy = trajectory(analysis="The capital of France is Paris [1].", answer="The capital of France is Paris.")
    config = SelfReasoningConfig(answer_step="follow_up")
    done, item = drive(SelfReasoning(config), "capital of France?", script(wordy, read="Answer: Paris"), log=log)
    first, follow = log[1][1], log[-1][1]
    assert follow.step == "follow_up" and not follow.json_schema and follow.max_tokens is None  # a short answer's budget
    assert follow.messages[:len(first.messages)] == first.messages  # the passages, as the trajectory saw them
    assert follow.messages[len(first.messages)] == ("assistant", json.dumps(wordy))
    assert follow.messages[-1][0] == "user" and "capital of France?" in follow.messages[-1][1]
    assert (done.answer, done.resolved_by, done.citations) == ("Paris", "passages", ["p1", "p0"])
    assert item.trace[-1] == {"step": "follow_up", "output": "Answer: Paris"}
    # a choice form keeps the trajectory's guided choice: nothing to ask
    s, item = SelfReasoning(config), Item("Is Paris in France?", kind="yes-no")
    s.start(item)
    s.resume(item, [Retrieval(PASSAGES)])
    assert s.resume(item, [Generation(json.dumps(trajectory(answer="yes")))]).answer == "yes"


@pytest.mark.parametrize("answer_step, trajectories", [
    ("read", [trajectory()]), ("follow_up", [trajectory()]), ("read", ["not json", "not json"])])
def test_each_step_after_the_trajectory_is_asked_and_traced_under_one_name(answer_step, trajectories):
    """The fallback read was asked as `read` and traced `fallback_read`, the read of the analysis and the
    follow-up asked as `answer`: step_tokens and metrics.json's truncated, keyed by the request, named no step
    the trace has."""
    log = []
    _, item = drive(SelfReasoning(SelfReasoningConfig(answer_step=answer_step)), "Q", script(*trajectories), log=log)
    assert log[-1][1].step == item.trace[-1]["step"] in ("read_analysis", "follow_up", "fallback_read")
    assert {r.step for _, r in log} <= {"retrieve", "trajectory"} | {t["step"] for t in item.trace}


def test_a_trajectory_past_a_bound_its_server_did_not_enforce_is_kept_within_it_not_rejected():
    """An endpoint that ignores maxLength / maxItems / minimum let an analysis of 501 characters, a cite_index 0
    or 4 citations through, and the whole trajectory was rejected: the row fell back, its answer lost."""
    cite = {"cite_content": "q" * 250, "cite_reason": "r" * 200}
    over = {**trajectory(analysis="Paris [2]. " + "x" * 495, answer="Paris " + "y" * 80), "relevant_reason": "z" * 151,
            "cite_list": [{"cite_index": i, **cite} for i in (0, 2, 6, 1, 3, 4)]}
    done, item = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q", script(over))
    assert (done.answer, done.resolved_by) == ("Paris " + "y" * 74, "passages") and "parse_failures" not in item.counts
    t = item.trace[-1]
    assert [c["cite_index"] for c in t["cite_list"]] == [2, 1, 3] and done.citations == ["p1", "p0", "p2"]
    assert (len(t["analysis"]), len(t["relevant_reason"]), len(t["cite_list"][0]["cite_content"]),
            len(t["cite_list"][0]["cite_reason"])) == (500, 150, 200, 150)
    # no usable answer is still no answer: the fallback reads
    done, _ = drive(SelfReasoning(SelfReasoningConfig()), "Q", script(trajectory(answer="```"), trajectory(answer="```")))
    assert done.resolved_by == "fallback"


def test_a_range_of_passages_cited_in_the_analysis_cites_each():
    """[1-3] was not read: the row had no citation though the analysis gave three."""
    done, _ = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q",
                    script(trajectory(cites=(), analysis="As [1-3] say, and [5].")))
    assert done.citations == ["p0", "p1", "p2", "p4"]


def test_a_range_cited_in_the_analysis_is_cut_to_the_passages_shown_before_it_is_expanded():
    """[1-1000000000] built a list of a billion indices in the driver (a MemoryError row, or the run's
    driver out of memory) before the indices past k were dropped."""
    done, _ = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q",
                    script(trajectory(cites=(), analysis="It grew [4-1000000000000], see [3-2] [0-1].")))
    assert done.citations == ["p3", "p4", "p2", "p1", "p0"]


@pytest.mark.parametrize("answer_step, step", [("read", "read_analysis"), ("follow_up", "follow_up")])
@pytest.mark.parametrize("read", ["Answer:\n", "```\n```", ""])
def test_a_short_answer_read_that_cleans_to_nothing_leaves_the_trajectorys_answer(answer_step, step, read):
    """The trajectory answered "Paris" and the read of it wrote "Answer:": the row answered "" from passages."""
    done, item = drive(SelfReasoning(SelfReasoningConfig(answer_step=answer_step)), "capital of France?",
                       script(trajectory(answer='"Paris"'), read=read))
    assert (done.answer, done.resolved_by, done.citations) == ("Paris", "passages", ["p1", "p0"])
    assert item.trace[-1] == {"step": step, "output": read, "fallback": "trajectory"}


@pytest.mark.parametrize("answer", ["```", "Answer:", '""'])
def test_a_trajectory_answer_that_cleans_to_nothing_goes_to_the_fallback_read(answer):
    """Its answer was checked with strip() and returned cleaned: "```" was the question's answer, empty."""
    done, _ = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q",
                    script(trajectory(answer=answer), trajectory(answer=answer), read="Paris"))
    assert (done.answer, done.resolved_by) == ("Paris", "fallback")


def test_with_no_passage_retrieved_the_answer_is_the_models_own_knowledge():
    """A "relevant" verdict over no passage was reported as resolved by passages."""
    respond = script(trajectory(cites=()))

    def nothing_retrieved(request, item):
        return Retrieval([]) if isinstance(request, Retrieve) else respond(request, item)
    done, _ = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q", nothing_retrieved)
    assert (done.resolved_by, done.citations) == ("internal_knowledge", [])


def test_a_choice_answer_is_not_cut_to_answer_chars_so_a_short_bound_keeps_a_long_verdict():
    """answer_chars cut every answer: with it under 15, 'NOT ENOUGH INFO' became 'NOT ENOUG', which no choice is,
    and the trajectory fell back to a plain read."""
    forms = AnswerFormConfig(verdicts=["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"])
    config = SelfReasoningConfig(answer_step="trajectory", answer_chars=9)
    done, item = drive(SelfReasoning(config, forms), "The Eiffel Tower is in Rome.",
                       script(trajectory(answer="NOT ENOUGH INFO")), kind="claim")
    assert (done.answer, done.resolved_by) == ("NOT ENOUGH INFO", "passages") and "parse_failures" not in item.counts
    done, _ = drive(SelfReasoning(config), "Q", script(trajectory(answer="Paris, France")))  # free text is still cut
    assert done.answer == "Paris, Fr"


def test_a_citation_index_written_as_text_or_a_float_is_range_checked_not_a_rejected_trajectory():
    """Only an int out of range was dropped: "7" or 7.0 of 5 passages reached pydantic, which rejected the whole
    trajectory (its answer too)."""
    cites = [{"cite_index": i, "cite_content": "...", "cite_reason": "why"} for i in ("7", 7.0, "2", 3.0, "two", None, 2.5)]
    done, item = drive(SelfReasoning(SelfReasoningConfig(answer_step="trajectory")), "Q",
                       script({**trajectory(analysis="Paris."), "cite_list": cites}))
    assert (done.answer, done.resolved_by) == ("Paris", "passages") and "parse_failures" not in item.counts
    assert [c["cite_index"] for c in item.trace[-1]["cite_list"]] == [2, 3] and done.citations == ["p1", "p2"]
