"""Long passages split into parts of N words (index.chunk_words), ids <id>#<n>, scored as their passage."""

import pytest

from jobs.chunks import count, part_id, passage_of, split
from schemas.config import IndexConfig


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.mark.parametrize("n, size, overlap, expected", [
    (250, 100, 0, [(0, 99), (100, 199), (200, 249)]),
    (250, 100, 20, [(0, 99), (80, 179), (160, 249)]),
    (100, 100, 20, [(0, 99)]),  # no longer than a part: as it is
    (101, 100, 0, [(0, 99), (100, 100)]),
])
def test_a_passage_is_cut_into_windows_that_cover_it_each_repeating_the_overlap(n, size, overlap, expected):
    parts = split(words(n), size, overlap)
    assert [(int(p.split()[0][1:]), int(p.split()[-1][1:])) for p in parts] == expected
    assert count(words(n), size, overlap) == len(parts)


def test_a_part_is_cut_from_the_text_as_written_keeping_its_spacing_and_paragraphs():
    assert split("one  two\n\nthree four five", 2) == ["one  two", "three four", "five"]
    assert split("  short  ", 8) == ["  short  "]


def test_a_part_id_names_its_passage_and_other_ids_are_left_as_they_are():
    assert passage_of(part_id("doc#7", 3)) == "doc#7"
    assert [passage_of(i) for i in ("doc", "doc#x", "doc#", "a#1#2")] == ["doc", "doc#x", "doc#", "a#1"]


def test_an_overlap_as_long_as_the_part_is_refused_naming_both_fields():
    with pytest.raises(ValueError, match=r"index.chunk_overlap \(100\) must be less than index.chunk_words \(100\)"):
        IndexConfig(chunk_words=100, chunk_overlap=100)
    with pytest.raises(ValueError, match="greater than or equal to 8"):
        IndexConfig(chunk_words=3)
    with pytest.raises(ValueError, match=r"index.chunk_overlap \(10\) without index.chunk_words"):
        IndexConfig(chunk_overlap=10)


def test_each_chinese_or_japanese_character_is_a_word_so_their_unspaced_text_is_split_too():
    """A Chinese article has no spaces: it was one "word" a clause and never split, its rag rows errors."""
    text = "東京は日本の首都です。" * 20  # 220 characters, no space
    parts = split(text, 50)
    assert [len(p) for p in parts] == [50, 50, 50, 50, 20] and "".join(parts) == text
    assert count(text, 50) == 5 and split("Tokyo 東京 is big", 3) == ["Tokyo 東京", "is big"]
