"""The contract between the engine and a strategy.

The engine calls ``start(item)`` and then ``resume(item, responses)`` until a strategy returns
``Done``. In between a strategy returns ``Ask`` (requests for the stage pools; the responses come
back in the same order) or ``Spawn`` (sub-questions, run as child items on the engine; the strategy
is resumed with their ``Done`` results in order). Strategies do no I/O and never touch Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.records import Passage, Request, Response


@dataclass
class Ask:
    requests: list[Request]


@dataclass
class Spawn:
    questions: list[str]


@dataclass
class Done:
    answer: str
    resolved_by: str
    citations: list[str] = field(default_factory=list)
    error: str | None = None


Step = Ask | Spawn | Done


@dataclass
class Item:
    """One question node: a root question or a sub-question."""

    question: str
    depth: int = 0
    kind: str | None = None  # the input's `kind` (e.g. "claim" for FEVER) for roots; None for sub-questions
    dataset: str | None = None  # the input's `dataset` for roots; None for sub-questions
    state: dict[str, Any] = field(default_factory=dict)  # owned by the strategy
    passages: list[Passage] = field(default_factory=list)  # the retrieval reported in the output
    trace: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # e.g. parse_failures; summed per root


class Strategy(Protocol):
    name: str
    stages: frozenset[str]

    def start(self, item: Item) -> Step: ...

    def resume(self, item: Item, responses: list[Response | Done]) -> Step: ...
