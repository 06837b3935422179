"""MIGRES (Missing Information Guided Retrieve-Extraction-Solving), Section 3 as a state machine.

Each iteration t (at most T: 5 multi-hop / yes-no, 3 open-domain single-hop):

    Retrieval  queries (t=0: the question; later the Query Generator's <= 3 new single-hop queries
               from the missing information, different from the history) -> top-N passages each
               -> Knowledge Filter: passages scored against their query, those under delta dropped,
               at most k kept; then sentence level: sentences under delta dropped, the whole passage
               kept when it outscores every one of its sentences
               -> nothing left: the LLM writes what it knows about the query (knowledge prompting)
    Leaf       extract useful information with supporting passage indices (JSON); each statement is
               kept only if its cited passages entail it (the judge, yes/no by log-probability)
    Memory     the queries asked and the passages used; a passage used twice is not used again
    Main       answer from the information, or "unanswerable" + a summary of the missing information

Deviations (no weights offline): the re-rank model is the ``ranker`` stage (bi-encoder cosine,
so delta is on the cosine scale, not BGE-reranker logits; a CrossEncoder can be configured:
``reranker.model``); entailment is the judge model unless an NLI cross-encoder is configured
(``nli.model``, the paper used T5-xxl-NLI). When T is reached without an
answer, one closing generation answers from the information gathered (``resolved_by=max_iterations``;
``no_new_query`` when the query generator asked nothing new before T). Answers are in the question's
form (forms.py): for yes/no questions and claims the main module chooses among the form's answers
and "unanswerable". The structured outputs' strings are bounded so that a small model finishes them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, create_model

from strategies.base import Done, Item, answer_messages, ask, clean_answer, parse_failed, prompt
from strategies.filtering import filter_sentences, keep_passages, passage_requests, sentence_requests
from strategies.forms import choices, final_answer, final_request, form_of, response_text
from strategies.parsing import parse_json_object, parse_string_list, string_list_schema
from strategies.structured import schema_of
from schemas.config import AnswerFormConfig, MigresConfig
from schemas.records import Entail, Entailment, Generate, Judge, Retrieve

UNANSWERABLE = "unanswerable"


class Statement(BaseModel):
    info: Annotated[str, Field(max_length=240)]
    support_passages: Annotated[list[int], Field(max_length=5)]


class Leaf(BaseModel):
    """The leaf module's output (Appendix D), in the paper's field order."""

    useful_information: Annotated[list[Statement], Field(max_length=5)]


def main_model(answers: tuple[str, ...] | None) -> type[BaseModel]:
    """The main module's output in the paper's field order; ``answers`` closes the answer set."""
    answer = Literal[answers + (UNANSWERABLE,)] if answers else Annotated[str, Field(max_length=80)]
    return create_model("Main", answer=(answer, ...), confidence=(int, Field(ge=1, le=5)),
                        explanation=(Annotated[str, Field(max_length=300)], ...),
                        missing_information=(Annotated[str, Field(max_length=200)], ...))


LEAF_SCHEMA = schema_of(Leaf)


class MIGRES:
    name = "migres"
    stages = frozenset({"generator", "judge", "retriever", "ranker"})

    def __init__(self, config: MigresConfig, nli: bool = False, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.main_schemas: dict[str, str] = {}  # by answer form
        self.nli = nli  # verify entailment on the NLI cross-encoder pool instead of the judge
        if nli:
            self.stages = self.stages | {"nli"}
        self.query_schema = string_list_schema("queries", config.max_queries)

    def start(self, item: Item):
        item.state.update(t=0, info=[], history=[], uses={}, iterations=[])
        return self._retrieve(item, [item.question])

    def resume(self, item: Item, responses):
        for r in responses:
            if r.error:
                return Done("", "error", error=r.error)
        return getattr(self, "_after_" + item.state["phase"])(item, responses)

    # --- Retrieval module ----------------------------------------------------------------------

    def _retrieve(self, item, queries):
        item.state["history"] += queries
        item.state["queries"] = queries
        item.state["iterations"].append({"queries": queries})
        return ask(item, "retrieve", [Retrieve(q, self.config.passages_per_query, self.config.retriever) for q in queries])

    def _after_retrieve(self, item, retrievals):
        uses = item.state["uses"]
        candidates = [[p for p in r.passages if uses.get(p.id, 0) < self.config.max_uses] for r in retrievals]
        item.state["candidates"] = candidates
        asks = [passage_requests(q, c) for q, c in zip(item.state["queries"], candidates) if c]
        return ask(item, "rank_passages", asks) if asks else self._after_rank_passages(item, [])

    def _after_rank_passages(self, item, rankings):
        it = iter(rankings)
        delta, k = self.config.relevance_threshold, self.config.max_passages
        kept = [keep_passages(c, next(it), delta, k) if c else [] for c in item.state["candidates"]]
        item.state["kept"] = kept
        asks = [r for q, ps in zip(item.state["queries"], kept) for r in sentence_requests(q, ps)]
        return ask(item, "rank_sentences", asks) if asks else self._after_rank_sentences(item, [])

    def _after_rank_sentences(self, item, rankings):
        it = iter(rankings)
        knowledge = []  # per query: filtered passages
        for ps in item.state["kept"]:
            mine = [f for p in ps if (f := filter_sentences(p, next(it), self.config.relevance_threshold))]
            for p in mine:
                item.state["uses"][p.id] = item.state["uses"].get(p.id, 0) + 1
            knowledge.append(mine)
        item.state["knowledge"] = knowledge
        item.state["iterations"][-1]["passages"] = [[p.id for p in ps] for ps in knowledge]
        item.passages = list({p.id: p for p in item.passages + [p for ps in knowledge for p in ps]}.values())
        asks = []
        for q, ps in zip(item.state["queries"], knowledge):
            if ps:
                listing = "\n\n".join(f"Passage {i}: (Title: {p.title}) {p.text}" for i, p in enumerate(ps))
                user = prompt("migres_leaf").format(passages=listing, question=q)
                asks.append(Generate(answer_messages(user, system=None), max_tokens=200, json_schema=LEAF_SCHEMA))
            elif self.config.knowledge_prompting:
                user = prompt("migres_knowledge").format(question=q)
                asks.append(Generate(answer_messages(user, system=None), max_tokens=96))
        return ask(item, "leaf", asks) if asks else self._main(item)

    # --- Leaf module ---------------------------------------------------------------------------

    def _after_leaf(self, item, generations):
        it = iter(generations)
        statements = []  # (info, cited passages)
        for q, ps in zip(item.state["queries"], item.state["knowledge"]):
            if not ps and not self.config.knowledge_prompting:
                continue
            gen = next(it)
            if not ps:  # knowledge prompting: the LLM's own account is taken as it is
                text = " ".join(gen.text.split())
                if text:
                    item.state["info"].append({"info": text, "source": []})
                continue
            obj = parse_json_object(gen.text)
            entries = obj.get("useful_information") if obj else None
            if not isinstance(entries, list):
                item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
                continue
            for e in entries:
                if not isinstance(e, dict) or not isinstance(e.get("info"), str) or not e["info"].strip():
                    continue
                cited = [ps[i] for i in dict.fromkeys(e.get("support_passages") or [])
                         if isinstance(i, int) and 0 <= i < len(ps)]
                if cited:  # a statement citing nothing cannot be verified: dropped
                    statements.append((e["info"].strip(), cited))
        item.state["statements"] = statements
        if self.nli:
            checks = [Entail(" ".join(p.text for p in cited), info) for info, cited in statements]
        else:
            checks = [Judge((("user", prompt("migres_entail").format(
                premise=" ".join(p.text for p in cited), statement=info)),)) for info, cited in statements]
        return ask(item, "verify", checks) if checks else self._main(item)

    def _after_verify(self, item, verdicts_in):
        verdicts = []
        for (info, cited), v in zip(item.state["statements"], verdicts_in):
            p = (0.0 if v.error else v.p_entail) if isinstance(v, Entailment) else v.prob("yes")
            entailed = p >= self.config.entailment_threshold
            verdicts.append({"info": info, "p_entailed": round(p, 4), "kept": entailed})
            if entailed:
                item.state["info"].append({"info": info, "source": [p.id for p in cited]})
        item.state["iterations"][-1]["extracted"] = verdicts
        return self._main(item)

    # --- Main module ---------------------------------------------------------------------------

    def _information(self, item) -> str:
        return " ".join(i["info"] for i in item.state["info"]) or "(none)"

    def _main(self, item, max_tokens=160):
        form = form_of(item, self.forms)
        if form not in self.main_schemas:
            self.main_schemas[form] = schema_of(main_model(choices(form, self.forms)))
        user = prompt("migres_main").format(information=self._information(item), question=item.question)
        return ask(item, "main", [Generate(answer_messages(user, system=None), max_tokens=max_tokens,
                                           json_schema=self.main_schemas[form])])

    def _after_main(self, item, responses):
        obj = parse_json_object(responses[0].text) or {}
        answer = obj.get("answer")
        if isinstance(answer, dict):  # the paper's own format nests {"text", "confidence"}
            answer = answer.get("text")
        if not isinstance(answer, str):
            if parse_failed(item, f"main {item.state['t']}", responses[0].text):
                return self._main(item, 320)
            answer = UNANSWERABLE
        missing = str(obj.get("missing_information") or "").strip()
        item.state["iterations"][-1].update(answer=answer, confidence=obj.get("confidence"), missing=missing)
        if answer.strip() and UNANSWERABLE not in answer.lower():
            return self._done(item, clean_answer(answer), "answered")
        if item.state["t"] + 1 >= self._max_iterations(item):
            return self._final(item, "max_iterations")
        item.state["missing"] = missing or item.question
        return self._query(item, 120)

    def _query(self, item, max_tokens):
        history = "; ".join(item.state["history"])
        user = prompt("migres_query").format(question=item.question, history=history,
                                             information=self._information(item), missing=item.state["missing"])
        return ask(item, "query", [Generate(answer_messages(user, system=None), max_tokens=max_tokens,
                                            json_schema=self.query_schema)])

    def _after_query(self, item, responses):
        queries, ok = parse_string_list(responses[0].text, "queries", self.config.max_queries)
        if not ok and parse_failed(item, f"query {item.state['t']}", responses[0].text):
            return self._query(item, 240)
        seen = {q.strip().lower() for q in item.state["history"]}
        new = [q for q in queries if q.strip().lower() not in seen]
        if not new:  # memory: nothing new to ask; the missing information itself is the query
            new = [item.state["missing"]] if item.state["missing"].strip().lower() not in seen else []
        if not new:
            return self._final(item, "no_new_query")
        item.state["t"] += 1
        return self._retrieve(item, new)

    def _final(self, item, ending):
        """The closing answer from the gathered information, when the loop ends unanswered."""
        item.state["ending"] = ending
        user = prompt("migres_final").format(information=self._information(item), question=item.question)
        return ask(item, "final", [final_request(user, form_of(item, self.forms), self.forms)])

    def _after_final(self, item, responses):
        item.state["iterations"][-1]["final"] = response_text(responses[0])
        return self._done(item, final_answer(responses[0]), item.state["ending"])

    def _max_iterations(self, item) -> int:
        return self.config.max_iterations_open_domain if item.kind == "single-hop" else self.config.max_iterations

    def _done(self, item, answer, resolved_by):
        item.trace.append({"step": "migres", "iterations": item.state["iterations"], "information": item.state["info"]})
        cited = list(dict.fromkeys(pid for i in item.state["info"] for pid in i["source"]))
        return Done(answer, resolved_by, cited)

