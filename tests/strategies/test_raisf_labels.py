"""RA-ISF's label collection (Appendix A) with a scripted model."""

from schemas.records import Retrieval
from strategies.raisf import RaisfConfig
from strategies.raisf_labels import RaisfLabels
from tests.strategies.scripted import drive
from tests.strategies.test_raisf import Script


def test_one_pass_collects_closed_book_answer_decomposition_and_relevance():
    log = []
    done, item = drive(RaisfLabels(RaisfConfig(k=3)), "Q", Script(relevant={"Q": {"p1"}}, subs={"Q": ["a?", "b?"]}),
                       log=log)
    assert (done.answer, done.resolved_by) == ("closed(Q)", "labels")
    assert [type(r).__name__ for _, r in log] == ["Generate", "Retrieve", "Generate", "Judge", "Judge", "Judge"]
    steps = {t["step"]: t for t in item.trace}
    assert steps["decompose"] == {"step": "decompose", "sub_questions": ["a?", "b?"], "parsed": True}
    assert steps["retrieve"]["ids"] == ["p0", "p1", "p2"]
    assert steps["relevance"]["relevant"] == [False, True, False] and steps["relevance"]["p_yes"] == [0.2, 0.9, 0.2]


def test_unparsed_decomposition_is_counted_and_no_passages_means_no_relevance_labels():
    script = Script(subs={"Q": "not json"})

    def no_passages(request, item):
        return Retrieval([]) if type(request).__name__ == "Retrieve" else script(request, item)

    done, item = drive(RaisfLabels(RaisfConfig()), "Q", no_passages)
    assert done.resolved_by == "labels" and item.counts["parse_failures"] == 1
    assert [t["step"] for t in item.trace] == ["closed_book", "decompose", "retrieve"]


def test_self_knowledge_labels_alone_cost_one_short_generation():
    log = []
    strategy = RaisfLabels(RaisfConfig(), collect=["self_knowledge"])
    done, item = drive(strategy, "Q", Script(), log=log)
    assert [type(r).__name__ for _, r in log] == ["Generate"] and strategy.stages == {"generator"}
    assert (done.answer, [t["step"] for t in item.trace]) == ("closed(Q)", ["closed_book"])


def test_a_relevance_label_is_cut_as_raisf_cuts_it_unrounded():
    """P(yes) 0.49996 was rounded to 0.5 and then cut: labelled relevant where RA-ISF's judge drops it."""
    from schemas.records import Judgment

    script = Script(subs={"Q": ["a?"]})

    def near_the_cut(request, item):
        if getattr(request, "step", None) == "relevance":
            return Judgment("no", {"yes": 0.49996, "no": 0.50004}, 20, 1)
        return script(request, item)

    _, item = drive(RaisfLabels(RaisfConfig(k=1, relevance_threshold=0.5)), "Q", near_the_cut)
    relevance = next(t for t in item.trace if t["step"] == "relevance")
    assert relevance["relevant"] == [False] and relevance["p_yes"] == [0.5]  # shown rounded, cut as it is


def test_a_decomposition_label_listing_the_question_itself_keeps_as_many_sub_questions_as_raisf_would():
    """The copy was dropped after the cap (by the label job), so the label lost the last sub-question."""
    _, item = drive(RaisfLabels(RaisfConfig(max_subquestions=2), collect=["decomposition"]), "Q",
                    Script(subs={"Q": ["Q", "A?", "B?"]}))
    assert next(t for t in item.trace if t["step"] == "decompose")["sub_questions"] == ["A?", "B?"]
