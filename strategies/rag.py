"""Retrieve-then-read baseline: top-k passages, then one generation over them."""

from __future__ import annotations

from strategies.base import Ask, Done, Item, StrategySettings, format_passages, prompt
from strategies.forms import final_answer, final_request, form_of, response_text
from schemas.records import Retrieve


class RetrieveThenRead:
    name = "rag"
    stages = frozenset({"generator", "retriever"})

    def __init__(self, settings: StrategySettings):
        self.settings = settings

    def start(self, item: Item) -> Ask:
        item.state["phase"] = "retrieve"
        return Ask([Retrieve(item.question, self.settings.k)])

    def resume(self, item: Item, responses):
        (response,) = responses
        if item.state["phase"] == "retrieve":
            if response.error:
                return Done("", "error", error=response.error)
            item.passages = response.passages
            item.trace.append({"step": "retrieve", "ids": [p.id for p in response.passages]})
            item.state["phase"] = "read"
            user = prompt("rag_user").format(passages=format_passages(response.passages), question=item.question)
            return Ask([final_request(user, form_of(item, self.settings.forms), self.settings.forms)])
        item.trace.append({"step": "read", "output": response_text(response)})
        if response.error:
            return Done("", "error", error=response.error)
        # the reader does not cite: its passages are the retrieval (retrieved_ids), not citations
        return Done(final_answer(response), "passages")
