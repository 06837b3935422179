"""``ragsift calibrate``: thresholds chosen offline from probe rows, the papers' criteria."""

import json

import pytest

from jobs.calibrate import (
    choose,
    config_values,
    f1_threshold,
    keep_threshold,
    read_all_threshold,
    switch_threshold,
)
from schemas.errors import UserError
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
from strategies.calibration_probe import CalibrationProbe
from strategies.migres import MigresConfig
from strategies.raisf import RaisfConfig
from strategies.registry import AnswerConfig
from strategies.think_act import ThinkActConfig
from tests.strategies.scripted import drive


def test_a_switch_threshold_answers_closed_book_only_where_that_is_better():
    # the model is right closed-book only when it is very sure (0.9); reading is right elsewhere
    scores, closed, read = [0.9, 0.7, 0.6, 0.2], [1, 0, 0, 0], [0, 1, 1, 0]
    t, curve = switch_threshold(scores, closed, read)
    assert t == 0.8 and max(c["value"] for c in curve) == 0.75  # between 0.7 and 0.9
    assert switch_threshold([0.5, 0.5], [0, 0], [0, 0])[0] == 1.0  # ties: retrieve more
    # a gain of less than one question's worth (half a question of 4) is a tie too
    assert switch_threshold(scores, [0.5, 0, 0, 0], read)[0] == 1.0


def test_a_cut_of_one_passes_no_score_as_the_strategies_read_it():
    """A judge says P = 1.0 when no other choice is in its top log-probs: the curve scored the cut 1.0
    as letting those through, where Think-then-Act reads beta' 1.0 as "always retrieve" (and RA-ISF's
    know_threshold 1.0 now "never closed-book": tests/strategies/test_raisf.py)."""
    t, curve = switch_threshold([1.0, 1.0], [0, 0], [1, 1])
    assert t == 1.0 and curve[-1]["value"] == 1.0 and curve[-1]["above"] == 0.0


def test_relevance_threshold_maximises_f1_against_gold_passages():
    t, curve = f1_threshold([0.9, 0.8, 0.4, 0.3, 0.1], [True, True, False, True, False])
    assert t == 0.2 and max(c["F1"] for c in curve) == pytest.approx(6 / 7)  # between 0.1 and 0.3


def test_migres_delta_keeps_a_passage_for_the_required_share_of_questions():
    best = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    assert keep_threshold(best, 0.8) == 0.15 and sum(b >= 0.15 for b in best) == 8
    assert keep_threshold([0.3, 0.3, 0.3], 1.0) < 0.3  # nothing scores lower: a margin under the boundary


def test_migres_delta_is_not_on_a_questions_own_score_which_the_ranker_moves_between_batches():
    """The bi-encoder scored the boundary question 0.5716311931610107 in the probe's batch and
    0.5716310739517212 alone: a delta on its own score dropped it, and 9 of 12 kept a passage at --keep 0.8."""
    probe = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.59, 0.58, 0.5716311931610107, 0.4, 0.3]
    delta = keep_threshold(probe, 0.8)  # 10 of 12 must keep a passage
    alone = [s - 1.2e-7 for s in probe]  # every score a hair lower in another batch
    assert sum(s >= delta for s in alone) == 10 and sum(s >= delta for s in probe) == 10
    assert keep_threshold([*probe, float("nan")], 0.8) == delta  # a NaN score is no question's best


P = [Passage(f"p{i}", f"T{i}", f"Sentence {i} one. Sentence {i} two.", 1.0) for i in range(3)]


def respond(request, item):
    if isinstance(request, Retrieve):
        return Retrieval(P[: min(request.k, 3)])
    if isinstance(request, Rank):
        top = min(request.top, len(request.texts))
        return Ranking(list(range(top)), [0.9 - i / 10 for i in range(top)])
    if isinstance(request, Judge) and request.step == "assess":
        return Judgment("AMBIGUOUS", {"CLEAR AND COMPLETE": 0.2, "INCOMPLETE": 0.3, "AMBIGUOUS": 0.5})
    if isinstance(request, Judge) and request.stage == "judge":
        user = request.messages[-1][1]
        p = 0.8 if user.startswith("Can you use") else 0.3 if user.startswith("Can you answer") else (
            0.9 if "T1:" in user else 0.2)
        return Judgment("yes", {"yes": p, "no": 1 - p})
    assert isinstance(request, Generate)
    user = request.messages[-1][1]
    if request.step == "split":
        return Generation(json.dumps({"sub_questions": ["Who first?", "Who then?"]}))
    if request.step == "aggregate":
        return Generation("aggregated" if "Answer 2: sentences" in user else "wrong")
    lines = user.splitlines()
    units = sum(line.startswith("- ") for line in lines)  # Think-then-Act's context, one a line
    numbered = sum(line.startswith("[") for line in lines)  # rag's, numbered
    if "[1]" in user:  # rag's instruction: over passages rag's own read, over sentences Think-then-Act's
        return Generation("read" if "[1] T0:" in user else f"read sentences {numbered}")
    return Generation("closed" if "- " not in user else f"passages {units}" if "- T0:" in user else f"sentences {units}")


def test_the_probe_records_every_score_and_both_branches_answers():
    probe = CalibrationProbe(RaisfConfig(k=3), ThinkActConfig(), MigresConfig(passages_per_query=3))
    done, item = drive(probe, "Who?", respond)
    p = item.trace[0]
    assert (p["know_p_yes"], p["ta_beta"]) == (0.8, 0.3)
    assert (p["raisf_closed"], p["ta_closed"], p["read"]) == ("closed", "closed", "read")
    # each unit read at the paper's 3 and at k = 5 (of the 3 passages retrieved, all 3), under its
    # instruction and rag's; over all the passages, rag's instruction is rag's own read
    assert p["ta_retrieval"] == {"context:sentences:3": "sentences 3", "context:sentences:5": "sentences 5",
                                 "context:passages:3": "passages 3", "context:passages:5": "passages 3",
                                 "rag:sentences:3": "read sentences 3", "rag:sentences:5": "read sentences 5",
                                 "rag:passages:3": "read", "rag:passages:5": "read"}
    # the split branch: sub-queries answered as Think-then-Act answers them, then aggregated
    assert p["ta_p_ambiguous"] == 0.5 and p["ta_sub_queries"] == "aggregated"
    assert [t["step"] for t in item.trace] == ["probe", "split", "aggregate"]
    assert p["relevance_p_yes"] == [0.2, 0.9, 0.2] and p["top_k"] == ["p0", "p1", "p2"]
    assert p["migres_scores"] == [0.9, 0.8, 0.7] and done.resolved_by == "probe"
    from strategies.registry import ANSWERING
    assert "calibration_probe" not in ANSWERING and "raisf_labels" not in ANSWERING


def test_the_probe_reads_think_then_acts_own_k_passages_not_raisfs():
    many = [Passage(f"p{i}", f"T{i}", f"Sentence {i} one.", 1.0) for i in range(10)]

    def respond_k(request, item):
        return Retrieval(many[: request.k]) if isinstance(request, Retrieve) else respond(request, item)

    probe = CalibrationProbe(RaisfConfig(k=3), ThinkActConfig(k=10), MigresConfig(passages_per_query=3))
    p = drive(probe, "Who?", respond_k)[1].trace[0]
    # the read labelled "all k" read RA-ISF's 3 passages: Think-then-Act would read 10
    assert p["ta_retrieval"]["context:passages:10"] == "passages 10" and p["top_k"] == ["p0", "p1", "p2"]


def test_with_read_retrieved_the_probe_records_raisfs_own_read_of_all_k():
    def respond_own(request, item):
        return Generation("own read") if request.step == "raisf_read" else respond(request, item)

    # rag's instruction: RA-ISF's read of all k is the probe's read, not asked twice
    rag_prompt = CalibrationProbe(RaisfConfig(k=3, read="retrieved"), ThinkActConfig(), MigresConfig(passages_per_query=3))
    log = []
    p = drive(rag_prompt, "Who?", respond_own, log=log)[1].trace[0]
    assert p["raisf_read"] == p["read"] == "read" and not any(r.step == "raisf_read" for _, r in log)
    paper = CalibrationProbe(RaisfConfig(k=3, read="retrieved", answer_prompt="paper"), ThinkActConfig(),
                             MigresConfig(passages_per_query=3))
    p = drive(paper, "Who?", respond_own)[1].trace[0]
    assert (p["raisf_read"], p["read"]) == ("own read", "read") and p["migres_scores"] == [0.9, 0.8, 0.7]


def test_read_all_cut_is_chosen_by_the_answers_of_reading_against_decomposing():
    """With read: retrieved the cut decides only which questions are decomposed: a cut <= t0 (the F1 cut
    the decomposition pass ran at) decomposes those whose best passage scores below it."""
    def probe_row(qid, raisf_read):
        return {"id": qid, "error": None, "trace": json.dumps([{"step": "probe", "raisf_read": raisf_read}])}

    def raisf_row(qid, best, resolved_by, answer, p_yes=None):
        p_yes = [best, best / 2] if p_yes is None else p_yes
        trace = [{"step": "relevance", "p_yes": p_yes}] if resolved_by != "self_knowledge" else []
        return {"id": qid, "error": None, "trace": json.dumps(trace), "resolved_by": resolved_by, "answer": answer}

    gold = {q: {"answers": [a]} for q, a in (("1", "Paris"), ("2", "Rome"), ("3", "Oslo"), ("4", "Bern"))}
    probes = [probe_row("1", "Paris"), probe_row("2", "Milan"), probe_row("3", "Oslo"), probe_row("4", "x")]
    rows = [raisf_row("1", 0.9, "passages", "Paris"),
            raisf_row("2", 0.1, "decomposition", "Rome"),  # decomposing answers it, reading does not
            raisf_row("3", 0.4, "decomposition", "Bergen"),  # reading answers it, decomposing does not
            raisf_row("4", 0.0, "self_knowledge", "Bern")]  # never reaches the cut
    f1_cut = {"value": 0.5, "n": 8, "curve": []}
    chosen = read_all_threshold(rows, probes, gold, f1_cut)
    assert chosen["value"] == 0.25 and chosen["n"] == 3 and chosen["decomposed"] == pytest.approx(1 / 3)
    assert [c["t"] for c in chosen["curve"]] == [0.0, 0.25, 0.5]  # nothing is known above t0
    assert chosen["passage_f1_cut"] == f1_cut
    # the pass decides the branch at t0 (its trace's scores are rounded: 0.5 was 0.49996 there), and a
    # question with no passage is decomposed at every cut
    gold.update({"5": {"answers": ["Lima"]}, "6": {"answers": ["Kyiv"]}})
    more = [raisf_row("5", 0.5, "decomposition", "Lima"),  # a decomposition that gave no sub-question is one too
            raisf_row("6", 0.0, "decomposition_empty", "Kyiv", p_yes=[])]
    curve = read_all_threshold(rows + more, probes + [probe_row("5", "x"), probe_row("6", "x")], gold, f1_cut)["curve"]
    # cuts 0, 0.25, ~0.45 (between 0.4 and 5's score), 0.5: 5 gains only at t0, 6 at every cut
    assert [c["value"] for c in curve] == pytest.approx([3 / 5, 4 / 5, 3 / 5, 4 / 5])
    # decomposing never better: ties go to the lower cut, the same answers for fewer LLM calls
    rows[1]["answer"] = "Milan"
    assert read_all_threshold(rows, probes, gold, f1_cut)["value"] == 0.0
    with pytest.raises(UserError, match="older ragsift"):
        read_all_threshold(rows, [{"id": "1", "error": None, "trace": json.dumps([{"step": "probe"}])}], gold, f1_cut)


def test_read_all_cut_reads_a_claim_label_of_the_runs_verdicts_as_a_label():
    """Scored without the claim labels, reading all k that answered 'NOT SUPPORTED' to a 'SUPPORTED' claim counted
    as right, and beat the decomposition that answered it."""
    probe = {"id": "1", "error": None, "trace": json.dumps([{"step": "probe", "raisf_read": "NOT SUPPORTED"}])}
    decomposed = {"id": "1", "error": None, "trace": json.dumps([{"step": "relevance", "p_yes": [0.1]}]),
                  "resolved_by": "decomposition", "answer": "SUPPORTED"}
    gold = {"1": {"answers": ["SUPPORTED"]}}
    chosen = read_all_threshold([decomposed], [probe], gold, {"value": 0.5, "n": 1, "curve": []},
                                verdicts=("SUPPORTED", "NOT SUPPORTED"))
    # reading all k: F1 2/3 and no accuracy; decomposing: both
    assert [c["value"] for c in chosen["curve"]] == pytest.approx([1 / 3, 1.0]) and chosen["value"] == 0.5


def test_choose_reads_probe_rows_against_gold():
    def row(qid, know, beta, closed, read, rel, scores, ambiguous, split, passages=None, all_k=None):
        trace = [{"step": "probe", "know_p_yes": know, "ta_beta": beta, "raisf_closed": closed, "ta_closed": closed,
                  "read": read, "ta_retrieval": {"context:sentences:3": read, "context:passages:3": passages or read,
                                                 "context:passages:5": passages or read, "rag:passages:5": all_k or read},
                  "top_k": ["a", "b"],
                  "relevance_p_yes": rel, "migres_scores": scores, "ta_p_ambiguous": ambiguous, "ta_sub_queries": split}]
        return {"id": qid, "error": None, "trace": json.dumps(trace)}

    rows = [row("1", 0.95, 0.95, "Paris", "Lyon", [0.9, 0.1], [0.8], 0.5, "Lyon"),
            row("2", 0.6, 0.6, "Rome", "Berlin", [0.2, 0.7], [0.4], 0.7, None, passages="Bonn"),
            row("3", 0.4, 0.4, "x", "Ost", [0.3, 0.6], [0.6], 0.6, "Oslo", passages="Oslo")]
    gold = {"1": {"answers": ["Paris"], "gold_passage_ids": ["a"]}, "2": {"answers": ["Berlin"], "gold_passage_ids": ["b"]},
            "3": {"answers": ["Oslo"], "gold_passage_ids": ["b"]}}
    chosen = choose(rows, gold, keep=0.6)  # 2 of 3 questions keep a passage
    assert chosen["raisf.know_threshold"]["value"] == 0.775  # closed-book only for question 1
    # ties (1 of 3 each) -> the paper's reading, its 3 sentences
    assert [chosen[f"think_act.{f}"]["value"] for f in ("answer_prompt", "context", "top_sentences")] == [
        "context", "sentences", 3]
    assert chosen["think_act.beta_threshold"]["value"] == 0.775  # retrieve below
    # splitting helps only question 3 (0.6); 2 has no split (it reads), so its 0.7 must not pull the cut up
    assert chosen["think_act.ambiguity_threshold"]["value"] == 0.55
    assert chosen["raisf.relevance_threshold"]["value"] == 0.45  # a, b, b relevant; nothing else
    assert chosen["migres.relevance_threshold"]["value"] == 0.5  # between 0.6 (kept) and 0.4
    # reading all k passages with rag's instruction answers question 1 too: it wins, and beta' is then
    # chosen against it
    rows[0] = row("1", 0.95, 0.95, "Paris", "Lyon", [0.9, 0.1], [0.8], 0.5, "Lyon", all_k="Paris")
    chosen = choose(rows, gold, keep=0.6)
    assert [chosen[f"think_act.{f}"]["value"] for f in ("answer_prompt", "context", "top_sentences")] == [
        "rag", "passages", 5]
    assert chosen["think_act.beta_threshold"]["value"] == 1.0  # closed-book is never better than that read
    # ids ending '#<n>': parts of gold passages only where the probe read an index of split passages ('split'
    # was read from a local list of the same name, so a '#<n>' id was always taken for a part)
    parted = [dict(r, trace=r["trace"].replace('["a", "b"]', '["a#0", "b#1"]')) for r in rows]
    assert choose(parted, gold, keep=0.6, parts=True)["raisf.relevance_threshold"]["value"] == 0.45
    whole = {q: {**g, "gold_passage_ids": [f"{p}#0" for p in g["gold_passage_ids"]]} for q, g in gold.items()}
    assert choose(parted, whole, keep=0.6)["raisf.relevance_threshold"]["value"] != 0.45  # a#0 is gold, b#1 not
    stale = [dict(r, trace=r["trace"].replace('"context:sentences:3"', '"sentences:3"')) for r in rows]
    with pytest.raises(UserError, match="older ragsift"):
        choose(stale, gold, keep=0.6)
    config = AnswerConfig(raisf={"know_threshold": 0.95},
                          calibration={"questions": "calib.parquet", "questions_sha256": "x", "n": 3,
                                       "generator": "g", "ranker": "r", "chosen": {"raisf.know_threshold": 0.95}})
    assert config.calibration.chosen["raisf.know_threshold"] == 0.95


def test_the_probe_records_p_first_verdict_of_rags_read_for_a_claim_and_nothing_for_a_question():
    def respond_claim(request, item):
        if isinstance(request, Judge) and request.stage == "generator":  # a verdict, in the claim's form
            p = 0.3 if request.step == "read" else 0.6
            return Judgment("REFUTES", {"SUPPORTS": p, "REFUTES": 1 - p})
        return respond(request, item)

    probe = CalibrationProbe(RaisfConfig(k=3), ThinkActConfig(), MigresConfig(passages_per_query=3))
    p = drive(probe, "Paris is in France.", respond_claim, kind="claim")[1].trace[0]
    assert p["verdict_p_first"] == 0.3 and p["read"] == "REFUTES"
    assert "verdict_p_first" not in drive(probe, "Who?", respond)[1].trace[0]


def test_a_slice_with_claims_chooses_the_verdict_cut_from_p_first_verdict_of_rags_read():
    """The 0.5B model's likelier verdict was REFUTES for every claim while its P(SUPPORTS) ranked them."""
    def row(qid, p_supports, said):
        probe = {"step": "probe", "know_p_yes": 0.1, "ta_beta": 0.1, "raisf_closed": said, "ta_closed": said, "read": said,
                 "ta_retrieval": {"context:sentences:3": said}, "top_k": [], "relevance_p_yes": [], "migres_scores": [],
                 "ta_p_ambiguous": 0.1, "ta_sub_queries": None}
        if p_supports is not None:
            probe["verdict_p_first"] = p_supports
        return {"id": qid, "error": None, "trace": json.dumps([probe])}

    scored = [(0.05, "REFUTES"), (0.09, "REFUTES"), (0.12, "SUPPORTS"), (0.2, "SUPPORTS"), (0.1, "REFUTES")]
    rows = [row(str(i), p, "REFUTES") for i, (p, _) in enumerate(scored)] + [row("q", None, "Paris")]
    gold = {**{str(i): {"answers": [g]} for i, (_, g) in enumerate(scored)}, "q": {"answers": ["Paris"]}}
    chosen = choose(rows, gold, keep=0.8)
    assert chosen["answer_form.verdict_cut"]["value"] == 0.11 and chosen["answer_form.verdict_cut"]["n"] == 5
    own = choose([row("0", 0.3, "WRONG"), row("1", 0.1, "RIGHT")], {"0": {"answers": ["WRONG"]}, "1": {"answers": ["RIGHT"]}},
                 keep=0.8, verdicts=("WRONG", "RIGHT"))  # the configured labels
    assert own["answer_form.verdict_cut"]["value"] == 0.2
    # labels that contain each other are matched as labels: "NOT TRUE" is no "TRUE"
    said = {"0": (0.3, "TRUE"), "1": (0.4, "TRUE"), "2": (0.1, "NOT TRUE"), "3": (0.05, "NOT TRUE")}
    nested = choose([row(q, p, "NOT TRUE") for q, (p, _) in said.items()], {q: {"answers": [g]} for q, (_, g) in said.items()},
                    keep=0.8, verdicts=("TRUE", "NOT TRUE"))
    assert nested["answer_form.verdict_cut"]["value"] == 0.35  # (1.0 where "NOT TRUE" counted as containing "TRUE")
    assert "answer_form.verdict_cut" not in choose(rows[-1:], gold, keep=0.8)  # no claim in the slice: nothing chosen
    # the cut is on P(first verdict): the file carries the labels' order with it, defaults or not
    values = config_values(AnswerConfig(questions="claims.parquet"), {"answer_form.verdict_cut": {"value": 0.11}}, "f" * 64, 5)
    assert values["answer_form"] == {"verdict_cut": 0.11, "verdicts": ["SUPPORTS", "REFUTES"]}


def test_the_calibrated_config_names_the_models_its_thresholds_were_measured_with(tmp_path):
    """A P('yes') threshold belongs to the model that judged: without the judge in the file, the 1.5B
    judge's 0.71 would be applied to the 0.5B generator's scores."""
    import yaml

    from schemas.config import load_config

    chosen = {"raisf.relevance_threshold": {"value": 0.7}, "think_act.beta_threshold": {"value": 0.8}}
    base = AnswerConfig.model_validate({"questions": "calib.parquet", "generator": {"model": "small"},
                                        "judge": {"model": "large"}})
    values = config_values(base, chosen, "f" * 64, 166)
    (tmp_path / "calibrated.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    loaded = load_config(AnswerConfig, str(tmp_path / "calibrated.yaml"), [], questions="q", output="o")
    assert loaded.judge.model == "large" and loaded.generator.model == "small"
    assert loaded.raisf.relevance_threshold == 0.7 and loaded.think_act.beta_threshold == 0.8
    assert values["calibration"]["questions_sha256"] == "f" * 64 and values["calibration"]["n"] == 166
    no_judge = config_values(base.model_copy(update={"judge": None}), chosen, "f" * 64, 166)
    assert "judge" not in no_judge and no_judge["calibration"]["judge"] is None
    # the default judges: nothing more to name than the thresholds
    assert not {"know", "reranker"} & set(no_judge) and set(no_judge["raisf"]) == {"relevance_threshold"}


def test_the_calibrated_config_carries_the_trained_judges_and_the_ranker_its_thresholds_are_on(tmp_path):
    """A config calibrated with trained judges, passed alone with --config, judged with the generator's
    P('yes') against thresholds chosen on M_know's and M_rel's scores."""
    import yaml

    from schemas.config import load_config

    chosen = {"raisf.know_threshold": {"value": 0.76}, "migres.relevance_threshold": {"value": -1.35}}
    base = AnswerConfig.model_validate({"questions": "calib.parquet", "raisf": {"judges": "trained"},
                                        "know": {"model": "runs/m_know"}, "reranker": {"model": "runs/m_rel"}})
    (tmp_path / "calibrated.yaml").write_text(yaml.safe_dump(config_values(base, chosen, "f" * 64, 166)))
    loaded = load_config(AnswerConfig, str(tmp_path / "calibrated.yaml"), [], questions="q", output="o")
    assert (loaded.raisf.know_by, loaded.raisf.relevance_by) == ("trained", "trained")
    assert loaded.know.model == "runs/m_know" and loaded.reranker.model == "runs/m_rel"
    assert loaded.raisf.know_threshold == 0.76 and loaded.migres.relevance_threshold == -1.35
    # a cut chosen for reading all k must not be applied to reading P_rel
    # and every other setting they were measured under: a cut chosen for reading all k, at D_th 1, with
    # claims answered SUPPORTS / REFUTES / NOT ENOUGH INFO, must not be applied to another RA-ISF
    other = AnswerConfig.model_validate({**base.model_dump(), "raisf": {**base.raisf.model_dump(), "read": "retrieved",
                                                                       "d_th": 1},
                                         "answer_form": {"verdicts": ["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"]}})
    written = config_values(other, chosen, "f" * 64, 166)
    assert {k: written["raisf"][k] for k in ("read", "d_th", "judges")} == {"read": "retrieved", "d_th": 1,
                                                                           "judges": "trained"}
    assert written["answer_form"]["verdicts"][-1] == "NOT ENOUGH INFO"
    # MIGRES's delta and Think-then-Act's reads were measured under their sections' settings too
    measured = AnswerConfig.model_validate({**base.model_dump(), "migres": {"passages_per_query": 10, "retriever": "dense"},
                                            "think_act": {"k": 10, "context": "passages"}})
    written = config_values(measured, chosen, "f" * 64, 166)
    assert written["migres"] == {"passages_per_query": 10, "retriever": "dense", "relevance_threshold": -1.35}
    assert written["think_act"] == {"k": 10}  # context is calibrate's to choose: not carried from the base


def test_cuts_tell_apart_scores_closer_than_six_decimals_and_delta_is_written_as_chosen():
    from jobs.calibrate import candidates, f1_threshold

    assert all(0.9999993 < t < 1.0 for t in candidates([1.0, 0.9999993])[1:-1])  # both rounded to 1.0 before
    assert f1_threshold([1.0, 0.9999996, 0.9999996], [True, False, False])[0] > 0.9999996
    probe = {"know_p_yes": 0.5, "ta_beta": 0.5, "raisf_closed": "x", "ta_closed": "x", "read": "x",
             "ta_retrieval": {"context:sentences:3": "x"}, "top_k": ["a"], "relevance_p_yes": [0.5],
             "ta_p_ambiguous": 0.1, "ta_sub_queries": None}
    best = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1234567, 0.05]
    rows = [{"id": str(i), "error": None, "trace": json.dumps([{"step": "probe", **probe, "migres_scores": [b]}])}
            for i, b in enumerate(best)]
    gold = {str(i): {"answers": ["y"], "gold_passage_ids": ["z"]} for i in range(10)}  # no gold passage retrieved
    chosen = choose(rows, gold, keep=0.9)
    delta = chosen["migres.relevance_threshold"]["value"]
    assert sum(b >= delta for b in best) == 9  # rounded to 0.123457 it kept 8
    assert "raisf.relevance_threshold" not in chosen  # every cut scored F1 0: 1.0 (never relevant) was written


def test_when_every_probe_row_is_an_error_the_error_says_so_not_that_gold_is_missing():
    rows = [{"id": str(i), "error": "prompt of 595 tokens leaves 0 of max_model_len 256 to generate, needs 1",
             "trace": "[]"} for i in range(2)]
    with pytest.raises(UserError, match="2 of 2 probe rows are errors, e.g. prompt of 595 tokens"):
        choose(rows, {"0": {"answers": ["a"]}, "1": {"answers": ["b"]}}, keep=0.8)
    with pytest.raises(UserError, match="need gold `answers`"):
        choose([{**rows[0], "error": None}], {}, keep=0.8)


def test_the_calibrated_config_carries_the_generators_settings_that_decide_its_answers(tmp_path):
    """Only the model's name was written: a config calibrated on an endpoint at a 4,096-token context, passed
    alone, ran a local vLLM of the served model's name at 2,048."""
    import yaml

    from schemas.config import load_config

    base = AnswerConfig.model_validate({
        "questions": "_input/questions-1.parquet",
        "generator": {"model": "served", "max_model_len": 4096, "replicas": 3,
                      "endpoint": {"base_url": "http://h:8000/v1", "headers": {"X-Team": "$TEAM"}}},
        "judge": {"model": "big", "dtype": "float32"}})
    values = config_values(base, {"think_act.top_sentences": {"value": 5}}, "f" * 64, 12, questions="calib.jsonl")
    (tmp_path / "calibrated.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    loaded = load_config(AnswerConfig, str(tmp_path / "calibrated.yaml"), [], questions="q", output="o")
    assert loaded.generator.endpoint.base_url == "http://h:8000/v1" and loaded.generator.max_model_len == 4096
    assert loaded.generator.endpoint.headers == {"X-Team": "$TEAM"} and loaded.judge.dtype == "float32"
    assert loaded.generator.replicas == 1  # where it runs is the user's, not the calibration's
    # the slice as the user named it, not ragsift's Parquet copy; a count stays a count
    assert loaded.calibration.questions == "calib.jsonl"
    assert loaded.calibration.chosen["think_act.top_sentences"] == 5
    assert isinstance(loaded.calibration.chosen["think_act.top_sentences"], int)


def test_run_metadata_says_which_calibrated_values_the_run_overrode():
    from jobs.identity import calibration_record, ranker_name

    record = {"questions": "calib.parquet", "questions_sha256": "x", "n": 3, "generator": AnswerConfig().generator.model,
              "ranker": ranker_name(AnswerConfig()), "chosen": {"think_act.beta_threshold": 1.0, "think_act.top_sentences": 5}}
    same = AnswerConfig(think_act={"beta_threshold": 1.0, "top_sentences": 5}, calibration=record)
    assert "overridden" not in calibration_record(same)
    swept = AnswerConfig(think_act={"beta_threshold": 0.2, "top_sentences": 5}, calibration=record)
    assert calibration_record(swept)["overridden"] == {"think_act.beta_threshold": 0.2}
    assert calibration_record(AnswerConfig()) is None


def test_a_run_with_another_generator_judge_or_ranker_than_its_thresholds_were_calibrated_with_says_so(
        tmp_path, monkeypatch):
    """The thresholds are cuts on those models' scores; a run of the 0.5B model's calibrated file with the 1.5B
    generator showed them as applying. A relative folder the run pinned to an absolute path is the same model."""
    import os

    from jobs.answer import with_models_pinned
    from jobs.identity import calibration_record, ranker_name

    monkeypatch.chdir(tmp_path)
    for folder in ("m_know", "m_rel"):
        os.mkdir(folder)
    (tmp_path / "m_rel" / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    base = AnswerConfig(strategies=["raisf", "think_act"], raisf={"judges": "trained"}, know={"model": "m_know"},
                        reranker={"model": "m_rel"})  # Think-then-Act asks the judge pool, both the ranker
    record = {"questions": "c.parquet", "questions_sha256": "x", "n": 3, "generator": base.generator.model,
              "judge": None, "ranker": ranker_name(base), "know": "m_know", "chosen": {}}
    assert record["ranker"] == "cross-encoder:m_rel"

    def run(**update):
        return with_models_pinned(AnswerConfig(**{**base.model_dump(), "calibration": record, **update}))

    assert run().know.model == str(tmp_path / "m_know") and "overridden" not in calibration_record(run())
    other = run(generator={"model": "qwen2.5-coder-1.5b-instruct"}, judge={"model": "smollm2-135m-instruct"})
    assert calibration_record(other)["overridden"] == {"generator": "qwen2.5-coder-1.5b-instruct",
                                                       "judge": "smollm2-135m-instruct"}
    cosine = run(strategies=["think_act"], reranker={"model": None})
    assert calibration_record(cosine)["overridden"] == {"ranker": ranker_name(cosine)}
    rag = run(strategies=["rag"], reranker={"model": None}, judge={"model": "smollm2-135m-instruct"})
    assert "overridden" not in calibration_record(rag)  # no judge, no ranker asked: neither cuts anything

    from jobs.answer import calibrated_for_others

    assert calibrated_for_others(run()) is None and calibrated_for_others(AnswerConfig()) is None
    assert calibrated_for_others(other) == (
        "this config's thresholds were calibrated with generator qwen2.5-coder-0.5b-instruct, judge None (its "
        "calibration record), this run has qwen2.5-coder-1.5b-instruct, smollm2-135m-instruct: they are cuts on those "
        "models' scores; `ragsift calibrate` for these")


def test_the_calibration_record_names_the_self_knowledge_model_and_a_run_with_another_says_it_overrode_it():
    """RA-ISF's know threshold is a cut on M_know's scores: the record did not name M_know, so a run with
    another one showed the calibrated threshold as if it applied."""
    from jobs.identity import calibration_record

    def run(model="/m/know_v1", judges="trained", **record):
        record = {"questions": "c.parquet", "questions_sha256": "x", "n": 3, "generator": AnswerConfig().generator.model,
                  "ranker": "cross-encoder:/m/rel", "chosen": {"raisf.know_threshold": 0.7}, **record}
        return AnswerConfig(raisf={"judges": judges, "know_threshold": 0.7}, know={"model": model},
                            reranker={"model": "/m/rel"}, calibration=record)

    assert config_values(run(), {}, None, 1, "c.parquet")["calibration"]["know"] == "/m/know_v1"
    assert config_values(run(judges="generator"), {}, None, 1, "c.parquet")["calibration"]["know"] == "judge: P('yes')"
    assert "overridden" not in calibration_record(run(know="/m/know_v1"))
    assert calibration_record(run("/m/know_v2", know="/m/know_v1"))["overridden"] == {"know.model": "/m/know_v2"}
    # the generator's P('yes') judged what the threshold was chosen on M_know for
    assert calibration_record(run(judges="generator", know="/m/know_v1"))["overridden"] == {"know.model": "judge: P('yes')"}
    # and M_know judged what the threshold was chosen on the judge's P('yes') for (the record said None, as before)
    assert calibration_record(run(know="judge: P('yes')"))["overridden"] == {"know.model": "/m/know_v1"}
    assert "overridden" not in calibration_record(run(judges="generator", know="judge: P('yes')"))
    assert "overridden" not in calibration_record(run("/m/know_v2"))  # a record written before it named M_know


def test_probe_rows_of_an_older_ragsift_are_a_clear_error_not_a_crash():
    trace = [{"step": "probe", "know_p_yes": 0.5, "ta_beta": 0.5, "raisf_closed": "a", "ta_closed": "a", "read": "a",
              "ta_retrieval": "a", "top_k": [], "relevance_p_yes": [], "migres_scores": []}]
    with pytest.raises(UserError, match="older ragsift.*new --output"):
        choose([{"id": "1", "error": None, "trace": json.dumps(trace)}], {"1": {"answers": ["Paris"]}}, keep=0.8)


@pytest.mark.ray
def test_answering_the_slice_a_config_was_calibrated_on_is_said_to_be_fitted_not_measured(ray_session, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.stages import GeneratorStage
    from jobs.answer import answer
    from jobs.storage import file_sha256, filesystem
    from schemas.config import StageBatching
    from tests.engine.fakes import FakeGenerator

    questions = tmp_path / "calib.parquet"
    pq.write_table(pa.table({"id": ["q0"], "question": ["Who?"]}), questions)
    fs, path = filesystem(str(questions))
    record = {"questions": "calib.parquet", "questions_sha256": file_sha256(fs, path), "n": 1, "generator": "g",
              "ranker": "r"}
    said = []
    for output, sha in (("fitted", record["questions_sha256"]), ("other", "0" * 64)):
        config = AnswerConfig(questions=str(questions), output=str(tmp_path / output), strategies=["direct"],
                              calibration={**record, "questions_sha256": sha})
        actor = ray_session.remote(FakeGenerator).options(num_cpus=0).remote()
        answer(config, log=said.append, stages={"generator": GeneratorStage([actor], StageBatching())})
        assert sum("calibrated on (calib.parquet)" in line for line in said) == 1  # the first run only


def test_a_run_from_the_calibrated_file_alone_resolves_every_setting_the_calibration_answered_under(tmp_path):
    """Sampling and retrieval.method were left out: a slice calibrated at temperature 0.7 over hybrid
    retrieval ran from the file at 0.0 over dense, answers the thresholds were never chosen for."""
    import yaml

    from jobs.calibrate import calibrated_yaml
    from jobs.identity import _flatten, operational
    from schemas.config import load_config

    measured = load_config(AnswerConfig, None, [
        "sampling.temperature=0.7", "sampling.max_tokens=64", "retrieval.method=hybrid", "retrieval.k=8",
        "retrieval.dense_weight=0.5", "index.nprobe=32", "embedder.model=my-embedder", "nli.model=my-nli",
        "engine.max_depth=6", "input.max_question_chars=100", "generator.max_model_len=4096", "judge.model=big",
        "self_reasoning.k=3", "raisf.read=retrieved", "answer_form.by_dataset={strategyqa: yes_no_reasoned}",
        "raisf.know_threshold=0.2",  # calibrate's to choose: the file holds its choice, not this
        "generator.replicas=3", "input.columns={question: query}", "index.index_type=ivf_flat",  # not the file's
        "ray.object_store_mb=500", "cache.enabled=false"],
        questions="calib.jsonl", output="cal")
    chosen = {"raisf.know_threshold": {"value": 0.73}, "think_act.top_sentences": {"value": 5}}
    (tmp_path / "calibrated.yaml").write_text(calibrated_yaml(config_values(measured, chosen, "f" * 64, 12)))
    loaded = load_config(AnswerConfig, str(tmp_path / "calibrated.yaml"), [], questions="q.parquet", output="o")

    def answering(config):
        run_own = ("questions", "output", "strategies", "limit", "input.columns", "input.split", "commit.",
                   "calibration", "index.index_type")
        return {k: v for k, v in _flatten(config.model_dump(mode="json")).items()
                if not operational(k) and not k.startswith(run_own)}

    calibrated = measured.model_copy(update={"raisf": measured.raisf.model_copy(update={"know_threshold": 0.73}),
                                             "think_act": measured.think_act.model_copy(update={"top_sentences": 5})})
    assert answering(loaded) == answering(calibrated)
    assert (loaded.sampling.temperature, loaded.retrieval.method) == (0.7, "hybrid")
    # the slice's own reading, where it runs, and how its index was built stay the run's
    assert (loaded.input.columns, loaded.generator.replicas, loaded.index.index_type) == ({}, 1, "flat")
    written = yaml.safe_load((tmp_path / "calibrated.yaml").read_text())
    assert "ray" not in written and "cache" not in written  # sections that decide no answer


def test_the_slices_sha256_is_of_the_file_the_user_gave_and_a_run_over_either_form_is_said_fitted(tmp_path):
    """It was the sha256 of ragsift's Parquet copy of a JSON Lines slice, which no one can check against their file."""
    import hashlib

    from jobs.answer import calibrated_on, with_questions_read
    from jobs.question_sources import is_datasets_dir, sha256_of, source_sha256

    jsonl = tmp_path / "calib.jsonl"
    jsonl.write_text('{"id": "q0", "question": "Who?", "answers": ["x"]}\n')
    given = AnswerConfig(questions=str(jsonl), output=str(tmp_path / "cal"))
    read = with_questions_read(given).questions
    assert read != str(jsonl) and not is_datasets_dir(read)
    assert source_sha256(str(jsonl)) == hashlib.sha256(jsonl.read_bytes()).hexdigest() != sha256_of(read)
    assert source_sha256(f"hf:{tmp_path}") is None  # not one file
    values = config_values(given, {}, source_sha256(str(jsonl)), 1, questions=str(jsonl), converted=sha256_of(read))
    calibrated = AnswerConfig(calibration=values["calibration"])
    assert calibrated.calibration.questions_sha256 == hashlib.sha256(jsonl.read_bytes()).hexdigest()
    # a run over the JSON Lines slice again reads its copy; over the slice's own Parquet, that file
    assert calibrated_on(calibrated, sha256_of(read)) and calibrated_on(calibrated, source_sha256(str(jsonl)))
    assert not calibrated_on(calibrated, "0" * 64) and not calibrated_on(AnswerConfig(), sha256_of(read))


def test_the_calibration_record_names_the_split_of_a_slice_with_several():
    """A `datasets` folder's split was recorded nowhere: the record named the folder, whose splits differ."""
    given = AnswerConfig(questions="hf:my/qa", output="cal", input={"split": "validation"})
    values = config_values(given, {}, None, 1)
    assert AnswerConfig(calibration=values["calibration"]).calibration.split == "validation"
    assert "split" not in config_values(given.model_copy(update={"input": type(given.input)()}), {}, None, 1)["calibration"]


def test_an_alias_and_the_folder_it_was_prepared_in_are_the_same_model():
    """M_know's card names the generator by its alias; a run naming it by its folder was warned that M_know
    predicts another model's answers."""
    from jobs.identity import same_model
    from jobs.models import is_prepared, model_dir

    alias = AnswerConfig().generator.model
    if not is_prepared(alias):
        pytest.skip(f"{alias} is not prepared here")
    assert same_model(alias, str(model_dir(alias))) and same_model(str(model_dir(alias)) + "/", alias)
    assert not same_model(alias, "smollm2-135m-instruct") and not same_model(alias, "org/hub-model")



def test_a_probe_over_the_error_share_exits_3_and_writes_no_thresholds(tmp_path, monkeypatch, capsys):
    """Before, calibrate fitted its thresholds to the rows that happened to answer, wrote them as the slice's
    and exited 0, where answer, compare, label and sweep exit 3."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs import calibrate
    from jobs.cli import main

    questions = tmp_path / "calib.parquet"
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["Who?", "What?"], "answers": [["a"], ["b"]]}), questions)
    probe = {"exactly_once": {"calibration_probe": {"rows": 10, "errors": 6}}}
    monkeypatch.setattr(calibrate.answer_job, "answer", lambda *a, **k: probe)
    monkeypatch.setattr(calibrate, "choose", lambda *a, **k: pytest.fail("thresholds fitted to 4 rows of 10"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "calibrated.yaml").write_text("# an earlier calibration's thresholds")
    assert main(["calibrate", "--questions", str(questions), "--output", str(out),
                 "--set", "commit.max_error_share=0.1"]) == 3
    err = capsys.readouterr().err
    assert "6 of the output's 10 rows are error rows" in err and "--force asks them again" in err
    assert not (out / "calibrated.yaml").exists()  # it would read as this slice's
