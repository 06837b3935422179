"""RA-ISF transitions (Algorithm 1) with a scripted model: every branch, caps, ablations, parsing."""

import json

import pytest

from schemas.records import (
    Generate,
    Generation,
    Judge,
    Judgment,
    Passage,
    Retrieval,
    Retrieve,
)
from strategies.raisf import RAISF, RaisfConfig
from tests.strategies.scripted import drive

PASSAGES = [Passage(f"p{i}", f"T{i}", f"text {i}", 1.0 - i / 10) for i in range(5)]


class Script:
    """know: P(yes) per question; relevant: passage ids judged relevant per question;
    subs: decomposition per question (a list, or raw text)."""

    def __init__(self, know=None, relevant=None, subs=None):
        self.know, self.relevant, self.subs = know or {}, relevant or {}, subs or {}

    def __call__(self, request, item):
        q = item.question
        if request.step == "self_knowledge":
            p = self.know.get(q, 0.1)
            return Judgment("yes" if p >= 0.5 else "no", {"yes": p, "no": 1 - p}, 20, 1)
        if request.step == "relevance":
            user = request.messages[-1][1]
            pid = next(p.id for p in PASSAGES if f"{p.title}: {p.text}" in user)
            p = 0.9 if pid in self.relevant.get(q, ()) else 0.2
            return Judgment("yes" if p >= 0.5 else "no", {"yes": p, "no": 1 - p}, 20, 1)
        if isinstance(request, Retrieve):
            return Retrieval(PASSAGES[: request.k])
        assert isinstance(request, Generate)
        if request.step == "decompose":
            subs = self.subs.get(q, [])
            return Generation(subs if isinstance(subs, str) else json.dumps({"sub_questions": subs}), 30, 10)
        if request.step == "synthesize" and "Sub-question 1" in request.messages[-1][1]:
            return Generation(f"synth({q})", 50, 3)
        if request.step == "answer_passages":
            return Generation(f"read({q})", 200, 3)
        return Generation(f"closed({q})", 10, 3)


def kinds(log):
    return [type(r).__name__ for _, r in log]


def test_knows_answers_closed_book():
    log = []
    done, item = drive(RAISF(RaisfConfig()), "Q", Script(know={"Q": 0.8}), log=log)
    assert (done.answer, done.resolved_by) == ("closed(Q)", "self_knowledge")
    assert kinds(log) == ["Judge", "Generate"]
    assert item.trace[0]["know"] is True


def test_a_know_threshold_of_one_never_answers_closed_book_even_at_p_one():
    """README: with know_threshold 1.0 RA-ISF always retrieves; a judge's P = 1.0 (no "no" among its top
    log-probs) passed it and was answered closed-book."""
    done, item = drive(RAISF(RaisfConfig(know_threshold=1.0)), "Q", Script(know={"Q": 1.0}, relevant={"Q": {"p1"}}))
    assert done.resolved_by == "passages" and item.trace[0]["know"] is False


def test_answers_from_the_relevant_passages_only():
    log = []
    done, _ = drive(RAISF(RaisfConfig()), "Q", Script(relevant={"Q": {"p1", "p3"}}), log=log)
    assert (done.answer, done.resolved_by, done.citations) == ("read(Q)", "passages", ["p1", "p3"])
    assert kinds(log) == ["Judge", "Retrieve"] + ["Judge"] * 5 + ["Generate"]
    read_prompt = log[-1][1].messages[-1][1]
    assert "T1: text 1" in read_prompt and "T3: text 3" in read_prompt and "T0:" not in read_prompt


def test_reading_the_retrieved_passages_reads_all_k_once_one_is_relevant_and_cites_the_relevant():
    log = []
    done, _ = drive(RAISF(RaisfConfig(read="retrieved")), "Q", Script(relevant={"Q": {"p3"}}), log=log)
    assert (done.answer, done.resolved_by, done.citations) == ("read(Q)", "passages", ["p3"])
    read_prompt = log[-1][1].messages[-1][1]
    assert all(f"T{i}: text {i}" in read_prompt for i in range(5))
    assert read_prompt.index("T0:") < read_prompt.index("T4:")  # retrieval order, as rag reads them


def test_reading_the_retrieved_passages_still_decomposes_when_none_is_relevant():
    done, _ = drive(RAISF(RaisfConfig(read="retrieved")), "Q", Script(subs={"Q": ["A?"]}, know={"A?": 0.9}))
    assert (done.answer, done.resolved_by) == ("synth(Q)", "decomposition")


@pytest.mark.parametrize("answer_prompt, instruction", [
    ("rag", "Answer the question in a few words, using the passages below."),
    ("paper", "Using the knowledge from the relevant paragraphs, give the answer to the question."),
])
def test_the_answer_from_passages_reads_with_rags_instruction_unless_the_papers_is_asked(answer_prompt, instruction):
    log = []
    drive(RAISF(RaisfConfig(answer_prompt=answer_prompt)), "Q", Script(relevant={"Q": {"p1"}}), log=log)
    read_prompt = log[-1][1].messages[-1][1]
    assert read_prompt.startswith(instruction) and "T1: text 1" in read_prompt and read_prompt.endswith("Question: Q\nAnswer:")


def test_decomposes_and_synthesizes_from_sub_answers_in_order():
    script = Script(subs={"Q": ["A?", "B?"]}, know={"A?": 0.9}, relevant={"B?": {"p0"}})
    log = []
    done, item = drive(RAISF(RaisfConfig()), "Q", script, log=log)
    assert (done.answer, done.resolved_by) == ("synth(Q)", "decomposition")
    synth_prompt = log[-1][1].messages[-1][1]
    assert synth_prompt.index("Sub-question 1: A?\nAnswer 1: closed(A?)") < synth_prompt.index(
        "Sub-question 2: B?\nAnswer 2: read(B?)")
    assert max(d for d, _ in log) == 1


def test_depth_cap_answers_unknown_below_d_th():
    # nothing known, nothing relevant, every question decomposes into two
    script = Script(subs={q: [q + ".a", q + ".b"] for q in ["Q", "Q.a", "Q.b", "Q.a.a", "Q.a.b", "Q.b.a", "Q.b.b"]})
    log = []
    done, item = drive(RAISF(RaisfConfig(d_th=1)), "Q", script, log=log)
    assert done.resolved_by == "decomposition"
    # a node at D_th answers its sub-questions 'unknown' itself: no node below D_th exists
    assert max(d for d, _ in log) == 1
    synth_q_a = [r.messages[-1][1] for d, r in log
                 if d == 1 and isinstance(r, Generate) and "Based on" in r.messages[-1][1]][0]
    assert "Answer 1: unknown" in synth_q_a and "Answer 2: unknown" in synth_q_a


def test_no_self_knowledge_ablation_retrieves_first():
    log = []
    drive(RAISF(RaisfConfig(self_knowledge=False)), "Q", Script(relevant={"Q": {"p0"}}), log=log)
    assert kinds(log)[0] == "Retrieve"


def test_no_relevance_ablation_decomposes_without_retrieving():
    log = []
    done, _ = drive(RAISF(RaisfConfig(passage_relevance=False)), "Q",
                    Script(subs={"Q": ["A?"]}, know={"A?": 0.9}), log=log)
    assert "Retrieve" not in kinds(log) and done.resolved_by == "decomposition"


def test_without_relevance_and_decomposition_what_the_model_does_not_know_is_unknown():
    # the paper's "No QDM" ablation, with M_rel ablated too: nothing decomposes, nothing is retrieved
    log = []
    done, item = drive(RAISF(RaisfConfig(passage_relevance=False, decomposition=False)), "Q", Script(), log=log)
    assert (done.answer, done.resolved_by) == ("unknown", "unknown") and kinds(log) == ["Judge"]
    assert item.trace[-1]["step"] == "not_known"


def test_a_synthesis_cites_the_passages_its_sub_answers_cited():
    script = Script(subs={"Q": ["A?", "B?", "C?"]}, relevant={"A?": {"p1"}, "B?": {"p1", "p3"}})
    done, _ = drive(RAISF(RaisfConfig()), "Q", script)
    assert done.resolved_by == "decomposition" and done.citations == ["p1", "p3"]  # C? cited nothing: it decomposed


def test_no_decomposition_ablation_gives_unknown():
    log = []
    done, _ = drive(RAISF(RaisfConfig(decomposition=False)), "Q", Script(), log=log)
    assert (done.answer, done.resolved_by) == ("unknown", "unknown")
    assert all(not (isinstance(r, Generate) and r.json_schema) for _, r in log)


def test_no_decomposition_ablation_answers_a_yes_no_question_or_a_claim_in_its_choices_not_unknown():
    """"unknown" is no answer of a closed set: a yes/no question got it, scored wrong and breaking the set."""
    def respond(request, item):
        if isinstance(request, Judge) and request.step == "answer_closed":
            return Judgment(request.choices[-1], {c: 0.5 + 0.1 * (i == len(request.choices) - 1)
                                                  for i, c in enumerate(request.choices)}, 20, 1)
        return Script()(request, item)

    for question, kind, answer in (("Is Paris in Spain?", "yes-no", "no"), ("Paris is in Spain.", "claim", "REFUTES")):
        done, item = drive(RAISF(RaisfConfig(decomposition=False)), question, respond, kind=kind)
        assert (done.answer, done.resolved_by) == (answer, "closed_book")
        assert [t["step"] for t in item.trace][-2:] == ["no_relevant_passage", "answer_closed"]


def test_unparseable_decomposition_is_retried_once_counted_and_falls_back_to_answering():
    log = []
    done, item = drive(RAISF(RaisfConfig()), "Q", Script(subs={"Q": "I cannot split this."}), log=log)
    decompositions = [r for _, r in log if isinstance(r, Generate) and r.json_schema]
    assert [r.max_tokens for r in decompositions] == [160, 320]  # one retry, with room to finish the JSON
    assert item.counts["parse_failures"] == 2
    assert [t.get("retry", False) for t in item.trace if t["step"] == "decompose"] == [True, False]
    assert done.resolved_by == "decomposition_empty" and done.answer == "closed(Q)"  # M(q, {}, {}) is M(q)
    # a numbered list outside JSON is used, but still counted as a parse failure
    done, item = drive(RAISF(RaisfConfig()), "Q", Script(subs={"Q": "1. A?\n2. B?"}, know={"A?": .9, "B?": .9}))
    assert decomposed(item) == ["A?", "B?"] and item.counts["parse_failures"] == 2


def test_sub_questions_are_capped_after_a_repeat_of_the_question_is_dropped():
    """Before, the cap came first: ["Q", "A?"], then the repeat went, and B? was lost to it."""
    done, item = drive(RAISF(RaisfConfig(max_subquestions=2)), "Q",
                       Script(subs={"Q": ["Q", "A?", "B?", "C?"]}, know={"A?": .9, "B?": .9}))
    assert decomposed(item) == ["A?", "B?"]


@pytest.mark.parametrize("judge_by, p_yes, label, knows", [
    ("logprob", 0.6, "no", True), ("logprob", 0.4, "yes", False),
    ("label", 0.1, "yes", True), ("label", 0.9, "no", False)])
def test_judgments_by_logprob_or_label(judge_by, p_yes, label, knows):
    s = RAISF(RaisfConfig(judge_by=judge_by))
    from strategies.base import Item
    item = Item("Q")
    s.start(item)
    step = s.resume(item, [Judgment(label, {"yes": p_yes, "no": 1 - p_yes})])
    assert isinstance(step.requests[0], Generate if knows else Retrieve)


def test_errors_end_the_item_with_an_error():
    from strategies.base import Item
    s = RAISF(RaisfConfig(self_knowledge=False))
    item = Item("Q")
    s.start(item)
    assert s.resume(item, [Retrieval(error="boom")]).error == "boom"


def test_a_node_at_d_th_synthesizes_from_unknown_sub_answers_without_spawning():
    from strategies.base import Ask, Item, Spawn
    s = RAISF(RaisfConfig(d_th=2, self_knowledge=False))
    item = Item("Q", depth=2)
    s.start(item)
    s.resume(item, [Retrieval(PASSAGES)])
    s.resume(item, [Judgment("no", {"yes": 0.1, "no": 0.9})] * 5)
    step = s.resume(item, [Generation(json.dumps({"sub_questions": ["A?", "B?"]}))])
    assert isinstance(step, Ask) and not isinstance(step, Spawn)
    assert "Answer 1: unknown\nSub-question 2: B?\nAnswer 2: unknown" in step.requests[0].messages[-1][1]
    assert RaisfConfig(d_th=3, max_subquestions=4).max_nodes == 1 + 4 + 16 + 64


def decomposed_into(subs):
    """A RA-ISF item that found no passage relevant and split into ``subs``, waiting for their answers."""
    from strategies.base import Item
    s, item = RAISF(RaisfConfig(self_knowledge=False)), Item("Q")
    s.start(item)
    s.resume(item, [Retrieval(PASSAGES)])
    s.resume(item, [Judgment("no", {"yes": 0.1, "no": 0.9})] * 5)
    s.resume(item, [Generation(json.dumps({"sub_questions": subs}))])
    return s, item


def test_sub_questions_the_engine_did_not_run_or_that_failed_are_unknown():
    from strategies.base import Done
    s, item = decomposed_into(["A?", "B?", "C?"])
    step = s.resume(item, [Done("a", "passages"), Done("", "node_cap", error="not run: past engine.max_nodes_per_root"),
                           Done("", "error", error="boom")])
    user = step.requests[0].messages[-1][1]
    assert "Answer 1: a\n" in user and "Answer 2: unknown\n" in user and "Answer 3: unknown\n" in user


def test_a_decomposition_whose_sub_questions_all_failed_is_an_error_row_not_a_synthesis_of_unknowns():
    """Before, it synthesised from "unknown" alone and was counted a decomposition: no error row, so
    --retry-errors, the exit status and commit.max_error_share never saw it."""
    from strategies.base import Done
    s, item = decomposed_into(["A?", "B?"])
    done = s.resume(item, [Done("", "error", error="generator: boom"),
                           Done("", "node_cap", error="not run: past engine.max_nodes_per_root")])
    assert isinstance(done, Done) and done.resolved_by == "error" and "generator: boom" in done.error
    assert item.trace[-1]["step"] == "sub_questions_failed"
    # only capped by the engine: Algorithm 1's unknowns, synthesised, as before
    s, item = decomposed_into(["A?", "B?"])
    step = s.resume(item, [Done("", "node_cap", error="not run: past engine.max_nodes_per_root")] * 2)
    assert "Answer 1: unknown\n" in step.requests[0].messages[-1][1]


def test_a_sub_answer_shown_as_unknown_lends_the_synthesis_none_of_its_citations():
    """An empty sub-answer was shown as "unknown" but its passages were cited as the synthesis's evidence."""
    from strategies.base import Done
    s, item = decomposed_into(["A?", "B?"])
    step = s.resume(item, [Done("a", "passages", ["p1"]), Done("  ", "passages", ["p2", "p3"])])
    assert "Answer 2: unknown\n" in step.requests[0].messages[-1][1]
    done = s.resume(item, [Generation("synth")])
    assert (done.resolved_by, done.citations) == ("decomposition", ["p1"])


@pytest.mark.parametrize("phase", ["know", "relevance"])
def test_a_failed_judgment_is_an_error_never_a_no(phase):
    from strategies.base import Item
    s = RAISF(RaisfConfig())
    item = Item("Q")
    failed = Judgment("", error="generator failed 3 times: boom")
    s.start(item)
    if phase == "relevance":
        s.resume(item, [Judgment("no", {"yes": 0.1, "no": 0.9})])
        s.resume(item, [Retrieval(PASSAGES)])
        done = s.resume(item, [Judgment("yes", {"yes": 0.9, "no": 0.1})] * 4 + [failed])
    else:
        done = s.resume(item, [failed])
    assert (done.resolved_by, done.error) == ("error", "generator failed 3 times: boom")


def test_the_engine_caps_must_hold_a_whole_ra_isf_tree():
    from strategies.registry import AnswerConfig
    with pytest.raises(ValueError, match="max_nodes_per_root 64 cannot hold an RA-ISF tree.*85 nodes"):
        AnswerConfig(strategies=["raisf"], engine={"max_nodes_per_root": 64})
    AnswerConfig(strategies=["rag"], engine={"max_nodes_per_root": 64})
    assert AnswerConfig(strategies=["raisf"]).engine.max_nodes_per_root >= RaisfConfig().max_nodes


def decomposed(item) -> list[str]:
    return next(t["sub_questions"] for t in item.trace if t["step"] == "decompose" and not t.get("retry"))


def test_one_module_may_be_trained_while_the_generator_judges_the_other():
    from schemas.records import Classify, Rank, Ranking
    from strategies.registry import AnswerConfig

    class TrainedRelevance(Script):
        def __call__(self, request, item):
            if isinstance(request, Rank):  # M_rel: logits, P = sigmoid; p1 and p3 relevant
                return Ranking(list(range(5)), [2.0 if i in (1, 3) else -2.0 for i in range(5)])
            return super().__call__(request, item)

    config = RaisfConfig(relevance_judge="trained")
    log = []
    done, item = drive(RAISF(config), "Q", TrainedRelevance(), log=log)
    assert kinds(log) == ["Judge", "Retrieve", "Rank", "Generate"]  # the prompt judges M_know, M_rel ranks
    assert (done.resolved_by, done.citations) == ("passages", ["p1", "p3"])
    assert RAISF(config).stages == {"generator", "retriever", "judge", "ranker"}
    assert RAISF(RaisfConfig(judges="trained", relevance_judge="generator")).stages == \
        {"generator", "retriever", "know", "judge"}
    assert isinstance(next(iter(RAISF(RaisfConfig(know_judge="trained")).solve(item))), Classify)

    with pytest.raises(ValueError, match="needs reranker.model"):
        AnswerConfig(strategies=["raisf"], raisf={"relevance_judge": "trained"})
    with pytest.raises(ValueError, match="needs know.model"):
        AnswerConfig(strategies=["raisf"], raisf={"judges": "trained", "relevance_judge": "generator"},
                     reranker={"model": "m_rel"})
    AnswerConfig(strategies=["raisf"], raisf={"relevance_judge": "trained"}, reranker={"model": "m_rel"})


# (ablated module, its trained model's section, its pool, its metadata key, the other module's section and judge name)
ABLATIONS = [("self_knowledge", "know", "know", "self_knowledge", "reranker", "trained cross-encoder:m_rel"),
             ("passage_relevance", "reranker", "ranker", "relevance", "know", "trained classifier:m_know")]


@pytest.mark.parametrize("module, section, pool, key, other, other_judge", ABLATIONS)
def test_an_ablated_module_needs_no_trained_model_starts_no_pool_and_is_named_as_no_judge(module, section, pool, key,
                                                                                         other, other_judge):
    """raisf.self_knowledge=false (or passage_relevance=false) with trained judges still required that module's
    model, started its pool and said in metrics.json that it judged, though no question asked it."""
    from jobs.identity import judges_name
    from strategies.calibration_probe import CalibrationProbe
    from strategies.registry import AnswerConfig

    models = {"know": {"model": "m_know"}, "reranker": {"model": "m_rel"}}
    raisf = {"judges": "trained", module: False}
    ablated = AnswerConfig(strategies=["raisf"], raisf=raisf, **{other: models[other]})
    assert RAISF.from_run(ablated).stages == {"generator", "retriever", {"know": "know", "reranker": "ranker"}[other]}
    assert judges_name(ablated) == {key: f"none: ablated (raisf.{module}: false)",
                                    {"self_knowledge": "relevance", "relevance": "self_knowledge"}[key]: other_judge}
    # calibrate's probe records every module's scores, the ablated one's too: it still needs its model
    with pytest.raises(ValueError, match=f"needs {section}.model"):
        AnswerConfig(strategies=["calibration_probe"], raisf=raisf, **{other: models[other]})
    probing = AnswerConfig(strategies=["calibration_probe"], raisf=raisf, **models)
    assert pool in CalibrationProbe.from_run(probing).stages
    assert judges_name(probing)[key] != f"none: ablated (raisf.{module}: false)"


def test_a_root_at_d_th_zero_that_decomposes_is_not_counted_as_answered_from_sub_answers():
    """At raisf.d_th 0 the root decomposes (Algorithm 1) into sub-questions that are all "unknown": its synthesis
    read no sub-answer, and was labelled `decomposition`, which Table 7 counts as the decomposition module's."""
    done, item = drive(RAISF(RaisfConfig(d_th=0, self_knowledge=False)), "Q", Script(subs={"Q": ["A?"]}))
    assert done.resolved_by == "decomposition_past_depth" and done.citations == []
    assert any(t["step"] == "depth_cap" for t in item.trace)


def test_with_both_judges_ablated_the_passages_read_are_no_citation():
    """No module chose among them (M_know and M_rel both off): all k retrieved were written as citations, and
    evaluate scored them as the model's, where rag's same read cites nothing."""
    done, _ = drive(RAISF(RaisfConfig(self_knowledge=False, passage_relevance=False)), "Q", Script())
    assert (done.resolved_by, done.citations) == ("passages", [])


def test_with_both_judges_ablated_and_nothing_retrieved_the_answer_is_closed_book():
    """It said `passages` over no passage, where rag, Think-then-Act and Self-Reasoning say the model's own."""
    script = Script()

    def nothing_retrieved(request, item):
        return Retrieval([]) if isinstance(request, Retrieve) else script(request, item)
    done, item = drive(RAISF(RaisfConfig(self_knowledge=False, passage_relevance=False)), "Q", nothing_retrieved)
    assert (done.resolved_by, done.citations, item.passages) == ("closed_book", [], [])


@pytest.mark.timeout(20)
def test_a_huge_d_th_is_refused_at_once_naming_the_depth_setting():
    """raisf.d_th=1000000 computed its tree's node count (m^d summed) for minutes before any error."""
    from strategies.registry import AnswerConfig
    with pytest.raises(ValueError, match="raisf.d_th"):
        AnswerConfig(strategies=["raisf"], raisf={"d_th": 1_000_000}, engine={"max_depth": 1_000_000})
