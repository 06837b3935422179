"""The strategy contract: a pure state machine driven by the engine.

``start(item)`` and ``resume(item, responses)`` return the next Step: ``Ask`` for requests to stage
pools (responses come back in the same order), ``Spawn`` for sub-questions (resumed with their
``Done`` results in order), or ``Done``. Strategies do no I/O and never touch Ray.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from schemas.config import AnswerFormConfig
from schemas.records import Passage, Request, Response

PROMPTS = Path(__file__).parent / "prompts"


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


@dataclass(frozen=True)
class StrategySettings:
    """What the baselines read from the run config."""

    k: int = 5
    forms: AnswerFormConfig = field(default_factory=AnswerFormConfig)


class Strategy(Protocol):
    name: str

    def start(self, item: Item) -> Step: ...

    def resume(self, item: Item, responses: list[Response]) -> Step: ...


def ask(item: Item, phase: str, requests: list[Request]) -> Ask:
    """Ask for ``requests``; the responses resume ``item`` in ``phase`` (strategies dispatch on it)."""
    item.state["phase"] = phase
    return Ask(requests)


@cache
def prompt(name: str) -> str:
    return (PROMPTS / f"{name}.txt").read_text().strip()


def answer_messages(user: str, system: str | None = "answer_system"):
    """Chat messages for a short-answer generation (the shared system prompt, then ``user``)."""
    return ((("system", prompt(system)),) if system else ()) + (("user", user),)


def format_passages(passages: list[Passage]) -> str:
    return "\n\n".join(f"[{i}] {p.title}: {p.text}" for i, p in enumerate(passages, 1))


def parse_failed(item: Item, step: str, output: str) -> bool:
    """Count a structured output that did not parse; True the first time for ``step``: retry it once,
    with more tokens (under guided decoding an unparseable output was cut off). After that the
    strategy's fallback runs. The retried output stays in the trace."""
    item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
    retried = item.state.setdefault("retried", set())
    if step in retried:
        return False
    retried.add(step)
    item.trace.append({"step": step, "parsed": False, "output": output, "retry": True})
    return True


_PREFIX = re.compile(r"^\s*(final\s+)?answer\s*[:\-]\s*", re.IGNORECASE)


def clean_answer(text: str) -> str:
    """First non-empty line of a generation, without an 'Answer:' prefix or wrapping quotes."""
    for line in text.strip().splitlines():
        line = _PREFIX.sub("", line.strip().strip('"')).strip().strip('"').strip()
        if line:
            return line
    return ""
