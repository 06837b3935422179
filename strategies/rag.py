"""Retrieve-then-read baseline: top-k passages, then one generation over them."""

from __future__ import annotations

from engine.steps import Done, Item
from schemas.records import Retrieve
from strategies.base import Routine, Solve, StrategySettings, format_passages, prompt
from strategies.forms import answered, final_request, form_of


class RetrieveThenRead(Routine):
    name = "rag"
    stages = frozenset({"generator", "retriever"})

    def __init__(self, settings: StrategySettings):
        self.settings = settings

    @classmethod
    def from_run(cls, run) -> RetrieveThenRead:
        return cls(StrategySettings(k=run.retrieval.k, forms=run.answer_form))

    def solve(self, item: Item) -> Solve:
        forms = self.settings.forms
        item.passages = (yield Retrieve(item.question, self.settings.k)).passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in item.passages]})
        user = prompt("rag/user").format(passages=format_passages(item.passages), question=item.question)
        form = form_of(item, forms)
        response = yield final_request(user, form, forms, step="read")
        answer = answered(item, "read", response, form, forms)
        # the reader does not cite: its passages are the retrieval (retrieved_ids), not citations; with none
        # retrieved (BM25 finds no word of the question) the answer is the model's own, not a grounded one
        return Done(answer, "passages" if item.passages else "closed_book")
