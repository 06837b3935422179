"""What ``ragsift calibrate`` needs to choose thresholds, from one pass of the model over a question.

Each threshold decides between two branches of a strategy; the probe asks for both branches'
answers and for the score the threshold cuts, so every candidate value can be scored offline:

    raisf.know_threshold          P('yes') of RA-ISF's self-knowledge prompt; its closed-book answer
                                  vs a read of the top-k passages (the passages branch's stand-in)
    raisf.relevance_threshold     P('yes') of RA-ISF's relevance prompt for each top-k passage
                                  (against the question's gold passages)
    think_act.beta_threshold      beta = P('yes') of Think-then-Act's confidence prompt; its closed-book
                                  answer vs its answer from the top sentences of the top-k passages
    migres.relevance_threshold    the ranker's scores of the top-N passages MIGRES retrieves (delta
                                  is set so that a share of questions keeps a passage, its Section 4)

Every answer is in the question's form, as the strategies answer. The final answer is RA-ISF's
closed-book one; the probes are in the trace.
"""

from __future__ import annotations

from schemas.config import AnswerFormConfig, MigresConfig, RaisfConfig, ThinkActConfig
from schemas.records import Judge, Rank, Retrieve
from strategies.base import Done, Item, ask, format_passages, prompt
from strategies.filtering import passage_requests, sentences
from strategies.forms import final_answer, final_request, form_of
from strategies.raisf import know_request, p_yes, relevance_requests, relevance_scores


class CalibrationProbe:
    name = "calibration_probe"
    stages = frozenset({"generator", "judge", "retriever", "ranker"})

    def __init__(self, raisf: RaisfConfig, think_act: ThinkActConfig, migres: MigresConfig,
                 forms: AnswerFormConfig | None = None):
        self.raisf, self.think_act, self.migres = raisf, think_act, migres
        self.forms = forms or AnswerFormConfig()
        if raisf.judges == "trained":
            self.stages = self.stages | {"know"}

    def _answer(self, item, user):
        return final_request(user, form_of(item, self.forms), self.forms)

    def start(self, item: Item):
        q = item.question
        return ask(item, "first", [
            know_request(q, self.raisf),
            Judge((("user", prompt("ta_confidence").format(question=q)),)),
            self._answer(item, prompt("raisf_answer").format(question=q)),
            self._answer(item, prompt("direct_user").format(question=q)),
            Retrieve(q, self.raisf.k),
            Retrieve(q, self.migres.passages_per_query, self.migres.retriever),
        ])

    def resume(self, item: Item, responses):
        for r in responses:
            if r.error:
                return Done("", "error", error=r.error)
        return getattr(self, "_after_" + item.state["phase"])(item, responses)

    def _after_first(self, item, responses):
        know, confidence, raisf_closed, ta_closed, top_k, migres_top = responses
        item.passages = top_k.passages
        item.trace.append({"step": "probe", "know_p_yes": p_yes(know, self.raisf.judge_by),
                           "ta_beta": confidence.prob("yes"),
                           "raisf_closed": final_answer(raisf_closed), "ta_closed": final_answer(ta_closed),
                           "top_k": [p.id for p in top_k.passages],
                           "migres_candidates": [p.id for p in migres_top.passages]})
        q = item.question
        pool = [s for p in top_k.passages for s in sentences(p.text)]
        item.state["pool"] = pool
        requests = relevance_requests(q, top_k.passages, self.raisf)
        item.state["n_relevance"] = len(requests)
        requests.append(self._answer(item, prompt("rag_user").format(passages=format_passages(top_k.passages),
                                                                      question=q)))
        if pool:
            requests.append(Rank(q, tuple(pool), self.think_act.top_sentences))
        if migres_top.passages:
            requests.append(passage_requests(q, migres_top.passages))
        return ask(item, "second", requests)

    def _after_second(self, item, responses):
        probe = item.trace[-1]
        k = item.state["n_relevance"]
        relevance, read, ranks = responses[:k], responses[k], iter(responses[k + 1:])
        sentence_rank = next(ranks) if item.state["pool"] else None
        migres_rank = next(ranks) if probe["migres_candidates"] else None
        probe.update(relevance_p_yes=relevance_scores(relevance, len(item.passages), self.raisf), read=final_answer(read),
                     migres_scores=sorted(migres_rank.scores, reverse=True) if migres_rank else [])
        chosen = [item.state["pool"][i] for i in sentence_rank.indices] if sentence_rank else []
        context = "\n".join(f"- {s}" for s in chosen) or "(nothing found)"
        return ask(item, "third", [self._answer(item, prompt("ta_answer_context").format(context=context,
                                                                                          question=item.question))])

    def _after_third(self, item, responses):
        probe = item.trace[-1]
        probe["ta_retrieval"] = final_answer(responses[0])
        return Done(probe["raisf_closed"], "probe")
