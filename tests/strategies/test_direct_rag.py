import pytest

from schemas.records import Generate, Generation, Passage, Retrieval, Retrieve
from strategies.base import Ask, Done, Item, StrategySettings, clean_answer, prompt
from strategies.raisf import RaisfConfig, relevance_requests
from strategies.registry import STRATEGIES


def test_direct_asks_once_and_cleans_the_answer():
    s = STRATEGIES["direct"](StrategySettings())
    item = Item("Who wrote Hamlet?")
    step = s.start(item)
    assert isinstance(step, Ask) and len(step.requests) == 1
    (req,) = step.requests
    assert isinstance(req, Generate) and "Who wrote Hamlet?" in req.messages[-1][1]
    done = s.resume(item, [Generation("Answer: William Shakespeare\nmore", 10, 5)])
    assert done == Done("William Shakespeare", "closed_book")


def test_rag_retrieves_k_then_reads_the_passages_in_order_and_cites_nothing():
    s = STRATEGIES["rag"](StrategySettings(k=2))
    item = Item("capital of France?")
    step = s.start(item)
    assert step.requests == [Retrieve("capital of France?", 2)]
    passages = [Passage("p1", "France", "Paris is the capital.", 0.9), Passage("p2", "Lyon", "Lyon.", 0.5)]
    step = s.resume(item, [Retrieval(passages)])
    prompt = step.requests[0].messages[-1][1]
    assert prompt.index("[1] France: Paris") < prompt.index("[2] Lyon") < prompt.index("capital of France?")
    done = s.resume(item, [Generation("Paris", 100, 1)])
    # the reader cites nothing: its passages are the retrieval (retrieved_ids), not citations
    assert done.answer == "Paris" and done.resolved_by == "passages" and done.citations == []
    assert item.passages == passages


def test_rag_with_no_passage_retrieved_says_it_answered_closed_book_not_from_passages():
    s = STRATEGIES["rag"](StrategySettings(k=2))
    item = Item("明长城全长多少公里？")
    s.start(item)
    s.resume(item, [Retrieval([])])
    assert s.resume(item, [Generation("8850", 30, 2)]).resolved_by == "closed_book"


def test_a_passage_without_a_title_is_shown_as_its_text_alone_in_every_prompt():
    """Before, an untitled corpus's passages reached the reader and the judges as ": text"."""
    untitled = Passage("p1", "", "Paris is the capital.", 0.9)
    s = STRATEGIES["rag"](StrategySettings(k=1))
    item = Item("capital of France?")
    s.start(item)
    read = s.resume(item, [Retrieval([untitled])]).requests[0].messages[-1][1]
    assert "[1] Paris is the capital." in read
    judged = relevance_requests("capital of France?", [untitled], RaisfConfig())
    (judge,) = judged
    assert judge.messages[-1][1] == prompt("raisf/relevance").format(question="capital of France?",
                                                                    passage="Paris is the capital.")


def test_errors_become_error_results():
    rag = STRATEGIES["rag"](StrategySettings())
    item = Item("q")
    rag.start(item)
    assert rag.resume(item, [Retrieval(error="shard died")]).error == "shard died"
    direct = STRATEGIES["direct"](StrategySettings())
    item = Item("q")
    direct.start(item)
    assert direct.resume(item, [Generation("", error="too long")]).resolved_by == "error"


def test_an_answer_loses_its_answer_prefix_quotes_and_surrounding_blank_lines():
    assert clean_answer('  \n"Final answer: Paris"\n') == "Paris"
    assert clean_answer("") == ""


def test_an_answer_in_a_code_fence_is_the_line_inside_not_the_fence():
    """A fenced rewrite made Think-then-Act search for "```"; a fenced answer was "```json"."""
    assert clean_answer("```\nWho directed Titanic (1997)?\n```") == "Who directed Titanic (1997)?"
    assert clean_answer("```json\nParis\n```") == "Paris"


def test_an_answer_loses_the_lead_ins_small_models_write_before_it():
    """Seen on the real stack: "The answer to the question is: Lois McMaster Bujold" scored no EM, and
    "Sure! Here is the answer:" stood as the answer to a question answered on the next line."""
    assert clean_answer("The answer to the question is: Lois McMaster Bujold") == "Lois McMaster Bujold"
    assert clean_answer("The answer is: The Bellas") == "The Bellas"
    assert clean_answer("**Answer:** Paris") == "Paris"
    assert clean_answer("Sure! Here is the answer:\n\nParis\n") == "Paris"
    assert clean_answer("Bora Bora: 10,605") == "Bora Bora: 10,605"  # a colon inside an answer stays
    assert clean_answer("Note:") == "Note:"  # a last line ending in ':' is all there is


@pytest.mark.parametrize("said, answer", [
    ("Answer\nParis", "Paris"), ("**Answer**\nParis", "Paris"), ("### Final Answer\nParis", "Paris"),  # headings
    ("The answer is Paris.", "Paris."), ("Short answer: Paris", "Paris"), ("Final answer - Paris", "Paris"),
    ("Paris [1]", "Paris"), ("Paris [1, 3].", "Paris."), ("Answer:\n- Paris\n- Lyon", "Paris"),
    ("\u201cParis\u201d", "Paris"), ('The answer is: "Paris"', "Paris"),
    # the answer's own words stay
    ("answer-key", "answer-key"), ("Answer-Smith", "Answer-Smith"), ('"Hey Jude" and "Let It Be"', '"Hey Jude" and "Let It Be"'),
    ("1. FC K\u00f6ln", "1. FC K\u00f6ln"), ("The Answer Man", "The Answer Man"), ("Answer", "Answer"),
    ("[1] Paris", "[1] Paris"),
    ("Rock 'n' Roll", "Rock 'n' Roll"), ("Star Wars: Episode IV", "Star Wars: Episode IV")])
def test_an_answer_is_what_a_reader_takes_from_the_models_line(said, answer):
    """Each of the first kind scored no EM against "Paris": a heading taken as the answer, a citation mark,
    curly quotes, "The answer is" without a colon; and "answer-key" lost its "answer-"."""
    assert clean_answer(said) == answer


def test_prompts_are_read_once_per_process():
    """A decorator moved onto the function above it left prompt() reading its file on every call."""
    from strategies.base import prompt

    assert prompt("rag/user") is prompt("rag/user") and prompt.cache_info().hits > 0
