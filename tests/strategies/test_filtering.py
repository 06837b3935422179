"""MIGRES knowledge filter rules: passage threshold and top-k, sentence filter, keep-whole rule."""

from schemas.records import Passage, Ranking
from strategies.filtering import (
    filter_sentences,
    keep_passages,
    sentence_requests,
    sentences,
)

TEXT = "Paris is the capital of France. It has 2 million people. The Seine flows through it."


def test_sentences_split_on_terminal_punctuation():
    assert sentences(TEXT) == ["Paris is the capital of France.", "It has 2 million people.",
                               "The Seine flows through it."]


def test_passages_under_delta_are_dropped_and_at_most_k_kept():
    ps = [Passage(str(i), "", f"p{i}", 0.0) for i in range(4)]
    kept = keep_passages(ps, Ranking([2, 0, 3, 1], [0.9, 0.6, 0.5, 0.1]), threshold=0.3, k=2)
    assert [(p.id, p.score) for p in kept] == [("2", 0.9), ("0", 0.6)]


def test_sentences_under_delta_are_dropped_in_text_order():
    p = Passage("p", "t", TEXT, 0.4)
    ranking = Ranking([2, 0, 1], [0.8, 0.5, 0.1])  # best first, as the ranker returns them
    assert filter_sentences(p, ranking, threshold=0.3).text == "Paris is the capital of France. The Seine flows through it."


def test_passage_that_outscores_all_its_sentences_is_kept_whole():
    p = Passage("p", "t", TEXT, 0.9)
    assert filter_sentences(p, Ranking([0, 1, 2], [0.5, 0.2, 0.1]), threshold=0.3).text == TEXT


def test_nothing_left_is_none():
    p = Passage("p", "t", TEXT, 0.1)
    assert filter_sentences(p, Ranking([0, 1, 2], [0.2, 0.2, 0.1]), threshold=0.3) is None


def test_sentence_requests_rank_every_sentence():
    (r,) = sentence_requests("capital?", [Passage("p", "t", TEXT, 0.5)])
    assert r.query == "capital?" and len(r.texts) == 3 and r.top == 3


def test_a_sentence_does_not_end_at_an_abbreviation_an_initial_or_a_title():
    """MIGRES's sentence filter (the paper segments with NLTK) scored "the U.S." and "Army from 1950." apart,
    and "Dr." / "Smith lived in St." / "Louis.": fragments, each cut at delta on its own."""
    from strategies.filtering import sentences

    assert sentences("He served in the U.S. Army from 1950. He retired.") == [
        "He served in the U.S. Army from 1950.", "He retired."]
    assert sentences("Dr. Smith lived in St. Louis. Then he moved to J. K. Rowling's town.") == [
        "Dr. Smith lived in St. Louis.", "Then he moved to J. K. Rowling's town."]
    assert sentences("It was No. 1 in 1990. 1991 was worse! \"Hey Jude\" was not.") == [
        "It was No. 1 in 1990.", "1991 was worse!", "\"Hey Jude\" was not."]
    # a lone capital ends a sentence after a lowercase word, and "I" always: they are no initials
    assert sentences("He fought in World War I. It ended. Take vitamin C. It helps. John F. Kennedy won.") == [
        "He fought in World War I.", "It ended.", "Take vitamin C.", "It helps.", "John F. Kennedy won."]
