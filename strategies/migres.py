"""MIGRES (Missing Information Guided Retrieve-Extraction-Solving), Section 3 as a state machine.

Each iteration t (at most T: 5 multi-hop / yes-no, 3 open-domain single-hop):

    Retrieval  queries (t=0: the question; later the Query Generator's <= 3 new single-hop queries
               from the missing information, different from the history) -> top-N passages each
               -> Knowledge Filter: passages scored against their query, those under delta dropped,
               at most k kept; then sentence level: sentences under delta dropped, the whole passage
               kept when it outscores every one of its sentences
               -> nothing left: the LLM writes what it knows about the query (knowledge prompting)
    Leaf       extract useful information with supporting passage indices (JSON), once per query on
               its kept passages (the paper's case study: once per iteration over all of them); each
               statement is kept only if its cited passages entail it (the judge, yes/no by log-probability)
    Memory     the queries asked and the passages used; a passage used twice is not used again
               (counted across the queries of one iteration too)
    Main       answer from the information, or "unanswerable" + a summary of the missing information

Deviations (no weights offline): the re-rank model is the ``ranker`` stage (bi-encoder cosine,
so delta is on the cosine scale, not BGE-reranker logits; a CrossEncoder can be configured:
``reranker.model``); entailment is the judge model unless an NLI cross-encoder is configured
(``nli.model``, the paper used T5-xxl-NLI). When T is reached without an
answer, one closing generation answers from the information gathered (``resolved_by=max_iterations``;
``no_new_query`` when the query generator asked nothing new before T). Answers are in the question's
form (forms.py): for yes/no questions and claims the main module chooses among the form's answers
and "unanswerable" (guided), in place of the sentence the paper's StrategyQA instruction adds ("reason
from the Information whether the answer ... is yes or no"). The structured outputs' strings are
bounded so that a small model finishes them.
By default (``answer_step: read``) the main module decides when the information suffices and what
is missing, as in the paper, but the answer itself is that same closing read of the information: the
0.5B model's main-module answers are sentences (median 11 words on the calib slice), and reading
the same information in the question's form lifted EM 16.3 -> 24.7 there (results/README.md).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import BaseModel, Field, create_model

from engine.steps import Done, Item
from schemas.config import AnswerFormConfig, Section
from schemas.records import Entail, Entailment, Generate, Judge, Retrieve, as_choice
from strategies.base import (
    Routine,
    Solve,
    answer_messages,
    clean_answer,
    passes,
    prompt,
    structured,
)
from strategies.filtering import (
    filter_sentences,
    keep_passages,
    passage_requests,
    sentence_requests,
)
from strategies.forms import (
    choices,
    final_answer,
    final_request,
    form_of,
    traced,
)
from strategies.parsing import parse_json_object, parse_string_list, string_list_schema
from strategies.structured import schema_of

UNANSWERABLE = "unanswerable"


class MigresConfig(Section):
    """MIGRES (Wang et al.). Iterations, k and N are the paper's (Table 11); delta is on the ranker's
    scale (bi-encoder cosine by default, not the paper's BGE-reranker logits)."""

    max_iterations: int = Field(5, ge=1, description="T for multi-hop, yes/no and claims")
    max_iterations_open_domain: int = Field(3, ge=1, description="T for kind=single-hop (open-domain QA)")
    retriever: Literal["bm25", "dense", "hybrid"] = Field(
        "bm25", description="the paper's default is BM25 (k1 0.9, b 0.4: index.bm25_*)")
    passages_per_query: int = Field(50, ge=1, description="N passages retrieved per query")
    max_passages: int = Field(5, ge=1, description="k passages kept per query after the knowledge filter")
    relevance_threshold: float = Field(0.3, description="delta: passages and sentences scoring under it are dropped")
    max_queries: int = Field(3, ge=1, description="new queries per iteration")
    max_uses: int = Field(2, ge=1, description="memory: a passage used this often is not used again")
    knowledge_prompting: bool = Field(True, description="ask the LLM about a query no passage survives for")
    entailment_threshold: float = Field(0.5, ge=0, le=1, description="P('yes') for an extracted statement to be kept")
    answer_step: Literal["read", "main"] = Field(
        "read", description="read: once the main module finds the information sufficient, the answer is read from "
        "the information in the question's form (the closing step); main: the main module's own answer (the "
        "paper). Changes results: results/README.md")


def leaf_model(n: int) -> type[BaseModel]:
    """The leaf module's output (Appendix D) in the paper's field order, for ``n`` passages (indexed
    from 0, as the paper's prompt). At least one statement, each citing a passage that exists: the
    paper allows an empty list, but under guided decoding an untuned 0.5B model always takes it (8 of
    8 sample probes with the answer in the passage wrote ``[]``, and half of the statements it writes
    when one is required cite passage -1); the entailment check then drops what the cited passages
    do not support, so a forced statement is never taken on trust."""
    index = Annotated[int, Field(ge=0, le=n - 1)]
    statement = create_model("Statement", info=(Annotated[str, Field(max_length=240)], ...),
                             support_passages=(Annotated[list[index], Field(min_length=1, max_length=min(n, 5))], ...))
    return create_model("Leaf", useful_information=(Annotated[list[statement], Field(min_length=1, max_length=5)], ...))


def leaf_entries(text: str) -> list | None:
    """The leaf module's statements, or None when its output does not parse."""
    obj = parse_json_object(text)
    entries = obj.get("useful_information") if obj else None
    return entries if isinstance(entries, list) else None


@functools.cache
def leaf_schema(n: int) -> str:
    return schema_of(leaf_model(n))


def main_model(answers: tuple[str, ...] | None) -> type[BaseModel]:
    """The main module's output in the paper's field order; ``answers`` closes the answer set."""
    answer = Literal[answers + (UNANSWERABLE,)] if answers else Annotated[str, Field(max_length=80)]
    return create_model("Main", answer=(answer, ...), confidence=(int, Field(ge=1, le=5)),
                        explanation=(Annotated[str, Field(max_length=300)], ...),
                        missing_information=(Annotated[str, Field(max_length=200)], ...))


def as_asked(query: str) -> str:
    """A query as the memory compares it: "Who directed Levity" was asked as "Who directed Levity?" (not
    words alone: "C++" and "C#" are other questions)."""
    return " ".join(query.lower().split()).rstrip("?.! ")


class MIGRES(Routine):
    name = "migres"
    Config = MigresConfig
    stages = frozenset({"generator", "judge", "retriever", "ranker"})

    def __init__(self, config: MigresConfig, nli: bool = False, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.main_schemas: dict[str, str] = {}  # by answer form
        self.nli = nli  # verify entailment on the NLI cross-encoder pool instead of the judge
        if nli:
            self.stages = self.stages | {"nli"}
        self.query_schema = string_list_schema("queries", config.max_queries)

    @classmethod
    def from_run(cls, run) -> MIGRES:
        return cls(run.migres, nli=run.nli.model is not None, forms=run.answer_form)

    @staticmethod
    def retrieval_methods(run) -> set[str]:
        return {run.migres.retriever}

    def solve(self, item: Item) -> Solve:
        info: list[dict] = []  # the information set I: statements with their source passages
        history: list[str] = []  # memory: every query asked
        uses: dict[str, int] = {}  # memory: how often a passage was used
        iterations: list[dict] = []
        # the record of the run, kept up to date in place: a question that fails midway shows how far it got
        item.trace.append({"step": "migres", "iterations": iterations, "information": info})
        queries, t = [item.question], 0
        while True:
            history += queries
            iteration = {"queries": queries}
            iterations.append(iteration)
            knowledge = yield from self.retrieve(item, queries, uses)  # Retrieval module, with the filter
            iteration["passages"] = [[p.id for p in ps] for ps in knowledge]
            item.passages = list({p.id: p for p in item.passages + [p for ps in knowledge for p in ps]}.values())
            verdicts = yield from self.leaf(item, queries, knowledge, info)  # Leaf module
            if verdicts is not None:
                iteration["extracted"] = verdicts
            answer, missing, confidence = yield from self.main(item, info, t)  # Main module
            iteration.update(answer=answer, confidence=confidence, missing=missing)
            if clean_answer(answer) and UNANSWERABLE not in answer.lower():  # "```" / "Answer:" answer nothing
                if self.config.answer_step == "read":
                    return (yield from self.final(item, info, iterations, "answered", clean_answer(answer)))
                return self.done(clean_answer(answer), "answered", info)
            if t + 1 >= self.max_iterations(item):
                return (yield from self.final(item, info, iterations, "max_iterations"))
            missing = missing or item.question
            new = yield from self.query(item, history, info, missing, t)  # Query Generator
            # memory: a query asked before, up to case, spacing and its closing mark, is not new
            asked = {as_asked(q) for q in history}
            new = [q for q in new if as_asked(q) not in asked]
            if not new:  # nothing new to ask; the missing information itself is the query
                new = [missing] if as_asked(missing) not in asked else []
            if not new:
                return (yield from self.final(item, info, iterations, "no_new_query"))
            queries, t = new, t + 1

    # --- Retrieval module ----------------------------------------------------------------------

    def retrieve(self, item: Item, queries: list[str], uses: dict[str, int]):
        """Top N per query, then the knowledge filter: passages under delta dropped (k kept), then
        their sentences under delta (the whole passage kept when it outscores them all)."""
        c = self.config
        retrievals = yield [Retrieve(q, c.passages_per_query, c.retriever) for q in queries]
        candidates = [[p for p in r.passages if uses.get(p.id, 0) < c.max_uses] for r in retrievals]
        asks = [passage_requests(q, cs) for q, cs in zip(queries, candidates) if cs]
        rankings = iter((yield asks) if asks else [])
        kept = [keep_passages(cs, next(rankings), c.relevance_threshold, c.max_passages) if cs else []
                for cs in candidates]
        asks = [r for q, ps in zip(queries, kept) for r in sentence_requests(q, ps)]
        rankings = iter((yield asks) if asks else [])
        knowledge = []  # per query: filtered passages
        for ps in kept:
            mine = []
            for p in ps:
                f = filter_sentences(p, next(rankings), c.relevance_threshold)
                if f and uses.get(p.id, 0) < c.max_uses:  # counted across this iteration's queries too
                    uses[p.id] = uses.get(p.id, 0) + 1
                    mine.append(f)
            knowledge.append(mine)
        return knowledge

    # --- Leaf module ---------------------------------------------------------------------------

    def leaf(self, item: Item, queries: list[str], knowledge: list, info: list[dict]):
        """Statements extracted per query with the passages they cite, each kept only if entailed by
        them; knowledge prompting for a query no passage survived for. Returns the verdicts."""
        asks = []
        for q, ps in zip(queries, knowledge):
            if ps:
                # the paper's listing (Appendix prompts): "(Title: ...)" only where the corpus has titles
                listing = "\n\n".join(f"Passage {i}: " + (f"(Title: {p.title}) {p.text}" if p.title else p.text)
                                      for i, p in enumerate(ps))
                asks.append(Generate(answer_messages(prompt("migres/leaf").format(passages=listing, question=q),
                                                     system=None), max_tokens=200, json_schema=leaf_schema(len(ps)),
                                     step="leaf"))
            elif self.config.knowledge_prompting:
                asks.append(Generate(answer_messages(prompt("migres/knowledge").format(question=q), system=None),
                                     max_tokens=96, step="knowledge"))
        generations = list((yield asks) if asks else [])
        # a leaf output that does not parse, cut off by its budget (under guided decoding nothing else does), is
        # asked once more with twice the tokens, as structured() does for one request; one the model finished is
        # not (a server that ignores the schema: greedy decoding would write it again)
        unparsed = [i for i, (a, g) in enumerate(zip(asks, generations)) if a.step == "leaf" and leaf_entries(g.text) is None]
        cut = [i for i in unparsed if generations[i].finish_reason != "stop"]
        if unparsed:  # counted below, where each output is read: those asked again here, for their first try too
            item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + len(cut)
            item.trace.append({"step": "leaf", "parsed": False, "outputs": [generations[i].text for i in unparsed],
                               "retry": bool(cut)})
        if cut:
            again = yield [replace(asks[i], max_tokens=2 * asks[i].max_tokens) for i in cut]
            for i, g in zip(cut, again):
                generations[i] = g
        generations = iter(generations)
        statements = []  # (info, cited passages)
        for ps in knowledge:
            if not ps and not self.config.knowledge_prompting:
                continue
            gen = next(generations)
            if not ps:  # knowledge prompting: the LLM's own account is taken as it is
                text = " ".join(gen.text.split())
                if text:
                    info.append({"info": text, "source": []})
                continue
            entries = leaf_entries(gen.text)
            if entries is None:
                item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
                continue
            for e in entries:
                if not isinstance(e, dict) or not isinstance(e.get("info"), str) or not e["info"].strip():
                    continue
                support = e.get("support_passages")  # guided decoding aside, a model may write 1 or [[0]]
                numbers = [i for i in (support if isinstance(support, list) else [support]) if type(i) is int]
                cited = [ps[i] for i in dict.fromkeys(numbers) if 0 <= i < len(ps)]
                if cited:  # a statement citing nothing cannot be verified: dropped
                    statements.append((e["info"].strip(), cited))
        # the premise shows each passage with its title, as the leaf saw it: a passage cut to "He is an
        # American filmmaker." entails "Ed Solomon is American" only beside its title "Ed Solomon"
        if self.nli:
            checks = [Entail(" ".join(p.shown for p in cited), statement) for statement, cited in statements]
        else:
            checks = [Judge((("user", prompt("migres/entail").format(premise=" ".join(p.shown for p in cited),
                                                                     statement=statement)),), step="entail")
                      for statement, cited in statements]
        if not checks:
            return None
        verdicts = []
        for (statement, cited), v in zip(statements, (yield checks)):
            p = v.p_entail if isinstance(v, Entailment) else v.prob("yes")
            entailed = passes(p, self.config.entailment_threshold)
            verdicts.append({"info": statement, "p_entailed": round(p, 4), "kept": entailed})
            if entailed:
                info.append({"info": statement, "source": [p.id for p in cited]})
        return verdicts

    # --- Main module ---------------------------------------------------------------------------

    def main(self, item: Item, info: list[dict], t: int):
        """(answer or "unanswerable", the missing information, the confidence)."""
        form = form_of(item, self.forms)
        answers = choices(form, self.forms)
        if form not in self.main_schemas:
            self.main_schemas[form] = schema_of(main_model(answers))
        user = prompt("migres/main").format(information=information(info), question=item.question)
        request = Generate(answer_messages(user, system=None), max_tokens=160, json_schema=self.main_schemas[form],
                           step="main")

        closed = answers + (UNANSWERABLE,) if answers else None

        def parse(text):
            obj = parse_json_object(text) or {}
            answer = obj.get("answer")
            if isinstance(answer, dict):  # the paper's own format nests {"text", "confidence"}
                answer = answer.get("text")
            if closed and isinstance(answer, str):  # a server may ignore the schema's choices: "Yes." is yes
                answer = as_choice(answer, closed)
            return (obj, answer), isinstance(answer, str)

        (obj, answer), ok, _ = yield from structured(item, request, parse, f"main {t}")
        return (answer if ok else UNANSWERABLE), str(obj.get("missing_information") or "").strip(), obj.get("confidence")

    def query(self, item: Item, history: list[str], info: list[dict], missing: str, t: int):
        user = prompt("migres/query").format(question=item.question, history="; ".join(history),
                                             information=information(info), missing=missing)
        request = Generate(answer_messages(user, system=None), max_tokens=120, json_schema=self.query_schema,
                           step="query")
        queries, _, _ = yield from structured(
            item, request, lambda text: parse_string_list(text, "queries", self.config.max_queries), f"query {t}")
        return queries

    def final(self, item: Item, info: list[dict], iterations: list[dict], ending: str, main: str = ""):
        """The answer read from the gathered information, in the question's form: when the loop ends
        unanswered, and (``answer_step: read``) when the main module found the information sufficient,
        its answer ``main`` kept where the read cleans to nothing ("```", "Answer:")."""
        user = prompt("migres/final").format(information=information(info), question=item.question)
        form = form_of(item, self.forms)
        response = yield final_request(user, form, self.forms, step="final")
        said = traced("final", response, form, self.forms)  # the choice taken, and the probabilities it was taken by
        iterations[-1].update(final=said["output"], **({"final_probs": said["probs"]} if "probs" in said else {}))
        answer = final_answer(response, form, self.forms)
        if not answer and main:
            iterations[-1]["fallback"] = "main"
        return self.done(answer or main, ending, info)

    def max_iterations(self, item: Item) -> int:
        return self.config.max_iterations_open_domain if item.kind == "single-hop" else self.config.max_iterations

    @staticmethod
    def done(answer: str, resolved_by: str, info: list[dict]) -> Done:
        return Done(answer, resolved_by, list(dict.fromkeys(pid for i in info for pid in i["source"])))


def information(info: list[dict]) -> str:
    return " ".join(i["info"] for i in info) or "(none)"
