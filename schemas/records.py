"""Typed request/response records exchanged between strategies, the engine and the stage actors.

Requests are frozen and hashable: the engine keys its dedup cache on them. A request's ``step`` (the
name its strategy gives the step: traces, tokens per step, scripted test models) is not part of its
equality, so two strategies asking the same thing still share one computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Messages = tuple[tuple[str, str], ...]  # ((role, content), ...)


def utf8(text):
    """``text`` with any lone surrogate replaced (anything else as it is): a model that copies "\\ud800"
    into its JSON gives one after json.loads, which no tokenizer takes and no Parquet row holds (the run
    died writing it, and again on every resume)."""
    return text.encode("utf-8", "replace").decode("utf-8") if isinstance(text, str) else text


@dataclass(frozen=True)
class Generate:
    """A chat completion; with ``json_schema`` (a JSON string) decoding is constrained to it."""

    messages: Messages
    max_tokens: int | None = None  # None: the run's sampling default
    json_schema: str | None = None
    stage: str = "generator"
    step: str = field(default="generate", compare=False)

    def as_chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def budget(self, default: int) -> int:
        """Tokens it may generate: its own max_tokens, the run's ``default`` where it names none (0 is
        not "none": a replica refuses it)."""
        return default if self.max_tokens is None else self.max_tokens


@dataclass(frozen=True)
class Judge:
    """A judgment among ``choices`` (guided decoding), scored from the first token's log-probs.

    Runs on the ``judge`` pool, which is the generator pool unless a judge model is configured.
    """

    messages: Messages
    choices: tuple[str, ...] = ("yes", "no")
    stage: str = "judge"
    step: str = field(default="judge", compare=False)

    def as_chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    @property
    def max_tokens(self) -> int:
        """Tokens enough to spell the longest choice however it is tokenized (under guided decoding a model
        may spell one letter by letter), and the end after it: its bytes, as no token is shorter than one."""
        return max(len(c.encode("utf-8")) for c in self.choices) + 1

    def budget(self, default: int) -> int:
        """As Generate's: a judgment's own, whatever the run's default."""
        return self.max_tokens


@dataclass(frozen=True)
class Retrieve:
    """Top-k passages for a query, merged over every retriever shard.

    ``method``: dense, bm25 or hybrid (reciprocal rank fusion); None = the run's ``retrieval.method``.
    """

    query: str
    k: int
    method: str | None = None
    step: str = field(default="retrieve", compare=False)

    stage = "retriever"


@dataclass(frozen=True)
class Rank:
    """Score ``texts`` against ``query`` on the ranker pool and keep the best ``top`` (e.g. sentences)."""

    query: str
    texts: tuple[str, ...]
    top: int
    step: str = field(default="rank", compare=False)

    stage = "ranker"


@dataclass(frozen=True)
class Entail:
    """P(``premise`` entails ``hypothesis``) from an NLI cross-encoder on the ``nli`` pool."""

    premise: str
    hypothesis: str
    step: str = field(default="entail", compare=False)

    stage = "nli"


@dataclass(frozen=True)
class Classify:
    """P(yes) for ``text`` from a trained classifier on the ``know`` pool (RA-ISF's M_know: will the
    generator answer this question correctly closed-book?). Answered with a ``Judgment``."""

    text: str
    step: str = field(default="self_knowledge", compare=False)

    stage = "know"


@dataclass
class Generation:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens vLLM found in its prefix cache
    # why it stopped: "stop" (an end token or stop string) or "length" (its max_tokens reached, the text
    # cut off); None where not known (a response cached before this field)
    finish_reason: str | None = None


@dataclass
class Judgment:
    label: str  # the generated choice
    probs: dict[str, float] | None = None  # P(choice) from first-token log-probs, normalised
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens vLLM found in its prefix cache

    def prob(self, choice: str) -> float:
        """P(choice): the log-prob estimate when there is one, else 1/0 from the label."""
        if self.probs:
            return self.probs.get(choice, 0.0)
        return float(self.label == choice)


def failed(request: Generate | Judge, error: str, prompt_tokens: int = 0) -> Generation | Judgment:
    """A generator request's error response, of the request's own kind: a failed judgment is an error
    Judgment, never a Generation (nor a judgment a strategy would act on)."""
    return (Judgment("", None, prompt_tokens, error=error) if isinstance(request, Judge)
            else Generation("", prompt_tokens, error=error))


def shown_text(title: str | None, text: str) -> str:
    """A passage as every prompt and judge model sees it (``title: text``; the text alone when it has no title)."""
    return f"{title}: {text}" if title else text


@dataclass
class Passage:
    id: str
    title: str
    text: str
    score: float

    @property
    def shown(self) -> str:
        return shown_text(self.title, self.text)


@dataclass
class Retrieval:
    passages: list[Passage] = field(default_factory=list)
    error: str | None = None


@dataclass
class Ranking:
    indices: list[int] = field(default_factory=list)  # into the request's texts, best first
    scores: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass
class Entailment:
    p_entail: float = 0.0
    error: str | None = None


Request = Generate | Judge | Retrieve | Rank | Entail | Classify
Response = Generation | Judgment | Retrieval | Ranking | Entailment


@dataclass
class Question:
    """One input row as the engine reads it."""

    id: str
    question: str
    error: str | None = None  # set when the row cannot be answered (it becomes an error row)
    shard: int = 0  # input shard (output is committed per shard)
    kind: str | None = None  # the optional `kind` column (e.g. "claim": strategies may adapt)
    dataset: str | None = None  # the optional `dataset` column (answer forms may be set per dataset)


def as_choice(text: str, choices: tuple[str, ...]) -> str | None:
    """The choice ``text`` names, or None: the choice itself ("Yes." is yes), the longest choice it
    begins with ("no retrieval needed"), or the one choice it is the start of (a cut-off "CLEAR AND")."""
    said = text.strip().strip(".!:;,\"'").strip().lower()
    if not said:
        return None
    exact = [c for c in choices if c.lower() == said]
    begun = [c for c in choices if said.startswith(c.lower() + " ") or said.startswith(c.lower() + ",")]
    started = [c for c in choices if c.lower().startswith(said)]
    if exact:
        return exact[0]
    if begun:
        return max(begun, key=len)
    return started[0] if len(started) == 1 else None
