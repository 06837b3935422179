"""What ``ragsift calibrate`` needs to choose thresholds, from one pass of the model over a question.

Each threshold decides between two branches of a strategy; the probe asks for both branches'
answers and for the score the threshold cuts, so every candidate value can be scored offline:

    raisf.know_threshold          P('yes') of RA-ISF's self-knowledge prompt; its closed-book answer
                                  vs a read of the top-k passages (the passages branch's stand-in)
    raisf.relevance_threshold     P('yes') of RA-ISF's relevance prompt for each top-k passage
                                  (against the question's gold passages); with ``read: retrieved``
                                  also RA-ISF's read of all top k (``raisf_read``), which ``ragsift
                                  calibrate`` sets against its decomposition answers
    think_act.context,            its answers from the top 3 sentences of the top-k passages, from
    think_act.top_sentences,      the top 3 passages, and from k of each, under its instruction and
    think_act.answer_prompt       under rag's (``readings``)
    think_act.beta_threshold      beta = P('yes') of Think-then-Act's confidence prompt; its closed-book
                                  answer vs its answer from the top-k passages
    think_act.ambiguity_threshold P(AMBIGUOUS) of its assessment; its answer by sub-queries (split,
                                  each answered as Think-then-Act answers a sub-query, aggregated) vs
                                  its answer from the top-k passages (the query read as it is: the
                                  rewrite of an INCOMPLETE query is not probed)
    migres.relevance_threshold    the ranker's scores of the top-N passages MIGRES retrieves (delta
                                  is set so that a share of questions keeps a passage, its Section 4)
    answer_form.verdict_cut       for a claim between two verdicts, P(first verdict) of rag's read of the
                                  top-k passages (``verdict_p_first``)

Every answer is in the question's form, as the strategies answer. The final answer is RA-ISF's
closed-book one; the probes are in the trace.
"""

from __future__ import annotations

from engine.steps import Done, Item
from schemas.config import AnswerFormConfig
from schemas.records import Judge, Judgment, Rank, Retrieve
from strategies.base import Routine, Solve, format_passages, prompt
from strategies.filtering import passage_requests
from strategies.forms import VERDICT, final_answer, final_request, form_of
from strategies.migres import MigresConfig
from strategies.raisf import (
    RaisfConfig,
    check_judges,
    judge_stages,
    know_request,
    p_yes,
    relevance_requests,
    relevance_scores,
)
from strategies.think_act import (
    CONTEXTS,
    ThinkActConfig,
    ThinkThenAct,
    answer_prompt,
    assess_request,
    context_pool,
    readings,
)


def reading_key(style: str, context: str, n: int) -> str:
    """How the probe names a read in ``ta_retrieval``: 'rag:passages:5'."""
    return f"{style}:{context}:{n}"


def reading_of(key: str) -> tuple[str, str, int] | None:
    """The (answer_prompt, context, units) a ``reading_key`` names; None for a key of an older probe."""
    parts = key.split(":")
    return (parts[0], parts[1], int(parts[2])) if len(parts) == 3 else None


class CalibrationProbe(Routine):
    name = "calibration_probe"
    answers = False  # its rows are probes for `ragsift calibrate`

    def __init__(self, raisf: RaisfConfig, think_act: ThinkActConfig, migres: MigresConfig,
                 forms: AnswerFormConfig | None = None):
        self.raisf, self.think_act, self.migres = raisf, think_act, migres
        self.forms = forms or AnswerFormConfig()
        self.ta = ThinkThenAct(think_act, self.forms)  # answers the probe's sub-queries, as it would its own
        self.stages = frozenset({"generator", "judge", "retriever", "ranker"} | judge_stages(raisf, every_module=True))

    @classmethod
    def from_run(cls, run) -> CalibrationProbe:
        return cls(run.raisf, run.think_act, run.migres, run.answer_form)

    @staticmethod
    def check(run) -> None:
        check_judges(run, every_module=True)

    @staticmethod
    def retrieval_methods(run) -> set[str]:
        return {run.migres.retriever}

    def solve(self, item: Item) -> Solve:
        if item.depth:  # a sub-query of Think-then-Act's split branch
            return (yield from self.ta.solve(item))
        q, form = item.question, form_of(item, self.forms)

        def answer(user: str, step: str):
            return final_request(user, form, self.forms, step=step)

        def answered(response) -> str:
            return final_answer(response, form, self.forms)

        know, confidence, assessed, raisf_closed, ta_closed, top_k, ta_top, migres_top = yield [
            know_request(q, self.raisf),
            Judge((("user", prompt("think_act/confidence").format(question=q)),), step="capability"),
            assess_request(q),
            answer(prompt("raisf/answer").format(question=q), "raisf_closed"),
            answer(prompt("direct/user").format(question=q), "ta_closed"),
            Retrieve(q, self.raisf.k),
            Retrieve(q, self.think_act.k),  # Think-then-Act's own k (the engine asks once when they are equal)
            Retrieve(q, self.migres.passages_per_query, self.migres.retriever),
        ]
        item.passages = top_k.passages
        probe = {"step": "probe", "know_p_yes": p_yes(know, self.raisf.judge_by), "ta_beta": confidence.prob("yes"),
                 "ta_p_ambiguous": assessed.prob("AMBIGUOUS"),
                 "raisf_closed": answered(raisf_closed), "ta_closed": answered(ta_closed),
                 "top_k": [p.id for p in top_k.passages], "migres_candidates": [p.id for p in migres_top.passages]}
        item.trace.append(probe)
        pools = {c: context_pool(ta_top.passages, self.think_act.model_copy(update={"context": c})) for c in CONTEXTS}
        relevance = relevance_requests(q, top_k.passages, self.raisf)
        passages = format_passages(top_k.passages)
        requests = [*relevance, answer(prompt("rag/user").format(passages=passages, question=q), "read")]
        # RA-ISF's read of all k (read: retrieved) is rag's request unless it reads with the paper's instruction
        own_read = self.raisf.read == "retrieved" and self.raisf.answer_prompt != "rag"
        if own_read:
            requests.append(answer(prompt("raisf/answer_passages").format(passages=passages, question=q), "raisf_read"))
        contexts = [c for c in CONTEXTS if pools[c]]
        reads_of = readings(self.think_act)
        # one ranking per unit: a read of the top n is its first n (best first)
        requests += [Rank(q, tuple(pools[c]), max(n for *_, n in reads_of)) for c in contexts]
        if migres_top.passages:
            requests.append(passage_requests(q, migres_top.passages))
        responses = yield requests
        k = len(relevance)
        judged, read, raisf_read = responses[:k], responses[k], responses[k + 1] if own_read else responses[k]
        ranks = iter(responses[k + 1 + own_read:])
        ranked = {c: next(ranks) for c in contexts}
        migres_rank = next(ranks) if migres_top.passages else None
        probe.update(relevance_p_yes=relevance_scores(judged, len(item.passages), self.raisf), read=answered(read),
                     raisf_read=answered(raisf_read),
                     migres_scores=sorted(migres_rank.scores, reverse=True) if migres_rank else [])
        if form == VERDICT and len(self.forms.verdicts) == 2 and isinstance(read, Judgment) and read.probs:
            probe["verdict_p_first"] = read.probs.get(self.forms.verdicts[0], 0.0)
        reads = []
        for style, c, n in reads_of:
            chosen = [pools[c][i] for i in ranked[c].indices[:n]] if c in ranked else []
            reads.append(answer(answer_prompt(chosen, q, style), "ta_retrieval"))
        probe["ta_retrieval"] = dict(zip([reading_key(*r) for r in reads_of], map(answered, (yield reads))))
        split = yield from self.ta.by_sub_queries(item)  # None: nothing to split into, the query goes on as it is
        probe["ta_sub_queries"] = split.answer if split else None
        return Done(probe["raisf_closed"], "probe")
