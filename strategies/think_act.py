"""Think-then-Act (Shen et al.), Sections 3.1-3.2 as a state machine.

    assess(q)  CLEAR AND COMPLETE -> q_final = q
               INCOMPLETE         -> q_final = rewrite(q)
               AMBIGUOUS          -> q_group = split(q): each sub-query is a child item (no further
                                     assessment), then the answers are aggregated
    capability(q_final)  confidence: beta = P("yes") of "can you answer on your own?";
                                     retrieve when beta < beta' (beta' = 0 never, 1 always)
                         decision:   the model says RETRIEVAL / NO RETRIEVAL
    answer  LM(q_final), or LM([D, q_final]) where D = the top 3 sentences of the top-k passages,
            ranked by the embedder (the paper: Sentence-BERT)
"""

from __future__ import annotations

from strategies.base import Done, Item, Spawn, answer_messages, ask, clean_answer, parse_failed, prompt
from strategies.filtering import sentences
from strategies.forms import final_answer, final_request, form_of, response_text
from strategies.parsing import parse_string_list, same_question, string_list_schema
from schemas.config import AnswerFormConfig, ThinkActConfig
from schemas.records import Generate, Judge, Rank, Retrieve

ASSESSMENTS = ("CLEAR AND COMPLETE", "INCOMPLETE", "AMBIGUOUS")
DECISIONS = ("RETRIEVAL", "NO RETRIEVAL")


class ThinkThenAct:
    name = "think_act"
    stages = frozenset({"generator", "judge", "retriever", "ranker"})

    def __init__(self, config: ThinkActConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.split_schema = string_list_schema("sub_questions", config.max_subqueries)

    def start(self, item: Item):
        item.state["query"] = item.question
        if self.config.assess and item.depth == 0:  # the paper assesses the user's query, not sub-queries
            return ask(item, "assess", [Judge(_user(prompt("ta_assess").format(question=item.question)),
                                              ASSESSMENTS)])
        return self._capability(item)

    def resume(self, item: Item, responses):
        if item.state["phase"] == "children":
            return self._after_children(item, responses)
        (response,) = responses
        if response.error:
            return Done("", "error", error=response.error)
        return getattr(self, "_after_" + item.state["phase"])(item, response)

    def _after_assess(self, item, judgment):
        label = judgment.label if judgment.label in ASSESSMENTS else "CLEAR AND COMPLETE"
        item.trace.append({"step": "assess", "label": judgment.label, "probs": judgment.probs})
        item.state["assessment"] = label
        if label == "INCOMPLETE":
            user = prompt("ta_complete").format(question=item.question)
            return ask(item, "rewrite", [Generate(answer_messages(user, system=None), max_tokens=64)])
        if label == "AMBIGUOUS":
            return self._split(item, 160)
        return self._capability(item)

    def _split(self, item, max_tokens):
        user = prompt("ta_split").format(question=item.question)
        return ask(item, "split", [Generate(answer_messages(user, system=None), max_tokens=max_tokens,
                                            json_schema=self.split_schema)])

    def _after_rewrite(self, item, gen):
        rewritten = clean_answer(gen.text)
        item.state["query"] = rewritten or item.question
        item.trace.append({"step": "rewrite", "query": item.state["query"]})
        return self._capability(item)

    def _after_split(self, item, gen):
        subs, ok = parse_string_list(gen.text, "sub_questions", self.config.max_subqueries)
        if not ok and parse_failed(item, "split", gen.text):
            return self._split(item, 320)
        subs = [q for q in subs if not same_question(q, item.question)]
        item.trace.append({"step": "split", "sub_queries": subs, "parsed": ok})
        if not subs:  # nothing to split into: treat the query as it is
            return self._capability(item)
        item.state.update(phase="children", subs=subs)
        return Spawn(subs)

    def _after_children(self, item, children):
        pairs = "\n".join(f"Sub-query {i}: {q}\nAnswer {i}: {c.answer}"
                          for i, (q, c) in enumerate(zip(item.state["subs"], children), 1))
        return self._answer(item, "aggregate", prompt("ta_aggregate").format(pairs=pairs, question=item.question))

    def _after_aggregate(self, item, response):
        return self._done(item, "aggregate", response, "sub_queries")

    def _capability(self, item):
        query = item.state["query"]
        if self.config.capability == "decision":
            return ask(item, "capability", [Judge(_user(prompt("ta_decision").format(question=query)), DECISIONS)])
        if self.config.beta_threshold <= 0.0:  # beta' = 0: never retrieve, nothing to ask
            return self._decide(item, retrieve=False, beta=None)
        if self.config.beta_threshold >= 1.0:  # beta' = 1: always retrieve
            return self._decide(item, retrieve=True, beta=None)
        return ask(item, "capability", [Judge(_user(prompt("ta_confidence").format(question=query)))])

    def _after_capability(self, item, judgment):
        if self.config.capability == "decision":
            return self._decide(item, retrieve=judgment.label != "NO RETRIEVAL", beta=None, label=judgment.label)
        beta = judgment.prob("yes")
        return self._decide(item, retrieve=beta < self.config.beta_threshold, beta=beta)

    def _decide(self, item, retrieve, beta, label=None):
        item.trace.append({"step": "capability", "beta": None if beta is None else round(beta, 4),
                           "label": label, "retrieve": retrieve})
        if retrieve:
            return ask(item, "retrieve", [Retrieve(item.state["query"], self.config.k)])
        return self._answer(item, "answer_closed", prompt("direct_user").format(question=item.state["query"]))

    def _after_retrieve(self, item, retrieval):
        item.passages = retrieval.passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in retrieval.passages]})
        pool = [(p.id, s) for p in retrieval.passages for s in sentences(p.text)]
        item.state["pool"] = pool
        if not pool:
            return self._answer_with(item, [])
        return ask(item, "rank", [Rank(item.state["query"], tuple(s for _, s in pool), self.config.top_sentences)])

    def _after_rank(self, item, ranking):
        chosen = [item.state["pool"][i] for i in ranking.indices]
        item.trace.append({"step": "rank", "sentences": [s for _, s in chosen],
                           "scores": [round(x, 4) for x in ranking.scores]})
        return self._answer_with(item, chosen)

    def _answer_with(self, item, chosen):
        context = "\n".join(f"- {s}" for _, s in chosen) or "(nothing found)"
        return self._answer(item, "answer_context",
                            prompt("ta_answer_context").format(context=context, question=item.state["query"]))

    def _after_answer_context(self, item, response):
        return self._done(item, "answer", response, "retrieval")

    def _after_answer_closed(self, item, response):
        return self._done(item, "answer", response, "closed_book")

    def _answer(self, item, phase, user):
        """The answer step, in the form the (user's) question asks."""
        return ask(item, phase, [final_request(user, form_of(item, self.forms), self.forms)])

    def _done(self, item, step, response, resolved_by):
        item.trace.append({"step": step, "output": response_text(response)})
        return Done(final_answer(response), resolved_by)



def _user(text: str):
    return (("user", text),)
