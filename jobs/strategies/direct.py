"""Closed-book baseline: one generation, no retrieval."""

from __future__ import annotations

from jobs.strategies.base import Ask, Done, Item, StrategySettings, answer_messages, clean_answer, prompt
from schemas.records import Generate


def answer_request(user: str) -> Generate:
    return Generate(answer_messages(user))


class Direct:
    name = "direct"
    stages = frozenset({"generator"})

    def __init__(self, settings: StrategySettings):
        self.settings = settings

    def start(self, item: Item) -> Ask:
        return Ask([answer_request(prompt("direct_user").format(question=item.question))])

    def resume(self, item: Item, responses) -> Done:
        (gen,) = responses
        item.trace.append({"step": "answer", "output": gen.text})
        if gen.error:
            return Done("", "error", error=gen.error)
        return Done(clean_answer(gen.text), "closed_book")
