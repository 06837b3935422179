"""Closed-book baseline: one generation, no retrieval."""

from __future__ import annotations

from strategies.base import Ask, Done, Item, StrategySettings, prompt
from strategies.forms import final_answer, final_request, form_of, response_text


class Direct:
    name = "direct"
    stages = frozenset({"generator"})

    def __init__(self, settings: StrategySettings):
        self.settings = settings

    def start(self, item: Item) -> Ask:
        user = prompt("direct_user").format(question=item.question)
        return Ask([final_request(user, form_of(item, self.settings.forms), self.settings.forms)])

    def resume(self, item: Item, responses) -> Done:
        (response,) = responses
        item.trace.append({"step": "answer", "output": response_text(response)})
        if response.error:
            return Done("", "error", error=response.error)
        return Done(final_answer(response), "closed_book")
