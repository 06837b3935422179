"""Closed-book baseline: one generation, no retrieval."""

from __future__ import annotations

from engine.steps import Done, Item
from strategies.base import Routine, Solve, StrategySettings, prompt
from strategies.forms import answered, final_request, form_of


class Direct(Routine):
    name = "direct"
    stages = frozenset({"generator"})

    def __init__(self, settings: StrategySettings):
        self.settings = settings

    @classmethod
    def from_run(cls, run) -> Direct:
        return cls(StrategySettings(k=run.retrieval.k, forms=run.answer_form))

    def solve(self, item: Item) -> Solve:
        forms = self.settings.forms
        form = form_of(item, forms)
        response = yield final_request(prompt("direct/user").format(question=item.question), form, forms)
        return Done(answered(item, "answer", response, form, forms), "closed_book")
