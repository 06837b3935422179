"""Think-then-Act (Shen et al.), Sections 3.1-3.2.

    assess(q)  CLEAR AND COMPLETE -> q_final = q
               INCOMPLETE         -> q_final = rewrite(q)
               AMBIGUOUS          -> q_group = split(q): each sub-query is a child item (no further
                                     assessment; those naming an earlier answer as #n, as in the
                                     paper's samples, in order with it filled in), then the answers
                                     are aggregated; with an ambiguity_threshold, only when
                                     P(AMBIGUOUS) reaches it
    capability(q_final)  confidence: beta = P("yes") of "can you answer on your own?";
                                     retrieve when beta < beta' (beta' = 0 never, 1 always)
                         decision:   the model says RETRIEVAL / NO RETRIEVAL
    answer  LM(q_final), or LM([D, q_final]) where D = the top 3 sentences of the top-k passages,
            ranked on the ranker stage: the embedder's cosine (the paper: Sentence-BERT), or the
            cross-encoder when `reranker.model` names one; calibration may choose passages for
            sentences, all k for 3, and rag's instruction for ours (the paper publishes none)
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from engine.steps import Done, Item, Spawn
from schemas.config import AnswerFormConfig, Section
from schemas.records import Generate, Judge, Rank, Retrieve
from strategies.base import (
    Routine,
    Solve,
    answer_messages,
    clean_answer,
    number_texts,
    passes,
    prompt,
    structured,
)
from strategies.filtering import sentences
from strategies.forms import VERDICT, answered, final_request, form_of
from strategies.parsing import has_words, parse_string_list, string_list_schema

ASSESSMENTS = ("CLEAR AND COMPLETE", "INCOMPLETE", "AMBIGUOUS")
CONTEXTS = ("sentences", "passages")
PROMPTS = ("context", "rag")
PAPER_TOP = 3  # "we select the top 3 most similar to the query ... as context" (Section 4.2)
DECISIONS = ("RETRIEVAL", "NO RETRIEVAL")
REFERENCE = re.compile(r"(?<![\w#])#(\d+)\b")  # a sub-query naming an earlier one's answer ("#1", not "C#1")


_LEAD_IN = re.compile(r"^\s*[*_]*\s*(?:the\s+)?(?:rewritten|completed?|clear)\s+(?:and\s+complete\s+)?question"
                      r"\s*[*_]*\s*:\s*[*_]*\s*", re.IGNORECASE)
# "The claim is incomplete because ...", "The question lacks a date.": a comment on what it was asked to rewrite
# (the noun in lower case: "The Question was created by Steve Ditko." is a claim; "The claim: X" leads into one)
_COMMENT = re.compile(r"^[*_]*(?i:the|this)\s+(?:claim|question|statement|query)[*_]*\s+(?:is|was|does|do|lacks|seems|"
                      r"appears|needs|has|cannot|can't|should|must|already)\b")
_CLAIM_LEAD_IN = re.compile(r"^\s*[*_]*\s*(?i:the\s+)?(?i:rewritten\s+|completed?\s+|clear\s+)?(?i:claim|statement)"
                            r"\s*[*_]*\s*:\s*[*_]*\s*")


def rewritten(output: str, question: str, claim: bool = False, cut_off: bool = False) -> str:
    """q_comp from the rewrite's ``output``: its first line that is a question, unless ``question`` is a
    claim (the model also answers it instead, "The answer is: The Bellas.", or comments on it, "The question
    is incomplete."; either took the user's question's place in retrieval and the answer prompt); the
    question as it was when no such line exists. A question is known by its kind, not its "?": NQ's are
    written without one ("who sang i want to dance with somebody"), and took any output as written. A
    claim's rewrite is taken as written, unless ``cut_off`` by its token budget or a comment on the claim."""
    if claim:  # its rewrite need not be a question
        line = clean_answer(_CLAIM_LEAD_IN.sub("", output.strip()))
        # cut off in the line taken (the output's last): part of a claim; a whole line before a cut-off comment is one
        cut = cut_off and line == clean_answer(output.strip().splitlines()[-1] if output.strip() else "")
        return line if line and not cut and not _COMMENT.match(line) else question
    for line in output.splitlines():
        line = clean_answer(_LEAD_IN.sub("", line))
        if line.endswith("?") and has_words(line):
            return line
    return question


class ThinkActConfig(Section):
    """Think-then-Act (Shen et al.): query assessment and rewriting, then a capability check that
    gates retrieval. Defaults are the paper's."""

    assess: bool = Field(True, description="assess the query (CLEAR AND COMPLETE / INCOMPLETE / AMBIGUOUS) and rewrite it")
    capability: Literal["confidence", "decision"] = Field(
        "confidence", description="confidence: retrieve when beta = P('yes') < beta_threshold; decision: "
                                  "the model says RETRIEVAL / NO RETRIEVAL")
    beta_threshold: float = Field(0.5, ge=0, le=1, description="beta'; 0 = never retrieve, 1 = always")
    k: int = Field(5, ge=1, description="passages retrieved; their sentences are ranked")
    top_sentences: int = Field(PAPER_TOP, ge=1, description="units (sentences or passages) kept as context (the paper: "
                               "top 3 by Sentence-BERT; `ragsift calibrate` also weighs all k)")
    context: Literal["sentences", "passages"] = Field(
        "sentences", description="what the top 3 are: the sentences of the top-k passages, or the passages themselves "
        "(the paper ranks 'the top sentences from the relevant Wikipedia pages' and Google's organic results, "
        "then keeps 'the top 3 most similar': either reading fits it)")
    answer_prompt: Literal[PROMPTS] = Field(
        "context", description="the instruction of LM([D, q_final]) when it retrieves (the paper publishes none): "
        "ours ('Context: - ... Question: ... Answer:'), or rag's (D's units numbered, 'in a few words'), which "
        "leaves the method (assessment, rewrite, capability check) and the ranker's order of D as the only "
        "differences from rag. "
        "`ragsift calibrate` chooses it with the context. Changes results")
    max_subqueries: int = Field(4, ge=1, description="sub-queries for an AMBIGUOUS query")
    ambiguity_threshold: float | None = Field(
        None, ge=0, le=1, description="split the query into sub-queries when P('AMBIGUOUS') of the assessment "
        "is at or above this (1: never), else take the likelier of the other two assessments; None = the "
        "assessment's own label (the paper). A deviation for calibration (`ragsift calibrate`), as beta' is: "
        "a small judge's label alone may split most queries")


class ThinkThenAct(Routine):
    name = "think_act"
    Config = ThinkActConfig
    stages = frozenset({"generator", "judge", "retriever", "ranker"})

    def __init__(self, config: ThinkActConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.split_schema = string_list_schema("sub_questions", config.max_subqueries)

    @classmethod
    def from_run(cls, run) -> ThinkThenAct:
        return cls(run.think_act, run.answer_form)

    @staticmethod
    def check(run) -> None:
        if not run.think_act.assess:  # only an assessed query is split into sub-queries
            return
        if run.engine.max_depth < 1:  # every AMBIGUOUS query would pay for a split whose sub-queries are all dropped
            raise ValueError(f"engine.max_depth {run.engine.max_depth} leaves no depth for think_act's sub-queries "
                             "(an AMBIGUOUS query's split): at least 1, or think_act.assess: false")
        if 1 + run.think_act.max_subqueries > run.engine.max_nodes_per_root:
            raise ValueError(f"engine.max_nodes_per_root {run.engine.max_nodes_per_root} cannot hold a query and "
                             f"think_act.max_subqueries {run.think_act.max_subqueries} sub-queries")

    def solve(self, item: Item) -> Solve:
        query = item.question
        if self.config.assess and item.depth == 0:  # the paper assesses the user's query, not sub-queries
            judgment = yield assess_request(item.question)
            label = assessment(judgment, self.config.ambiguity_threshold)
            probs = judgment.probs and {k: round(v, 4) for k, v in judgment.probs.items()}
            item.trace.append({"step": "assess", "label": judgment.label, "probs": probs, "taken": label})
            if label == "INCOMPLETE":  # q_final = q_comp
                rewrite = yield Generate(answer_messages(prompt("think_act/complete").format(question=item.question),
                                                         system=None), max_tokens=64, step="rewrite")
                query = rewritten(rewrite.text, item.question, claim=form_of(item, self.forms) == VERDICT,
                                  cut_off=rewrite.finish_reason == "length")
                item.trace.append({"step": "rewrite", "query": query, "output": rewrite.text[:300],
                                   "taken": query != item.question})
            if label == "AMBIGUOUS":  # q_group = {q^1, ..., q^k}
                done = yield from self.by_sub_queries(item)
                if done:
                    return done
        if not (yield from self.retrieves(item, query)):  # beta >= beta': LM(q_final)
            return (yield from self.answer(item, "answer", "closed_book", prompt("direct/user").format(question=query)))
        item.passages = (yield Retrieve(query, self.config.k)).passages  # LM([D, q_final])
        item.trace.append({"step": "retrieve", "ids": [p.id for p in item.passages]})
        pool = context_pool(item.passages, self.config)
        chosen = []
        if pool:
            ranking = yield Rank(query, tuple(pool), self.config.top_sentences, step="rank")
            chosen = [pool[i] for i in ranking.indices]
            item.trace.append({"step": "rank", "sentences": chosen, "scores": [round(x, 4) for x in ranking.scores]})
        # with nothing retrieved (BM25 finds no word of the query) the answer is the model's own, as rag's
        return (yield from self.answer(item, "answer", "retrieval" if item.passages else "closed_book",
                                       answer_prompt(chosen, query, self.config.answer_prompt)))

    def by_sub_queries(self, item: Item):
        """Split the query, answer each sub-query as a child item, aggregate; None when the split
        gives nothing but the query itself, or no sub-query was answered (it then goes on as it is)."""
        subs = yield from self.split(item)
        if not subs:
            return None
        if any(references(q, i) for i, q in enumerate(subs)):
            # steps that name an earlier one's answer, as in the paper's samples ("When was #1 invented?"),
            # are asked in order, each with the answers before it in place of their #n
            children, asked = [], []
            for i, q in enumerate(subs):
                asked.append(REFERENCE.sub(lambda m, i=i: earlier_answer(m, children, i), q))
                children += yield Spawn([asked[-1]])
            item.trace.append({"step": "sub_queries_chained", "asked": asked})
            subs = asked
        else:
            children = yield Spawn(subs)
        if all(c.error or not c.answer for c in children):  # nothing to aggregate
            # each child's error, or "empty answer" where it answered nothing (null read as a failure none had)
            item.trace.append({"step": "sub_queries_failed", "errors": [c.error or "empty answer" for c in children]})
            return None
        # a sub-query that failed, or that the engine did not run (its node cap), is unknown (as in RA-ISF)
        answers = [c.answer if c.answer and not c.error else "unknown" for c in children]
        pairs = "\n".join(f"Sub-query {i}: {q}\nAnswer {i}: {a}" for i, (q, a) in enumerate(zip(subs, answers), 1))
        return (yield from self.answer(item, "aggregate", "sub_queries",
                                       prompt("think_act/aggregate").format(pairs=pairs, question=item.question)))

    def split(self, item: Item):
        request = Generate(answer_messages(prompt("think_act/split").format(question=item.question), system=None),
                           max_tokens=160, json_schema=self.split_schema, step="split")
        limit = self.config.max_subqueries
        subs, ok, _ = yield from structured(
            item, request, lambda text: parse_string_list(text, "sub_questions", limit, besides=item.question), "split")
        item.trace.append({"step": "split", "sub_queries": subs, "parsed": ok})
        return subs  # nothing to split into: the query goes on as it is

    def retrieves(self, item: Item, query: str):
        """The capability check: does answering ``query`` need retrieval?"""
        beta, label = None, None
        if self.config.capability == "decision":
            judgment = yield Judge(user(prompt("think_act/decision").format(question=query)), DECISIONS, step="capability")
            label = judgment.label
            retrieve = label != "NO RETRIEVAL"
        elif self.config.beta_threshold <= 0.0:  # beta' = 0: never retrieve, nothing to ask
            retrieve = False
        elif self.config.beta_threshold >= 1.0:  # beta' = 1: always retrieve
            retrieve = True
        else:
            beta = (yield Judge(user(prompt("think_act/confidence").format(question=query)), step="capability")).prob("yes")
            retrieve = beta < self.config.beta_threshold
        item.trace.append({"step": "capability", "beta": None if beta is None else round(beta, 4), "label": label,
                           "retrieve": retrieve})
        return retrieve

    def answer(self, item: Item, step: str, resolved_by: str, user_prompt: str):
        """The answer step, in the form the (user's) question asks."""
        form = form_of(item, self.forms)
        response = yield final_request(user_prompt, form, self.forms, step=step)
        return Done(answered(item, step, response, form, self.forms), resolved_by)


def references(query: str, position: int) -> list[int]:
    """The earlier sub-queries (1-based) that sub-query ``position`` (0-based) names as ``#n``."""
    return [n for n in map(int, REFERENCE.findall(query)) if 1 <= n <= position]


def earlier_answer(reference: re.Match, children: list[Done], position: int) -> str:
    """The answer that ``#n`` names, where n is an earlier sub-query with one; else the text as written
    ("#1" of "the #1 ranked player", a step that failed)."""
    n = int(reference.group(1))
    child = children[n - 1] if 1 <= n <= min(position, len(children)) else None
    return child.answer if child and child.answer and not child.error else reference.group(0)


def assess_request(question: str) -> Judge:
    return Judge(user(prompt("think_act/assess").format(question=question)), ASSESSMENTS, step="assess")


def assessment(judgment, ambiguity_threshold: float | None) -> str:
    """The assessment the strategy acts on: the judge's label, or with a threshold, AMBIGUOUS exactly
    when P(AMBIGUOUS) reaches it (else the likelier of the other two)."""
    label = judgment.label if judgment.label in ASSESSMENTS else "CLEAR AND COMPLETE"
    if ambiguity_threshold is None:
        return label
    if passes(judgment.prob("AMBIGUOUS"), ambiguity_threshold):
        return "AMBIGUOUS"
    return max(ASSESSMENTS[:2], key=judgment.prob)  # without log-probs prob() is the label's 1 / 0


def answer_prompt(chosen: list[str], question: str, style: str = "context") -> str:
    """LM([D, q_final]): the chosen sentences or passages as D, under our instruction or rag's (its
    units numbered as rag numbers passages: D = all k passages in the retrieval's order is rag's own
    request)."""
    if style == "rag":
        units = number_texts(chosen) or "(nothing found)"
        return prompt("rag/user").format(passages=units, question=question)
    context = "\n".join(f"- {s}" for s in chosen) or "(nothing found)"
    return prompt("think_act/answer_context").format(context=context, question=question)


def readings(config: ThinkActConfig) -> list[tuple[str, str, int]]:
    """The reads of the top-k passages that calibration weighs, as (answer_prompt, context, units): each
    context unit at the paper's 3, at the configured count and at k, under either instruction; the
    paper's own reading first (ties go to it), our instruction before rag's, fewer units before more."""
    counts = sorted({PAPER_TOP, config.top_sentences, config.k})
    return [(style, c, n) for style in PROMPTS for c in CONTEXTS for n in counts]


def context_pool(passages, config: ThinkActConfig) -> list[str]:
    """What the ranker picks D from: the passages' sentences, or the passages."""
    if config.context == "passages":
        return [p.shown for p in passages]
    return [s for p in passages for s in sentences(p.text)]


def user(text: str):
    return (("user", text),)
