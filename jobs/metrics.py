"""Answer and retrieval metrics (SQuAD-style normalisation)."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize(text: str) -> str:
    """SQuAD v1.1: lower-case, drop punctuation and articles, collapse whitespace; a text that is nothing but an
    article ("A", a choice's letter or a blood type) keeps it: SQuAD's rule made it no answer at all."""
    return _squad(text) or _plain(text)


def _squad(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _plain(text: str) -> str:
    """Lower-cased, without punctuation, articles kept: what an article-only gold is looked for in."""
    return " ".join("".join(ch for ch in text.lower() if ch not in _PUNCT).split())


def _seen_as(prediction: str, gold: str) -> str:
    """The prediction normalised as ``gold`` is: an article-only gold ("A") is looked for with articles kept."""
    return normalize(prediction) if _squad(gold) else _plain(prediction)


def gold_answers(golds: list[str | None] | None) -> list[str]:
    """The gold answers a prediction can be scored against: a null, or one that normalises to nothing
    ("", " . "), is no answer (it would make an empty prediction exactly right)."""
    return [g for g in golds or [] if g is not None and normalize(g)]


def exact_match(prediction: str, golds: list[str]) -> float:
    p = normalize(prediction)
    return float(any(p == normalize(g) for g in gold_answers(golds)))


def f1(prediction: str, golds: list[str]) -> float:
    def one(gold: str) -> float:  # SQuAD v1.1: no shared token, no credit
        pred_tokens, gold_tokens = _seen_as(prediction, gold).split(), normalize(gold).split()
        same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if same == 0:
            return 0.0
        precision, recall = same / len(pred_tokens), same / len(gold_tokens)
        return 2 * precision * recall / (precision + recall)

    return max((one(g) for g in gold_answers(golds)), default=0.0)


def accuracy(prediction: str, golds: list[str], verdicts: tuple[str, ...] = ()) -> float:
    """A gold answer appears (normalised, on word boundaries) inside the prediction; for a yes/no gold,
    the prediction's first yes/no word is the gold ("Yes, there is no doubt" is not a "no"); for a gold
    among ``verdicts`` (the run's claim labels), the prediction's first label is ("NOT SUPPORTED" is no
    "SUPPORTED" where both are labels)."""
    golds = gold_answers(golds)
    if is_yes_no(golds):
        return float(yes_no(prediction) in {normalize(g) for g in golds})
    labels = {normalize(v) for v in verdicts}
    if golds and labels and all(normalize(g) in labels for g in golds):
        return float(verdict(prediction, labels) in {normalize(g) for g in golds})
    return float(any(f" {normalize(g)} " in f" {_seen_as(prediction, g)} " for g in golds))


def verdict(prediction: str, labels: set[str]) -> str | None:
    """The first of the (normalised) ``labels`` in a prediction, on word boundaries; of two starting at one
    word, the longer ("not supported" before "supported")."""
    words = normalize(prediction).split()
    for i in range(len(words)):
        found = [label for label in labels if words[i:i + len(label.split())] == label.split()]
        if found:
            return max(found, key=len)
    return None


YES_NO = {"yes", "no"}


def yes_no(prediction: str) -> str | None:
    """The first yes/no word of a prediction, if any."""
    for token in normalize(prediction).split():
        if token in YES_NO:
            return token
    return None


def is_yes_no(golds: list[str]) -> bool:
    golds = gold_answers(golds)
    return bool(golds) and all(normalize(g) in YES_NO for g in golds)


def recall_at_k(retrieved: list[str], gold: list[str], k: int) -> tuple[float, float]:
    """(any gold in top-k, all gold in top-k) for one question with a non-empty gold set."""
    top = set(retrieved[:k])
    hits = [g in top for g in gold]
    return float(any(hits)), float(all(hits))
