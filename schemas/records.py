"""Typed request/response records exchanged between strategies, the engine and the stage actors.

Requests are frozen and hashable: the engine keys its dedup cache on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Messages = tuple[tuple[str, str], ...]  # ((role, content), ...)


@dataclass(frozen=True)
class Generate:
    """A chat completion on the generator pool."""

    messages: Messages
    max_tokens: int | None = None  # None: the run's sampling default

    stage = "generator"

    def as_chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass(frozen=True)
class Retrieve:
    """Top-k passages for a query, merged over every retriever shard."""

    query: str
    k: int

    stage = "retriever"


@dataclass
class Generation:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class Passage:
    id: str
    title: str
    text: str
    score: float


@dataclass
class Retrieval:
    passages: list[Passage] = field(default_factory=list)
    error: str | None = None


Request = Generate | Retrieve
Response = Generation | Retrieval
