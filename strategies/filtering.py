"""Knowledge filtering on ranker scores (MIGRES Section 3.2), reusable by any strategy.

Two steps, each one round of ``Rank`` requests on the ranker stage (a CrossEncoder, or the
bi-encoder fallback):

    passage level   ``passage_requests`` -> ``keep_passages``: drop passages scoring under delta,
                    keep at most k, best first
    sentence level  ``sentence_requests`` -> ``filter_sentences``: drop sentences under delta; keep
                    the whole passage when it outscores every one of its sentences
"""

from __future__ import annotations

import re

from schemas.records import Passage, Rank, Ranking

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
# a piece ending so is no sentence's end: an initial ("J. K. Rowling"), initials ("the U.S. Army", "e.g."), a title
_ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Mt|Ft|Jr|Sr|Prof|Gen|Gov|Sen|Rep|Rev|Col|Lt|Sgt|Capt|No|vs|Inc|Ltd|"
                           r"Co|Corp|Bros)|(?:\b[A-Za-z]\.)+[A-Za-z])\.$")
_INITIAL = re.compile(r"[A-HJ-Z]\.")  # not "I": "World War I." ends a sentence


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences at end punctuation before a capital, digit, quote or bracket; not after an
    abbreviation. MIGRES segments with NLTK's punkt, a model that is a download (nltk.download), not a wheel:
    offline, this rule does its common cases."""
    out: list[str] = []
    for piece in _SENTENCE.split(text):
        if out and _abbreviated(out[-1], piece):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return [s.strip() for s in out if len(s.strip()) > 1]


def _abbreviated(piece: str, following: str) -> bool:
    """Whether ``piece`` ends in an abbreviation, not a sentence: a title, initials, or an initial after a name
    or before another ("by J. K. Rowling"); a lone capital after a lowercase word ends one ("Take vitamin C.")."""
    if _ABBREVIATION.search(piece):
        return True
    words = piece.split()
    if not words or not _INITIAL.fullmatch(words[-1]):
        return False
    return len(words) == 1 or not words[-2][:1].islower() or bool(_INITIAL.match(following.lstrip()))


def passage_requests(query: str, passages: list[Passage]) -> Rank:
    # bare text, no title: one delta cuts both levels, so a passage is scored as its sentences are
    return Rank(query, tuple(p.text for p in passages), len(passages))


def keep_passages(passages: list[Passage], ranking: Ranking, threshold: float, k: int) -> list[Passage]:
    """Passages at or above ``threshold``, best first, at most ``k``; score = the ranker's."""
    scored = [(passages[i], s) for i, s in zip(ranking.indices, ranking.scores) if s >= threshold]
    return [Passage(p.id, p.title, p.text, s) for p, s in scored[:k]]


def sentence_requests(query: str, passages: list[Passage]) -> list[Rank]:
    return [Rank(query, tuple(parts), len(parts)) for parts in (sentences(p.text) for p in passages)]


def filter_sentences(passage: Passage, ranking: Ranking, threshold: float) -> Passage | None:
    """The passage cut to its sentences at or above ``threshold`` (in text order), or whole when its
    own score beats every sentence's; None when nothing is left."""
    parts = sentences(passage.text)
    if not ranking.scores or passage.score > max(ranking.scores):
        text = passage.text
    else:
        text = " ".join(parts[i] for i in sorted(i for i, s in zip(ranking.indices, ranking.scores) if s >= threshold))
    return Passage(passage.id, passage.title, text, passage.score) if text else None
