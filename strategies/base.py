"""What every strategy shares: the coroutine adapter, the structured-step policy, prompts.

A strategy is written the way its paper writes the algorithm, as a generator ``solve(item)``:

    response  = yield Generate(...)             # one request -> its response
    responses = yield [Judge(...), Judge(...)]  # several at once (batched with every other item's)
    children  = yield Spawn(questions)          # sub-questions, run on the engine -> their Done
    return Done(answer, resolved_by)

``Routine`` adapts it to the engine's ``start`` / ``resume`` (engine/steps.py). A response that
carries an error ends the question as an error row: an error is never a judgment or an empty
answer. ``yield Lenient([...])`` hands the errors to the strategy instead (label collection keeps
what it can).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.resources import files
from typing import Any, ClassVar, TypeVar

from engine.steps import Ask, Done, Item, Spawn, Step
from schemas.config import AnswerFormConfig
from schemas.records import Generate, Passage, Request

T = TypeVar("T")
Solve = Generator[Any, Any, Done]


@dataclass
class Lenient:
    """Requests whose failed responses go back to the strategy instead of ending the question."""

    requests: list[Request]


class Routine:
    """Base class of strategies: subclasses write ``solve``; ``start`` / ``resume`` are the engine's.

    What a strategy declares for the registry (strategies/registry.py):

        name        its name on the command line and in the output
        Config      its config section (a ``Section`` model, under ``name`` in the run config), or None
        stages      the stage pools it asks (an instance may add some, e.g. from its settings)
        answers     whether ``compare`` runs it by default (False for label / probe strategies)
        from_run    how it is built from the run config
        check       cross-section checks on the run config (raise ValueError naming the fields; they run in
                    the config's validation, which reports them as a ConfigError)
        retrieval_methods   the retrieval methods it asks for besides ``retrieval.method``
    """

    name: ClassVar[str]
    Config: ClassVar[type | None] = None
    answers: ClassVar[bool] = True
    stages: frozenset[str] = frozenset()

    @classmethod
    def from_run(cls, run) -> Routine:
        return cls(getattr(run, cls.name))

    @staticmethod
    def check(run) -> None:
        """Nothing to check across sections."""

    @staticmethod
    def retrieval_methods(run) -> set[str]:
        return set()

    def solve(self, item: Item) -> Solve:
        raise NotImplementedError

    def start(self, item: Item) -> Step:
        item.state["routine"] = self.solve(item)
        return self._advance(item, None)

    def resume(self, item: Item, responses: list) -> Step:
        shape = item.state.pop("shape")
        if shape in ("one", "many"):
            failed = next((r.error for r in responses if getattr(r, "error", None)), None)
            if failed:
                item.state.pop("routine").close()
                return Done("", "error", error=failed)
        return self._advance(item, responses[0] if shape == "one" else responses)

    def _advance(self, item: Item, sent) -> Step:
        try:
            asked = item.state["routine"].send(sent)
        except StopIteration as stop:
            item.state.pop("routine", None)
            return stop.value
        if isinstance(asked, Spawn):
            item.state["shape"] = "spawn"
            return asked
        if isinstance(asked, Lenient):
            item.state["shape"] = "lenient"
            return Ask(asked.requests)
        if isinstance(asked, list):
            item.state["shape"] = "many"
            return Ask(asked)
        item.state["shape"] = "one"
        return Ask([asked])


def structured(item: Item, request: Generate, parse: Callable[[str], tuple[T, bool]], step: str):
    """``value, ok, response = yield from structured(...)``: a structured output under guided decoding.

    ``parse(text) -> (value, ok)``. An output that does not parse is counted and kept in the trace. One
    cut off by the token budget (or not known not to be) is asked once more with twice the tokens, and the
    second try's value is returned whether it parsed or not (``ok`` tells, and that failure is counted too);
    one the model finished is not (its JSON whole but its value rejected, as an empty answer: greedy
    decoding wrote the same again, a long generation for nothing; under sampling, temperature > 0, a second
    draw is not asked for either). The strategy's fallback decides what an unparsed value means.
    """
    response = yield request
    value, ok = parse(response.text)
    if ok:
        return value, ok, response
    item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
    finished = response.finish_reason == "stop"
    item.trace.append({"step": step, "parsed": False, "output": response.text, "retry": not finished})
    if finished:
        return value, ok, response
    response = yield replace(request, max_tokens=2 * request.max_tokens)
    value, ok = parse(response.text)
    if not ok:
        item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
    return value, ok, response


@dataclass(frozen=True)
class StrategySettings:
    """What the baselines read from the run config."""

    k: int = 5
    forms: AnswerFormConfig = field(default_factory=AnswerFormConfig)


def passes(score: float, cut: float) -> bool:
    """Whether a judge's score passes a threshold in [0, 1]: at or above it, a cut of 1 being the "never"
    end as 0 is the "always" end (a judge says P = 1.0 whenever no other choice is among its top
    log-probs, and a cut of 1 calibrated as "never" must not let those through)."""
    return score >= cut and cut < 1.0


@cache
def prompt(name: str, package: str = "strategies") -> str:
    """The prompt file ``prompts/<name>.txt`` of ``package``: a built-in strategy's own prompts live in
    ``strategies/prompts/<strategy>/``; a strategy from another package passes its own (``__package__``)."""
    return files(package).joinpath("prompts", *f"{name}.txt".split("/")).read_text().strip()


def answer_messages(user: str, system: str | None = "answer_system"):
    """Chat messages for a short-answer generation (the shared system prompt, then ``user``)."""
    return ((("system", prompt(system)),) if system else ()) + (("user", user),)


def format_passages(passages: list[Passage]) -> str:
    return number_texts([p.shown for p in passages])


def number_texts(texts: list[str]) -> str:
    """Texts as the reading prompts list passages: '[1] ...', a blank line between."""
    return "\n\n".join(f"[{i}] {t}" for i, t in enumerate(texts, 1))


# "Answer:", "Final answer -", "**Answer:**", "The answer is:", "The answer to the question is:"
_LEAD = r"^\s*[*_#]*\s*(?:the\s+)?(?:final\s+|short\s+)?answer(?:\s+to\s+(?:the|this)\s+question)?"
# "Answer: X", "**Final answer** - X", "The answer is: X"; a dash only with a space before it ("answer-key" is a word)
_PREFIX = re.compile(_LEAD + r"(?:\s+is)?\s*[*_]*\s*(?::|\s[-\u2013\u2014])\s*[*_]*\s*", re.IGNORECASE)
_IS = re.compile(_LEAD + r"\s+is\s+", re.IGNORECASE)  # "The answer is Paris."
_HEADING = re.compile(_LEAD + r"\s*[*_#]*\s*$", re.IGNORECASE)  # "Answer", "### Final Answer" over the answer's line
_BULLET = re.compile(r"^[-*\u2022]\s+")  # "- Paris" (not "1. ", which begins names: "1. FC Koeln")
_CITED = re.compile(r"(?:\s*\[\d+(?:\s*[,\u2013-]\s*\d+)*\])+(?=\W*$)")  # "Paris [1]", "Paris [1, 3]."
_QUOTES = {'"': '"', "\u201c": "\u201d", "\u2018": "\u2019", "'": "'"}


_FENCE = re.compile(r"^\s*```[\w-]*\s*$")


def _unquoted(text: str) -> str:
    """``text`` without one pair of quotes around all of it ("Paris", \u201cParis\u201d); quotes that close
    inside it are the answer's own ("Hey Jude" and "Let It Be")."""
    close = _QUOTES.get(text[:1])
    if close and len(text) > 1 and text.endswith(close) and close not in text[1:-1]:
        return text[1:-1].strip()
    return text


def clean_answer(text: str) -> str:
    """First non-empty line of a generation, without an 'Answer:' lead-in ("The answer is", "Short answer:"),
    a list bullet, citation marks ("[1]") or wrapping quotes; a code fence's own lines ("```", "```json") are
    not the answer, the line inside is, and so is a lead-in line ending in ':' ("Sure! Here is the answer:")
    or a heading ("**Answer**") that has a line after it."""
    lines = [line for line in text.strip().splitlines() if not _FENCE.match(line)]
    for i, line in enumerate(lines):
        more = any(rest.strip() for rest in lines[i + 1:])
        if more and _HEADING.match(line):
            continue
        line = _unquoted(_BULLET.sub("", line.strip()))
        line = _IS.sub("", _PREFIX.sub("", line)).strip()
        line = _unquoted(_CITED.sub("", line).strip())
        if line and not (line.endswith(":") and more):
            return line
    return ""


__all__ = ["Ask", "Done", "Item", "Lenient", "Routine", "Solve", "Spawn", "Step", "StrategySettings", "answer_messages",
           "clean_answer", "format_passages", "number_texts", "passes", "prompt", "structured"]
