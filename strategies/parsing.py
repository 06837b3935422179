"""Tolerant parsers for structured model output. Each returns (value, ok): ok is False when the
text was not the requested JSON and the value came from a fallback (or is empty); callers count it."""

from __future__ import annotations

import json
import re

from schemas.records import utf8

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
# "1. A?", "1.A?", "2) B?", "- C?"; not "1.5 million ...?" (a decimal) nor "**Sub-questions:**" (bold, not a bullet)
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)](?!\d)\s*|[-*•]\s+)(.+?)\s*$")
_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+")
_WORDS = re.compile(r"\w+")
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")


def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORDS.findall(text.lower()))


def same_question(a: str, b: str) -> bool:
    """Equal up to case, punctuation and spacing (a sub-question that merely repeats its parent)."""
    return _words(a) == _words(b)


def has_words(text: str) -> bool:
    """A letter or digit in it: "...", "," or "?" alone (a prompt's placeholder copied) says nothing."""
    return bool(_LETTER_OR_DIGIT.search(text))


def _json_candidates(text: str):
    yield text
    yield from _FENCE.findall(text)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        yield text[start:end + 1]


def _surrogate_free(value):
    if isinstance(value, str):
        return utf8(value)
    if isinstance(value, list):
        return [_surrogate_free(v) for v in value]
    if isinstance(value, dict):
        return {utf8(k): _surrogate_free(v) for k, v in value.items()}
    return value


def parse_json_object(text: str) -> dict | None:
    for candidate in _json_candidates(text):
        try:
            value = _surrogate_free(json.loads(candidate))
        except (json.JSONDecodeError, TypeError):
            continue
        if isinstance(value, dict):
            return value
    # an object followed by prose with a brace in it ("replace {name} ..."), or by a second object
    decoder, start = json.JSONDecoder(), text.find("{")
    while start >= 0:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return _surrogate_free(value)
        start = text.find("{", start + 1)
    return None


def parse_string_list(text: str, key: str, limit: int, besides: str | None = None) -> tuple[list[str], bool]:
    """A list of distinct strings with words in them under ``key``; falls back to numbered/bulleted lines.
    A copy of ``besides`` (the question decomposed, which the model may list as a step) is dropped before
    the cap, so it takes no other item's place (dropped after it, "1. <the question> 2. A ... 5. D" lost D)."""
    obj = parse_json_object(text)
    items, ok = None, False
    if obj is not None and isinstance(obj.get(key), list):
        items, ok = [x for x in obj[key] if isinstance(x, str)], True
    if items is None:
        items = [m.group(1) for line in text.splitlines() if (m := _LIST_ITEM.match(line))]
    seen, out = set(), []
    # "1. Who ...?" inside the JSON list is the same item as "Who ...?"
    for item in (" ".join(_MARKER.sub("", x).split()) for x in items):
        words = _words(item)
        # an item without a letter or digit is the prompt's "..." placeholder copied, or a stray ",": no
        # question (asked, it was answered with an echo of the system prompt); repeats differ at most in
        # case, punctuation or spacing (the test `same_question` applies)
        if has_words(item) and words not in seen:
            seen.add(words)
            out.append(item)
    kept = [x for x in out if besides is None or not same_question(x, besides)]
    return kept[:limit], ok and bool(out)


def string_list_schema(key: str, limit: int) -> str:
    """JSON schema (as a string, hashable for request dedup) for {key: [1..limit strings]}."""
    return json.dumps({
        "type": "object",
        "properties": {key: {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": limit}},
        "required": [key],
    }, sort_keys=True)
