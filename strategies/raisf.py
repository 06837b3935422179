"""RA-ISF: Retrieval Augmented Iterative Self-Feedback (Liu et al.), Algorithm 1.

``solve`` is the paper's Problem-solving(q, iter) line for line; sub-questions are child items on the
engine, so all nodes of all trees batch together. A node at depth D_th answers its sub-questions
"unknown" itself (they would be past D_th) instead of spawning them, so a tree has at most
1 + m + ... + m^D_th nodes for m = ``max_subquestions``; a sub-question the engine could not run
(its node cap) or that failed is "unknown" too. Binary judgments use P('yes') of the first token
against a threshold (``judge_by=logprob``) or the guided label, or the trained sub-modules
(``judges: trained``, or one module so: ``know_judge`` / ``relevance_judge``); a judgment that
failed is an error, never a "no". Once a passage is relevant M reads P_rel (Eq. 3), or with
``read: retrieved`` all k retrieved (Algorithm 1, line 14, writes M(q_t, P)). Every answer M(...) is
in the question's form (forms.py); the answer from passages reads them with rag's instruction unless
``answer_prompt: paper`` (the paper's Appendix G instruction answered worse on the same passages on
two tuning sets).
Ablations (paper Table 2): no self-knowledge (go straight to retrieval), no passage relevance
(decompose when the model does not know), no decomposition ("unknown" when nothing is relevant; a yes/no
question or a claim, whose answers hold no "unknown", gets its closed-book choice, ``closed_book``).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from engine.steps import Done, Item, Spawn
from schemas.config import AnswerFormConfig, Section
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
    Routine,
    Solve,
    answer_messages,
    format_passages,
    passes,
    prompt,
    structured,
)
from strategies.forms import answered, choices, final_request, form_of
from strategies.parsing import parse_string_list, string_list_schema

UNKNOWN = "unknown"
DECOMPOSE_TOKENS = 160
# a decomposition that gave no sub-question answers closed-book (Algorithm 1's M(q, {}, {})): the
# decomposition branch, under its own label so that Table 7 does not count it as answered by sub-questions
EMPTY_DECOMPOSITION = "decomposition_empty"
# a node at D_th decomposes (Algorithm 1) and its sub-questions, past D_th, are all "unknown": its synthesis
# read no sub-answer, so Table 7's decomposition row must not count it (only a root at raisf.d_th 0)
PAST_DEPTH = "decomposition_past_depth"
DECOMPOSED = ("decomposition", EMPTY_DECOMPOSITION, PAST_DEPTH)


class RaisfConfig(Section):
    """RA-ISF (Liu et al.), Algorithm 1. Defaults are the paper's, but for the judges (the generator's
    P("yes") where the paper fine-tunes its sub-modules: `judges: trained` for ours) and the cap of 4
    sub-questions (the paper's k depends on the question; the cap bounds the tree for the engine's
    node budget); the switches are Table 2's ablations."""

    d_th: int = Field(3, ge=0, le=64, description="decomposition depth threshold D_th; deeper nodes answer "
                      "'unknown' (at most 64: a tree's node count, m^d summed, is checked against the engine's caps)")
    k: int = Field(5, ge=1, description="passages retrieved per (sub-)question")
    self_knowledge: bool = Field(True, description="False = ablation 'No SKM'")
    passage_relevance: bool = Field(True, description="False = ablation 'No PRM' (decompose right away)")
    decomposition: bool = Field(True, description="False = ablation 'No QDM' ('unknown' when nothing is "
                               "relevant; a yes/no question or a claim, which has no 'unknown' among its answers, "
                               "the model's closed-book choice)")
    judge_by: Literal["logprob", "label"] = Field(
        "logprob", description="binary judgments from P('yes') of the first token, or the generated label")
    judges: Literal["generator", "trained"] = Field(
        "generator", description="who judges: the generator (or judge pool) by prompt, or the trained "
        "sub-modules as the paper trains them: M_know on the `know` pool (know.model) and M_rel as the ranker's "
        "model (reranker.model), P(relevant) = sigmoid of its logit; from `ragsift train`")
    know_judge: Literal["generator", "trained"] | None = Field(
        None, description="who judges self-knowledge alone (M_know); None = `judges`. A trained M_rel with the "
        "generator's self-knowledge prompt, or the other way round, is one setting each")
    relevance_judge: Literal["generator", "trained"] | None = Field(
        None, description="who judges passage relevance alone (M_rel); None = `judges`")
    know_threshold: float = Field(0.5, ge=0, le=1, description="P('yes') at or above which the model 'knows' "
                                   "(1: never, as every ragsift cut)")
    relevance_threshold: float = Field(0.5, ge=0, le=1, description="P('yes') at or above which a passage is "
                                       "relevant (1: never)")
    max_subquestions: int = Field(4, ge=1, description="at most this many sub-questions per decomposition")
    read: Literal["relevant", "retrieved"] = Field(
        "relevant", description="what M reads once some passage is relevant: P_rel, the relevant ones (the paper's "
        "Eq. 3 and text), or all k retrieved, P (its Algorithm 1, line 14: A <- M(q_t, P)), so that M_rel only "
        "decides between reading and decomposing and a gold passage it scores low is still read. Changes results: "
        "results/README.md")
    answer_prompt: Literal["rag", "paper"] = Field(
        "rag", description="the instruction of M(q_t, P_rel), the answer from passages: rag's prompt, or the paper's "
        "Appendix G one ('Using the knowledge from the relevant paragraphs, give the answer to the question.'), "
        "which scored 2.5 F1 under rag's on the same passages over calib and tune360. Changes results: results/README.md")

    @property
    def max_nodes(self) -> int:
        """Question nodes one RA-ISF tree can have: 1 + m + ... + m^D_th (a node at depth D_th answers
        its sub-questions 'unknown' itself)."""
        return sum(self.max_subquestions ** d for d in range(self.d_th + 1))

    @property
    def know_by(self) -> str:
        return self.know_judge or self.judges

    @property
    def relevance_by(self) -> str:
        return self.relevance_judge or self.judges


class RAISF(Routine):
    name = "raisf"
    Config = RaisfConfig

    def __init__(self, config: RaisfConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.decompose_schema = string_list_schema("sub_questions", config.max_subquestions)
        self.read_prompt = prompt("rag/user" if config.answer_prompt == "rag" else "raisf/answer_passages")
        # M_know on its own pool and M_rel as the ranker's cross-encoder, or prompts on the judge pool
        self.stages = frozenset({"generator", "retriever"} | judge_stages(config))

    @classmethod
    def from_run(cls, run) -> RAISF:
        return cls(run.raisf, run.answer_form)

    @staticmethod
    def check(run) -> None:
        # max_depth first: max_nodes of a d_th of 10^5 took minutes to compute (m^d summed) before any error
        if run.raisf.d_th > run.engine.max_depth:
            raise ValueError(f"engine.max_depth {run.engine.max_depth} is below raisf.d_th {run.raisf.d_th}")
        if run.raisf.max_nodes > run.engine.max_nodes_per_root:
            raise ValueError(f"engine.max_nodes_per_root {run.engine.max_nodes_per_root} cannot hold an RA-ISF tree "
                             f"of raisf.d_th {run.raisf.d_th} and raisf.max_subquestions {run.raisf.max_subquestions} "
                             f"({run.raisf.max_nodes} nodes)")
        check_judges(run)

    def solve(self, item: Item) -> Solve:  # Problem-solving(q_t, iter)
        c, q = self.config, item.question
        if item.depth > c.d_th:
            item.trace.append({"step": "depth_cap", "depth": item.depth})
            return Done(UNKNOWN, "unknown")
        if c.self_knowledge:
            judgment = yield know_request(q, c)
            p = p_yes(judgment, c.judge_by)
            knows = passes(p, c.know_threshold)
            item.trace.append({"step": "self_knowledge", "p_yes": round(p, 4), "label": judgment.label, "know": knows})
            if knows:  # M_know(q_t) = know -> M(q_t)
                user = prompt("raisf/answer").format(question=q)
                return (yield from self.answer(item, "answer_closed", "self_knowledge", user))
        if c.passage_relevance or not c.self_knowledge:
            item.passages = (yield Retrieve(q, c.k)).passages  # P = R(q_t, C)
            item.trace.append({"step": "retrieve", "ids": [p.id for p in item.passages]})
            if not c.passage_relevance:  # both ablated: read everything retrieved
                user = self.read_prompt.format(passages=format_passages(item.passages), question=q)
                # with nothing retrieved the answer is the model's own, as rag's
                done = yield from self.answer(item, "answer_passages", "passages" if item.passages else "closed_book", user)
                return Done(done.answer, done.resolved_by)  # no module chose among them: no citation, as rag's
            scores = relevance_scores((yield relevance_requests(q, item.passages, c)), len(item.passages), c)
            relevant = [p for p, s in zip(item.passages, scores) if passes(s, c.relevance_threshold)]
            item.trace.append({"step": "relevance", "p_yes": [round(s, 4) for s in scores],
                               "relevant": [p.id for p in relevant]})
            if relevant:  # P_rel non-empty -> M(q_t, P_rel), or M(q_t, P); the evidence M_rel chose is the citation
                read = relevant if c.read == "relevant" else item.passages
                user = self.read_prompt.format(passages=format_passages(read), question=q)
                done = yield from self.answer(item, "answer_passages", "passages", user)
                return Done(done.answer, done.resolved_by, [p.id for p in relevant])
        if not c.decomposition:  # the paper's "No QDM": what no passage (or, without M_rel, no knowledge) answers is unknown
            item.trace.append({"step": "no_relevant_passage" if c.passage_relevance else "not_known"})
            if choices(form_of(item, self.forms), self.forms) is None:
                return Done(UNKNOWN, "unknown")
            # a yes/no question or a claim has no "unknown" among its answers: the model's own choice, closed-book
            # (its own label: Table 7's "unknown" stays the questions nothing answered)
            return (yield from self.answer(item, "answer_closed", "closed_book", prompt("raisf/answer").format(question=q)))
        subs = yield from self.decompose(item)  # Q_sub = M_decom(q_t)
        if not subs:  # Algorithm 1 with an empty Q_sub: M(q, {}, {}) is M(q), a closed-book answer: its own label
            return (yield from self.answer(item, "synthesize", EMPTY_DECOMPOSITION, prompt("raisf/answer").format(question=q)))
        resolved_by = "decomposition"
        if item.depth + 1 > c.d_th:  # Problem-solving(q_i, iter + 1) with iter + 1 > D_th
            item.trace.append({"step": "depth_cap", "depth": item.depth + 1, "sub_questions": len(subs)})
            answers, cited, resolved_by = [UNKNOWN] * len(subs), [], PAST_DEPTH
        else:
            children = yield Spawn(subs)  # a_i = Problem-solving(q_i, iter + 1)
            # a sub-question that failed, or that the engine did not run (its node cap), is unknown, and
            # what an unknown answer read is not the synthesis's evidence
            known = [bool(child.answer.strip()) and not child.error for child in children]
            failed = [child.error for child in children if child.error and child.resolved_by == "error"]
            if failed and not any(known):  # no sub-answer for the synthesis and a failure: an error, not an answer
                item.trace.append({"step": "sub_questions_failed", "errors": failed})  # (one --retry-errors answers again)
                return Done("", "error", error=f"every sub-question failed or was not run: {failed[0]}")
            answers = [child.answer if ok else UNKNOWN for child, ok in zip(children, known)]
            cited = list(dict.fromkeys(p for child, ok in zip(children, known) if ok for p in child.citations))
        pairs = "\n".join(f"Sub-question {i}: {s}\nAnswer {i}: {a}" for i, (s, a) in enumerate(zip(subs, answers), 1))
        done = yield from self.answer(item, "synthesize", resolved_by,  # M(q_t, Q_sub, A_sub)
                                      prompt("raisf/synthesize").format(pairs=pairs, question=q))
        return Done(done.answer, done.resolved_by, cited)  # the evidence is the sub-answers' evidence

    def decompose(self, item: Item):
        user = prompt("raisf/decompose").format(question=item.question)
        request = Generate(answer_messages(user, system=None), max_tokens=DECOMPOSE_TOKENS,
                           json_schema=self.decompose_schema, step="decompose")
        # besides: a copy of the question is no sub-question (it would recurse on itself until D_th)
        limit = self.config.max_subquestions
        subs, ok, _ = yield from structured(
            item, request, lambda text: parse_string_list(text, "sub_questions", limit, besides=item.question), "decompose")
        item.trace.append({"step": "decompose", "sub_questions": subs, "parsed": ok})
        return subs

    def answer(self, item: Item, step: str, resolved_by: str, user: str):
        """M(...): the answer step, in the form the question asks."""
        form = form_of(item, self.forms)
        response = yield final_request(user, form, self.forms, step=step)
        return Done(answered(item, step, response, form, self.forms), resolved_by)


def judge_stages(config: RaisfConfig, every_module: bool = False) -> set[str]:
    """The pools RA-ISF's judgments run on: the know / ranker pools for trained modules, else the judge pool;
    none for a module that is ablated (``every_module``: calibrate's probe, which records its scores all the
    same)."""
    know = {"know" if config.know_by == "trained" else "judge"} if config.self_knowledge or every_module else set()
    rel = {"ranker" if config.relevance_by == "trained" else "judge"} if config.passage_relevance or every_module else set()
    return know | rel


def check_judges(run, every_module: bool = False) -> None:
    if run.raisf.know_by == "trained" and (run.raisf.self_knowledge or every_module) and not run.know.model:
        raise ValueError("a trained self-knowledge judge (raisf.judges / raisf.know_judge: trained) needs know.model "
                         "(M_know, from `ragsift train know`)")
    if run.raisf.relevance_by == "trained" and (run.raisf.passage_relevance or every_module) and not run.reranker.model:
        raise ValueError("a trained relevance judge (raisf.judges / raisf.relevance_judge: trained) needs "
                         "reranker.model (M_rel, from `ragsift train relevance`)")


def judge_request(user: str, step: str = "judge") -> Judge:
    return Judge((("user", user),), step=step)


def know_request(question: str, config: RaisfConfig) -> Judge | Classify:
    """M_know(q): the trained classifier, or the judge asked the paper's self-knowledge prompt."""
    if config.know_by == "trained":
        return Classify(question)
    return judge_request(prompt("raisf/know").format(question=question), "self_knowledge")


def relevance_requests(question: str, passages: list[Passage], config: RaisfConfig) -> list[Judge | Rank]:
    """M_rel(p) for each passage: one cross-encoder ranking of them all, or one judgment each."""
    shown = [p.shown for p in passages]
    if not passages:
        return []
    if config.relevance_by == "trained":
        return [Rank(question, tuple(shown), len(shown), step="relevance")]
    return [judge_request(prompt("raisf/relevance").format(question=question, passage=s), "relevance") for s in shown]


def relevance_scores(responses: list[Judgment | Ranking], n: int, config: RaisfConfig) -> list[float]:
    """P(relevant) per passage, in retrieval order (a ranking's logits through a sigmoid)."""
    if config.relevance_by == "trained":
        if not responses:
            return []
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
