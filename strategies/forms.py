"""The answer in the form the question asks (config: ``answer_form``, schemas/config.py).

A yes/no question gets yes or no, a claim gets a verdict, anything else a short answer. Every
strategy's final answer step goes through ``final_request`` / ``final_answer``, so syntheses from
sub-answers and fallbacks answer in the same form as a one-step answer.

Choice forms are guided choices on the generator (a ``Judge`` routed to the generator stage, so a
separate judge model never writes answers); the choice is the most probable one by the first
token's log-probs over every capitalisation ("Yes", "yes"), not only the spelling the grammar
allows, which is what greedy decoding under the mask would pick. ``yes_no_reasoned`` asks for a
few sentences of reasoning before the yes / no instead (one JSON generation, reasoning first):
a choice read off the first token has no room to reason, which implicit-reasoning questions
(StrategyQA's) may need. Measured in results/README.md ("Yes/no with reasoning first"): not a gain
for our models through the strategies, so no default uses it.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, Field

from engine.steps import Item
from schemas.config import AnswerFormConfig
from schemas.records import Generate, Generation, Judge, Judgment
from strategies.base import answer_messages, clean_answer, passes, prompt
from strategies.structured import parse_as, schema_of

SHORT, YES_NO, YES_NO_REASONED, VERDICT = "short", "yes_no", "yes_no_reasoned", "verdict"
YES_NO_FORMS = (YES_NO, YES_NO_REASONED)
REASONING_CHARS = 600
# room for the reasoning and the JSON around it in any script: a character of the basic multilingual plane is at
# most 3 UTF-8 bytes and a byte-level BPE spends at most a token a byte (600 characters: Qwen2.5 ~130 tokens in
# English, ~440 in Japanese, ~600 in Hindi; SmolLM2 ~1,160 in Japanese). 200 cut a Japanese reasoning off before its
# answer, an empty answer to a yes/no question; the generation ends with its JSON, so the room is only reserved
REASON_TOKENS = 3 * REASONING_CHARS + 40


class ReasonedYesNo(BaseModel):
    """A yes/no answer after its reasoning, in that order (the order guided decoding writes them in)."""

    reasoning: str = Field(max_length=REASONING_CHARS)
    answer: Literal["yes", "no"]


_REASONED_SCHEMA = schema_of(ReasonedYesNo)
_ANSWER_FIELD = re.compile(r'"answer"\s*:\s*"(yes|no)"', re.IGNORECASE)
SUB_QUESTION = "sub-question"  # the kind ``detect_yes_no`` names for questions a strategy spawned

_AUXILIARY = re.compile(r"^\s*(is|are|was|were|do|does|did|can|could|has|have|had|will|would|should|shall|may|"
                        r"might|must)\b", re.IGNORECASE)
_ALTERNATIVE = re.compile(r"\bor\b", re.IGNORECASE)


def is_yes_no_question(question: str) -> bool:
    """Phrased as a yes/no question: it opens with an auxiliary verb and offers no alternatives
    ("Did X or Y die first?" asks for a name)."""
    return bool(_AUXILIARY.match(question)) and not _ALTERNATIVE.search(question)


def form_of(item: Item, config: AnswerFormConfig) -> str:
    """The form of ``item``'s final answer: by dataset, else kind (roots), else yes/no detection."""
    if item.depth == 0:
        if item.dataset in config.by_dataset:
            return config.by_dataset[item.dataset]
        if item.kind in config.by_kind:
            return config.by_kind[item.kind]
    return detected_form(item.question, item.kind if item.depth == 0 else SUB_QUESTION, config)


def detected_form(question: str, kind: str | None, config: AnswerFormConfig) -> str:
    """yes_no for a question of a ``detect_yes_no`` kind phrased as a yes/no question, else short."""
    if kind in config.detect_yes_no and is_yes_no_question(question):
        return YES_NO
    return SHORT


def _spelling(name: str) -> str:
    return re.sub(r"[\s_/]+", "-", name.strip().lower())


def misnamed(kinds: dict[str, int], datasets: dict[str, int], config: AnswerFormConfig) -> list[str]:
    """What in ``answer_form`` the input names otherwise, from the counts of its ``kind`` and ``dataset``
    values: a kind spelt "yes_no" or "Yes-No" is not by_kind's "yes-no" and gets a short answer (names
    are matched exactly: a kind of the user's own may be anything), and a ``by_dataset`` name no question
    has sets no form."""
    said = []
    known = {*config.by_kind, *config.detect_yes_no}
    for kind, n in sorted(kinds.items()):
        like = sorted(k for k in known if _spelling(k) == _spelling(kind))
        if kind in known or not like:
            continue
        if like[0] in config.by_kind:
            form = config.by_kind[like[0]]
            said.append(f"{n} questions of kind {kind!r}, which answer_form.by_kind does not name (it names "
                        f"{like[0]!r}): they get short answers, not {form!r} ones; rename the kind in the input, "
                        f"or map it: --set 'answer_form.by_kind.{kind}={form}'")
        else:
            said.append(f"{n} questions of kind {kind!r}, which answer_form.detect_yes_no does not name (it names "
                        f"{like[0]!r}): those phrased as yes/no questions get short answers, not yes or no; rename "
                        "the kind in the input, or add it to answer_form.detect_yes_no")
    for name in sorted(config.by_dataset):
        if name not in datasets:
            like = sorted(d for d in datasets if _spelling(d) == _spelling(name))
            said.append(f"answer_form.by_dataset names {name!r}, which no question's dataset is"
                        + (f" (the input has {like[0]!r})" if like else "") + ": it sets no answer form")
    return said


def choices(form: str, config: AnswerFormConfig) -> tuple[str, ...] | None:
    """The closed set of answers of a choice form; None for a short answer."""
    if form in YES_NO_FORMS:
        return ("yes", "no")
    if form == VERDICT:
        return tuple(config.verdicts)
    return None


def final_request(user: str, form: str, config: AnswerFormConfig, step: str = "answer") -> Generate | Judge:
    """The final answer step for ``user`` (a strategy's answer prompt) in ``form``."""
    options = choices(form, config)
    if options is None:
        return Generate(answer_messages(user), step=step)
    if form == YES_NO_REASONED:
        return Generate((("system", prompt("answer_system_yes_no_reasoned")), ("user", user)), max_tokens=REASON_TOKENS,
                        json_schema=_REASONED_SCHEMA, step=step)
    system = prompt(f"answer_system_{form}").format(choices=", ".join(options))
    return Judge((("system", system), ("user", user)), options, stage="generator", step=step)


def final_answer(response: Generation | Judgment, form: str, config: AnswerFormConfig | None = None) -> str:
    """The answer ``response`` gives to a final step asked in ``form`` (see the module docstring for choices);
    a verdict between two labels by ``config.verdict_cut`` where one is set."""
    if isinstance(response, Judgment):
        cut = config.verdict_cut if config is not None and form == VERDICT else None  # two verdicts (its validator)
        if cut is not None and response.probs and not _tied(response.probs):
            first, second = config.verdicts
            return first if passes(response.probs.get(first, 0.0), cut) else second
        return chosen(response)
    if form == YES_NO_REASONED:
        reasoned = parse_as(ReasonedYesNo, response.text)
        if reasoned is not None:
            return reasoned.answer
        # a reasoning over its length (a backend that does not enforce it) still names its answer
        said = _ANSWER_FIELD.search(response.text)
        return said.group(1).lower() if said else ""  # cut off before answering: no answer, not a guess
    return clean_answer(response.text)


def chosen(judgment: Judgment) -> str:
    """The choice a judgment answers: the likelier by its first-token log-probs, which is not always the
    label guided decoding wrote; the label where there are none, or where they cannot tell the likeliest
    apart (choices that begin with the same token: "MOSTLY TRUE" / "MOSTLY FALSE" share its probability
    evenly, and the first listed won every claim)."""
    best = max(judgment.probs, key=judgment.probs.get) if judgment.probs else None
    # the label only where it is one of the tied likeliest (not a third, less likely choice)
    if best is None or (_tied(judgment.probs) and _close(judgment.probs.get(judgment.label, -1.0), judgment.probs[best])):
        return judgment.label
    return best


def _tied(probs: dict[str, float]) -> bool:
    """Whether the likeliest choices have the same probability (a first token they share)."""
    top = sorted(probs.values(), reverse=True)
    return len(top) > 1 and _close(top[0], top[1])


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def answered(item: Item, step: str, response: Generation | Judgment, form: str, config: AnswerFormConfig) -> str:
    """The answer of a final step in ``form``, its trace entry (``traced``) appended to ``item``'s trace."""
    entry = traced(step, response, form, config)
    item.trace.append(entry)
    return entry["output"] if isinstance(response, Judgment) else final_answer(response, form, config)


def traced(step: str, response: Generation | Judgment, form: str | None = None,
           config: AnswerFormConfig | None = None) -> dict:
    """A final step's trace entry: its output and, for a choice, the probabilities it was taken by (its
    guided label can name the other choice: a row whose trace said REFUTES answered SUPPORTS)."""
    # the output: what the model wrote, or the choice taken from a judgment (by a verdict cut where one applies)
    entry = {"step": step, "output": final_answer(response, form, config) if isinstance(response, Judgment) else response.text}
    if isinstance(response, Judgment) and response.probs:
        entry["probs"] = {choice: round(p, 6) for choice, p in response.probs.items()}
        if _tied(response.probs):  # the label written was taken: a verdict cut, where set, was not applied
            entry["tied"] = True
    return entry
