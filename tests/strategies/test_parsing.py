import json
import re

from hypothesis import given
from hypothesis import strategies as st

from strategies.parsing import parse_json_object, parse_string_list, string_list_schema


def test_json_in_fences_and_prose():
    assert parse_json_object('Sure!\n```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_object('Here: {"a": [1, 2]} done') == {"a": [1, 2]}
    assert parse_json_object("[1, 2]") is None


def test_string_list_json_fallbacks_and_dedup():
    assert parse_string_list('{"qs": ["A?", " a? ", "B?", ""]}', "qs", 5) == (["A?", "B?"], True)
    assert parse_string_list("1. A?\n2) B?\n- C?\nnoise", "qs", 5) == (["A?", "B?", "C?"], False)
    assert parse_string_list('{"qs": "not a list"}', "qs", 5) == ([], False)
    assert parse_string_list('{"qs": ["A", "B", "C"]}', "qs", 2) == (["A", "B"], True)
    # the question decomposed, listed as a step, is dropped before the cap: it takes no item's place
    assert parse_string_list("1. who is X\n2. A?\n3. B?", "qs", 2, besides="Who is X?") == (["A?", "B?"], False)
    assert parse_string_list('{"qs": ["Who is X?"]}', "qs", 2, besides="who is x") == ([], True)


def test_schema_is_a_hashable_json_string():
    schema = json.loads(string_list_schema("qs", 3))
    assert schema["properties"]["qs"]["maxItems"] == 3 and schema["required"] == ["qs"]


@given(st.text(), st.integers(min_value=1, max_value=6))
def test_never_raises_and_honours_the_contract(text, limit):
    items, ok = parse_string_list(text, "sub_questions", limit)
    assert len(items) <= limit and all(isinstance(i, str) and i.strip() == i and i for i in items)
    assert len({i.lower() for i in items}) == len(items)
    assert not ok or items


@given(st.lists(st.text(min_size=1).filter(lambda s: s.strip()), max_size=8))
def test_valid_json_round_trips(values):
    items, ok = parse_string_list(json.dumps({"sub_questions": values}), "sub_questions", 10)
    expected, seen = [], set()
    # a list marker an item begins with ("1. ", "* ") is not the item's (as a numbered line outside JSON);
    # items with a letter or digit, repeats up to case and punctuation
    for v in (" ".join(re.sub(r"^\s*(?:\d+[.)]|[-*•])\s+", "", x).split()) for x in values):
        words = tuple(re.findall(r"\w+", v.lower()))
        if re.search(r"[^\W_]", v) and words not in seen:
            seen.add(words)
            expected.append(v)
    assert items == expected[:10] and ok == bool(expected)


def test_list_markers_inside_json_items_are_dropped_and_repeats_recognised():
    from strategies.parsing import parse_string_list, same_question
    items, ok = parse_string_list('{"q": ["1. Who is X?", "- Where is Y?"]}', "q", 4)
    assert (items, ok) == (["Who is X?", "Where is Y?"], True)
    assert same_question("Who directed Levity?", "who directed  levity") and not same_question("Who?", "Where?")


def test_a_lone_surrogate_a_model_wrote_as_an_escape_is_replaced_not_carried_into_rows_and_prompts():
    """SmolLM2 copied a question's "\\ud800" into its JSON: json.loads made it a lone surrogate, which
    no Parquet row holds (the run died writing it, and again on every resume) and no tokenizer takes."""
    from strategies.parsing import parse_json_object

    parsed = parse_json_object('{"sub_questions": ["Who owns \\\\u0041 and \\ud800?"], "k\\udfff": 1}')
    assert parsed == {"sub_questions": ["Who owns \\u0041 and ??"], "k?": 1}
    "".join(parsed["sub_questions"]).encode("utf-8")  # raised UnicodeEncodeError before


def test_items_without_a_letter_or_digit_are_no_items_and_repeats_differ_in_more_than_punctuation():
    assert parse_string_list('{"sub_questions": ["...", "...", ",", "?", "_"]}', "sub_questions", 4) == ([], False)
    assert parse_string_list('{"q": ["...", "Who directed Jaws?", "who directed jaws", "Who is 1?"]}', "q", 4) == (
        ["Who directed Jaws?", "Who is 1?"], True)
    assert parse_string_list("1. ...\n2. Où est-il ?", "q", 4) == (["Où est-il ?"], False)


def test_a_bold_heading_is_no_sub_question_a_decimal_keeps_its_digits_and_an_object_before_prose_is_read():
    """Seen where JSON is not enforced (an endpoint that ignores response_format): "**Sub-questions:**" became a
    sub-question that was spawned, "1.5 million ..." lost its "1.", and a valid object before prose with a brace
    in it ("replace {name}") gave no sub-question at all."""
    listed = "**Sub-questions:**\n1. Who directed Jaws?\n2) When was he born?\n- Where?\n1.Who else?"
    assert parse_string_list(listed, "sub_questions", 5) == (
        ["Who directed Jaws?", "When was he born?", "Where?", "Who else?"], False)
    assert parse_string_list("1.5 million people live where?\n2. Who?", "q", 4) == (["Who?"], False)
    prose = '{"sub_questions": ["Who directed Jaws?", "When was he born?"]}\nNote: replace {name} with the director.'
    assert parse_string_list(prose, "sub_questions", 4) == (["Who directed Jaws?", "When was he born?"], True)
    assert parse_json_object('{"a": 1} and {"b": 2}') == {"a": 1}
