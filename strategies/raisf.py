"""RA-ISF: Retrieval Augmented Iterative Self-Feedback (Liu et al.), Algorithm 1 as a state machine.

    Problem-solving(q, iter):
        iter > D_th                      -> "unknown"
        M_know(q) = know                 -> M(q)                         resolved_by=self_knowledge
        P = R(q, k); P_rel = {p : M_rel(q, p) = relevant}
        P_rel non-empty                  -> M(q, P_rel)                  resolved_by=passages
        Q_sub = M_decom(q); a_i = Problem-solving(q_i, iter + 1)
                                         -> M(q, Q_sub, A_sub)           resolved_by=decomposition

Sub-questions are child items on the engine (so all nodes of all trees batch together); a node at
depth D_th answers its sub-questions "unknown" itself (they would be past D_th) instead of spawning
them, so a tree has at most 1 + m + ... + m^D_th nodes for m = ``max_subquestions``. A sub-question
the engine could not run (its node cap) or that failed is "unknown" too. Binary judgments use
P('yes') of the first token against a threshold (``judge_by=logprob``) or the guided label; a
judgment that failed is an error, never a "no". Every answer M(...) is in the question's form
(forms.py). Ablations (paper Table 2): no self-knowledge (go straight to retrieval), no passage
relevance (decompose when the model does not know), no decomposition ("unknown" when nothing is
relevant).
"""

from __future__ import annotations

import math

from schemas.config import AnswerFormConfig, RaisfConfig
from schemas.records import (
    Classify,
    Generate,
    Judge,
    Judgment,
    Passage,
    Rank,
    Ranking,
    Retrieve,
)
from strategies.base import (
    Done,
    Item,
    Spawn,
    answer_messages,
    ask,
    format_passages,
    parse_failed,
    prompt,
)
from strategies.forms import final_answer, final_request, form_of, response_text
from strategies.parsing import parse_string_list, same_question, string_list_schema

UNKNOWN = "unknown"
DECOMPOSE_TOKENS = 160


class RAISF:
    name = "raisf"
    stages = frozenset({"generator", "judge", "retriever"})

    def __init__(self, config: RaisfConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.decompose_schema = string_list_schema("sub_questions", config.max_subquestions)
        if config.judges == "trained":  # M_know on its own pool, M_rel as the ranker's cross-encoder
            self.stages = frozenset({"generator", "know", "ranker", "retriever"})

    # Each phase handler gets the responses to the requests the previous phase asked for.

    def start(self, item: Item):
        if item.depth > self.config.d_th:
            item.trace.append({"step": "depth_cap", "depth": item.depth})
            return Done(UNKNOWN, "unknown")
        if self.config.self_knowledge:
            return ask(item, "know", [know_request(item.question, self.config)])
        return self._retrieve(item)

    def resume(self, item: Item, responses):
        return getattr(self, "_after_" + item.state["phase"])(item, responses)

    def _after_know(self, item, responses):
        (judgment,) = responses
        if judgment.error:
            return Done("", "error", error=judgment.error)
        p_yes = self._p_yes(judgment)
        knows = p_yes >= self.config.know_threshold
        item.trace.append({"step": "self_knowledge", "p_yes": round(p_yes, 4), "label": judgment.label,
                           "know": knows})
        if knows:
            return self._answer(item, "answer_closed", prompt("raisf_answer").format(question=item.question))
        if self.config.passage_relevance:
            return self._retrieve(item)
        return self._decompose(item)

    def _after_answer_closed(self, item, responses):
        return self._done(item, responses[0], "self_knowledge")

    def _retrieve(self, item):
        return ask(item, "retrieve", [Retrieve(item.question, self.config.k)])

    def _after_retrieve(self, item, responses):
        (retrieval,) = responses
        if retrieval.error:
            return Done("", "error", error=retrieval.error)
        item.passages = retrieval.passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in retrieval.passages]})
        if not self.config.passage_relevance:  # only reachable with self-knowledge ablated too
            return self._answer_from(item, retrieval.passages)
        judges = relevance_requests(item.question, retrieval.passages, self.config)
        return ask(item, "relevance", judges) if judges else self._no_relevant(item)

    def _after_relevance(self, item, responses):
        failed = next((j.error for j in responses if j.error), None)
        if failed:
            return Done("", "error", error=failed)
        scores = relevance_scores(responses, len(item.passages), self.config)
        relevant = [p for p, s in zip(item.passages, scores) if s >= self.config.relevance_threshold]
        item.trace.append({"step": "relevance", "p_yes": [round(s, 4) for s in scores],
                           "relevant": [p.id for p in relevant]})
        if relevant:
            item.state["relevant"] = [p.id for p in relevant]
            return self._answer_from(item, relevant)
        return self._no_relevant(item)

    def _answer_from(self, item, passages):
        user = prompt("raisf_answer_passages").format(passages=format_passages(passages), question=item.question)
        item.state["cited"] = [p.id for p in passages]  # the evidence M_rel chose: RA-ISF's citations
        return self._answer(item, "answer_passages", user)

    def _after_answer_passages(self, item, responses):
        return self._done(item, responses[0], "passages", item.state["cited"])

    def _no_relevant(self, item):
        if self.config.decomposition:
            return self._decompose(item)
        item.trace.append({"step": "no_relevant_passage"})
        return Done(UNKNOWN, "unknown")

    def _decompose(self, item, max_tokens=DECOMPOSE_TOKENS):
        user = prompt("raisf_decompose").format(question=item.question)
        return ask(item, "decompose", [Generate(answer_messages(user, system=None), max_tokens=max_tokens,
                                                json_schema=self.decompose_schema)])

    def _after_decompose(self, item, responses):
        (gen,) = responses
        if gen.error:
            return Done("", "error", error=gen.error)
        subs, ok = parse_string_list(gen.text, "sub_questions", self.config.max_subquestions)
        if not ok and parse_failed(item, "decompose", gen.text):
            return self._decompose(item, max_tokens=2 * DECOMPOSE_TOKENS)
        # a sub-question identical to its parent would recurse on itself until D_th
        subs = [q for q in subs if not same_question(q, item.question)]
        item.trace.append({"step": "decompose", "sub_questions": subs, "parsed": ok})
        item.state["subs"] = subs
        if not subs:  # Algorithm 1 with an empty Q_sub: M(q, {}, {}) is M(q)
            return self._answer(item, "synthesize", prompt("raisf_answer").format(question=item.question))
        if item.depth + 1 > self.config.d_th:  # Problem-solving(q_i, iter + 1) with iter + 1 > D_th
            item.trace.append({"step": "depth_cap", "depth": item.depth + 1, "sub_questions": len(subs)})
            return self._synthesize(item, [(q, UNKNOWN) for q in subs])
        item.state["phase"] = "children"
        return Spawn(subs)

    def _after_children(self, item, children: list[Done]):
        # a sub-question that failed, or that the engine did not run (its node cap), is unknown
        answers = [c.answer if c.answer and not c.error else UNKNOWN for c in children]
        return self._synthesize(item, list(zip(item.state["subs"], answers)))

    def _synthesize(self, item, pairs):
        lines = "\n".join(f"Sub-question {i}: {q}\nAnswer {i}: {a}" for i, (q, a) in enumerate(pairs, 1))
        return self._answer(item, "synthesize", prompt("raisf_synthesize").format(pairs=lines, question=item.question))

    def _after_synthesize(self, item, responses):
        return self._done(item, responses[0], "decomposition")

    # helpers

    def _answer(self, item, phase, user):
        """M(...): the answer step, in the form the question asks."""
        return ask(item, phase, [final_request(user, form_of(item, self.forms), self.forms)])

    def _p_yes(self, judgment: Judgment) -> float:
        return p_yes(judgment, self.config.judge_by)

    def _done(self, item, response, resolved_by, citations=()):
        item.trace.append({"step": resolved_by, "output": response_text(response)})
        if response.error:
            return Done("", "error", error=response.error)
        return Done(final_answer(response), resolved_by, list(citations))



def judge_request(user: str) -> Judge:
    return Judge((("user", user),))


def know_request(question: str, config: RaisfConfig) -> Judge | Classify:
    """M_know(q): the trained classifier, or the judge asked the paper's self-knowledge prompt."""
    if config.judges == "trained":
        return Classify(question)
    return judge_request(prompt("raisf_know").format(question=question))


def relevance_requests(question: str, passages: list[Passage], config: RaisfConfig) -> list[Judge | Rank]:
    """M_rel(p) for each passage: one cross-encoder ranking of them all, or one judgment each."""
    shown = [f"{p.title}: {p.text}" for p in passages]
    if not passages:
        return []
    if config.judges == "trained":
        return [Rank(question, tuple(shown), len(shown))]
    return [judge_request(prompt("raisf_relevance").format(question=question, passage=s)) for s in shown]


def relevance_scores(responses: list[Judgment | Ranking], n: int, config: RaisfConfig) -> list[float]:
    """P(relevant) per passage, in retrieval order (a ranking's logits through a sigmoid)."""
    if config.judges == "trained":
        (ranking,) = responses
        scores = [0.0] * n
        for i, logit in zip(ranking.indices, ranking.scores):
            scores[i] = 1.0 / (1.0 + math.exp(-logit))
        return scores
    return [p_yes(j, config.judge_by) for j in responses]


def p_yes(judgment: Judgment, judge_by: str) -> float:
    """P('yes') of a binary judgment: its first-token estimate, or 1/0 from the guided label.
    A failed judgment has no P('yes'): callers check ``judgment.error`` first."""
    if judgment.error:
        raise ValueError(f"a failed judgment has no P('yes'): {judgment.error}")
    if judge_by == "label":
        return float(judgment.label.strip().lower() == "yes")
    return judgment.prob("yes")
