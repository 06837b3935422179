"""MIGRES transitions with a scripted model: the iteration loop, knowledge filter at passage and
sentence level, knowledge prompting, entailment check, memory, and the iteration cap."""

import json

import pytest

from schemas.records import (
    Entail,
    Entailment,
    Generate,
    Generation,
    Judge,
    Judgment,
    Passage,
    Rank,
    Ranking,
    Retrieval,
    Retrieve,
)
from strategies.base import Item
from strategies.migres import MIGRES, MigresConfig
from tests.strategies.scripted import drive

FILM = Passage("film", "Levity", "Levity is a 2003 film. It was directed by Ed Solomon.", 0.9)
BIO = Passage("bio", "Ed Solomon", "Ed Solomon is an American screenwriter. He was born in 1960.", 0.8)
NOISE = Passage("noise", "Other", "Unrelated text here. Nothing useful.", 0.7)


def trace(item) -> dict:
    """MIGRES's record of the run: its iterations and the information set."""
    return next(t for t in item.trace if t.get("step") == "migres")


def history(item) -> list[str]:
    return [q for it in trace(item)["iterations"] for q in it["queries"]]


def is_main(request) -> bool:
    return request.step == "main"


class Script:
    """Passage scores and sentence scores by text; the model extracts one statement per passage with
    a keyword; the main module answers once both facts are known."""

    def __init__(self, scores=None, entailed=lambda s: True, queries=("Which nationality is Ed Solomon?",),
                 retrieve=None, extract=True):
        self.scores = {FILM.text: 0.8, BIO.text: 0.7, NOISE.text: 0.1, **(scores or {})}
        self.entailed, self.queries, self.extract = entailed, queries, extract
        self.retrieve = retrieve or (lambda q: [FILM, NOISE] if "Levity" in q else [BIO, NOISE])
        self.main_prompts, self.leaf_prompts = [], []

    def __call__(self, request, item):
        if isinstance(request, Retrieve):
            return Retrieval(self.retrieve(request.query)[: request.k])
        if isinstance(request, Rank):
            scores = [self.scores.get(t, 0.5) for t in request.texts]
            order = sorted(range(len(scores)), key=lambda i: -scores[i])[: request.top]
            return Ranking(order, [scores[i] for i in order])
        if request.step == "final" and isinstance(request, Judge):  # a closing answer in a choice form
            return Judgment("no", {"yes": 0.3, "no": 0.7}, 10, 1)
        if request.step == "entail":
            statement = request.messages[-1][1].split("Hypothesis: ")[1].split("\n")[0]
            p = 0.9 if self.entailed(statement) else 0.1
            return Judgment("yes" if p > .5 else "no", {"yes": p, "no": 1 - p}, 10, 1)
        assert isinstance(request, Generate)
        user = request.messages[-1][1]
        if request.step == "leaf":
            self.leaf_prompts.append(user)
            facts = [{"info": f, "support_passages": [0]} for f, key in
                     (("Levity was directed by Ed Solomon.", "directed by"), ("Ed Solomon is American.", "American"))
                     if key in user and self.extract]
            return Generation(json.dumps({"useful_information": facts}), 100, 20)
        if is_main(request):
            self.main_prompts.append(user)
            known = "Ed Solomon is American." in user or "LLM says American" in user
            answer = "American" if known else "unanswerable"
            return Generation(json.dumps({"answer": answer, "confidence": 4, "explanation": "",
                                          "missing_information": "" if known else "The nationality of Ed Solomon"}))
        if request.step == "query":
            queries = self.queries(user) if callable(self.queries) else list(self.queries)
            return Generation(json.dumps({"queries": queries}))
        if request.step == "knowledge":
            return Generation("LLM says American.")
        if request.step == "final":  # the answer read from the information
            information = user.split("Information: ")[1].split("\n")[0]
            return Generation("American" if "American" in information else "best guess")
        return Generation("best guess")


def test_missing_information_drives_a_second_iteration_to_the_answer():
    script, log = Script(), []
    done, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", script, log=log)
    assert (done.answer, done.resolved_by) == ("American", "answered")
    assert done.citations == ["film", "bio"]
    assert history(item) == ["What nationality is the director of Levity?", "Which nationality is Ed Solomon?"]
    its = trace(item)["iterations"]
    assert [it["passages"] for it in its] == [[["film"]], [["bio"]]]  # the noise passage is under delta
    assert its[0]["answer"] == "unanswerable" and its[0]["missing"] == "The nationality of Ed Solomon"
    assert [r.k for _, r in log if isinstance(r, Retrieve)] == [50, 50]
    assert item.trace[0]["step"] == "migres"  # written when the first iteration starts


def test_a_question_that_fails_midway_keeps_the_record_of_its_iterations_so_far():
    """The `migres` entry was written only when the question was done: an error row in iteration 2 had none."""
    script, mains = Script(), []

    def main_fails_second(request, item):
        if is_main(request):
            mains.append(request)
            if len(mains) == 2:
                return Generation("", error="prompt of 2100 tokens leaves 0 of max_model_len 2048")
        return script(request, item)
    done, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", main_fails_second)
    assert done.resolved_by == "error"
    its = trace(item)["iterations"]
    assert [it["queries"] for it in its] == [["What nationality is the director of Levity?"],
                                             ["Which nationality is Ed Solomon?"]]
    assert its[0]["answer"] == "unanswerable" and its[1]["passages"] == [["bio"]] and "answer" not in its[1]
    assert trace(item)["information"] == [{"info": "Levity was directed by Ed Solomon.", "source": ["film"]},
                                          {"info": "Ed Solomon is American.", "source": ["bio"]}]


def test_sentence_filter_keeps_passing_sentences_or_the_whole_passage():
    # FILM's sentences: one under delta, one over it; the passage (0.8) does not outscore 0.9
    script = Script(scores={"Levity is a 2003 film.": 0.1, "It was directed by Ed Solomon.": 0.9})
    drive(MIGRES(MigresConfig()), "Who directed Levity?", script)
    assert "Passage 0: (Title: Levity) It was directed by Ed Solomon." in script.leaf_prompts[0]
    # the passage outscores each sentence: kept whole
    script = Script(scores={"Levity is a 2003 film.": 0.2, "It was directed by Ed Solomon.": 0.4})
    drive(MIGRES(MigresConfig()), "Who directed Levity?", script)
    assert f"Passage 0: (Title: Levity) {FILM.text}" in script.leaf_prompts[0]


def test_nothing_relevant_prompts_the_llm_for_its_knowledge():
    script = Script(retrieve=lambda q: [NOISE])
    done, item = drive(MIGRES(MigresConfig()), "What nationality is Ed Solomon?", script)
    assert {"info": "LLM says American.", "source": []} in trace(item)["information"]
    assert done.answer == "American" and done.citations == []
    script = Script(retrieve=lambda q: [NOISE])
    done, item = drive(MIGRES(MigresConfig(knowledge_prompting=False, max_iterations=2)), "Who?", script)
    assert done.resolved_by == "max_iterations" and trace(item)["information"] == []


def test_statements_not_entailed_by_their_passages_are_dropped():
    script = Script(entailed=lambda s: "American" not in s)
    done, item = drive(MIGRES(MigresConfig(max_iterations=2)), "What nationality is the director of Levity?", script)
    assert [i["info"] for i in trace(item)["information"]] == ["Levity was directed by Ed Solomon."]
    assert trace(item)["iterations"][1]["extracted"][0]["kept"] is False
    assert (done.answer, done.resolved_by) == ("best guess", "max_iterations")


def test_memory_suppresses_used_passages_and_repeated_queries_and_t_depends_on_kind():
    script = Script(extract=False, queries=("Who directed Levity?",), retrieve=lambda q: [FILM])
    done, item = drive(MIGRES(MigresConfig()), "Who directed Levity?", script)
    # the generated query repeats the question, so the missing information is asked instead; when
    # that too has been asked, there is nothing new: the closing answer comes early
    assert history(item) == ["Who directed Levity?", "The nationality of Ed Solomon"]
    assert len(trace(item)["iterations"]) == 2 and done.resolved_by == "no_new_query"

    fresh = Script(extract=False, retrieve=lambda q: [FILM],
                   queries=lambda user: [f"query {user.count(';') + 1}"])  # a new query every time
    done, item = drive(MIGRES(MigresConfig(knowledge_prompting=False)), "Who directed Levity?", fresh)
    assert [it["passages"] for it in trace(item)["iterations"]] == [[["film"]], [["film"]], [[]], [[]], [[]]]
    assert done.resolved_by == "max_iterations"  # T = 5
    single = Item("Who directed Levity?", kind="single-hop")
    done, single = drive_item(MIGRES(MigresConfig()), single, Script(extract=False, retrieve=lambda q: [FILM],
                              queries=lambda user: [f"query {user.count(';') + 1}"]))
    assert len(trace(single)["iterations"]) == 3  # T = 3 for open-domain questions


def test_a_passage_is_read_at_most_max_uses_times_across_the_queries_of_one_iteration_too():
    # three queries retrieving the same passage in one iteration: each read it (the limit was checked
    # only when an iteration began)
    script = Script(extract=False, retrieve=lambda q: [FILM], queries=("a?", "b?", "c?"))
    _, item = drive(MIGRES(MigresConfig(knowledge_prompting=False, max_uses=2)), "Who directed Levity?", script)
    assert trace(item)["iterations"][1]["passages"] == [["film"], [], []]  # used once before, once more here
    assert len(script.leaf_prompts) == 2


def test_a_leaf_output_cut_off_by_its_budget_is_asked_once_more_with_twice_the_tokens():
    class CutOff(Script):
        budgets = []

        def __call__(self, request, item):
            if request.step == "leaf":
                self.budgets.append(request.max_tokens)
                if len(self.budgets) == 1:
                    return Generation('{"useful_information": [{"info": "Levity was dir', 100, 200)
            return super().__call__(request, item)

    script = CutOff()
    done, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", script)
    assert script.budgets[:2] == [200, 400] and item.counts["parse_failures"] == 1  # its statements were lost
    assert "Levity was directed by Ed Solomon." in [i["info"] for i in trace(item)["information"]]
    assert done.answer == "American"


def test_a_leaf_output_the_model_finished_unparsed_is_not_asked_again():
    """As structured() does: greedy decoding would write it again (a server that ignores the schema)."""
    class Prose(Script):
        budgets = []

        def __call__(self, request, item):
            if request.step == "leaf":
                self.budgets.append(request.max_tokens)
                return Generation("Levity was directed by Ed Solomon.", 100, 9, finish_reason="stop")
            return super().__call__(request, item)

    script = Prose()
    _, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", script)
    assert script.budgets and set(script.budgets) == {200}
    assert [t["retry"] for t in item.trace if t.get("step") == "leaf"] == [False] * len(script.budgets)
    assert item.counts["parse_failures"] == len(script.budgets)  # once each (it was counted twice)


def drive_item(strategy, item, respond):
    step = strategy.start(item)
    while not hasattr(step, "resolved_by"):
        step = strategy.resume(item, [respond(r, item) for r in step.requests])
    return step, item


def test_an_unparseable_main_answer_is_retried_once_with_more_tokens():
    class Garbled(Script):
        def __call__(self, request, item):
            if is_main(request):
                self.main_prompts.append(request.max_tokens)
                if len(self.main_prompts) == 1:
                    return Generation('{"answer": "Ame', 160, 160)
            return super().__call__(request, item)

    script = Garbled()
    done, item = drive(MIGRES(MigresConfig()), "What nationality is Ed Solomon?", script)
    assert script.main_prompts[:2] == [160, 320] and item.counts["parse_failures"] == 1
    assert done.answer == "American"


def test_with_an_nli_model_statements_are_verified_on_the_nli_stage():
    script = Script(entailed=lambda s: "American" not in s)
    asked = []

    def respond(request, item):
        asked.append(type(request).__name__)
        if isinstance(request, Entail):
            assert request.hypothesis in ("Levity was directed by Ed Solomon.", "Ed Solomon is American.")
            assert request.premise.startswith(("Levity: ", "Ed Solomon: "))  # each passage with its title, as the leaf saw it
            return Entailment(0.2 if "American" in request.hypothesis else 0.95)
        return script(request, item)

    strategy = MIGRES(MigresConfig(max_iterations=2), nli=True)
    assert "nli" in strategy.stages and "nli" not in MIGRES(MigresConfig()).stages
    done, item = drive(strategy, "What nationality is the director of Levity?", respond)
    assert "Entail" in asked and "Judge" not in asked
    assert [i["info"] for i in trace(item)["information"]] == ["Levity was directed by Ed Solomon."]
    assert trace(item)["iterations"][0]["extracted"][0] == {"info": "Levity was directed by Ed Solomon.",
                                                           "p_entailed": 0.95, "kept": True}


def test_a_yes_no_question_is_answered_yes_or_no_by_the_main_module_and_the_closing_answer():
    log, script = [], Script(extract=False)
    item = Item("Were Levity and Ed Solomon both American?", kind="multi-hop")  # phrased as a yes/no question
    done, item = drive_item(MIGRES(MigresConfig(max_iterations=1)), item, lambda r, i: log.append((0, r)) or script(r, i))
    main = next(r for _, r in log if is_main(r))
    assert json.loads(main.json_schema)["properties"]["answer"]["enum"] == ["yes", "no", "unanswerable"]
    closing = log[-1][1]  # unanswered at T: the closing answer is a guided yes / no on the generator
    assert isinstance(closing, Judge) and closing.choices == ("yes", "no") and closing.stage == "generator"
    assert (done.answer, done.resolved_by) == ("no", "max_iterations")
    # the trace says the choice taken and the probabilities it was taken by (it had the choice alone)
    assert trace(item)["iterations"][-1]["final"] == "no" and trace(item)["iterations"][-1]["final_probs"]["no"] == 0.7


def test_the_leaf_schema_asks_for_a_statement_citing_a_passage_that_exists():
    """Under guided decoding an untuned 0.5B model took the empty list every time, and cited passage -1
    when made to write one: MIGRES's information set stayed empty and the main module guessed."""
    import pydantic
    import pytest

    from strategies.migres import leaf_model

    leaf = leaf_model(2)
    assert leaf.model_validate({"useful_information": [{"info": "x", "support_passages": [1]}]})
    for bad in ([], [{"info": "x", "support_passages": []}], [{"info": "x", "support_passages": [2]}],
                [{"info": "x", "support_passages": [-1]}]):
        with pytest.raises(pydantic.ValidationError):
            leaf.model_validate({"useful_information": bad})
    # the request carries that schema, sized to the passages listed (FILM alone passes delta)
    log = []
    drive(MIGRES(MigresConfig()), "Who directed Levity?", Script(), log=log)
    leaf_request = next(r for _, r in log if getattr(r, "step", "") == "leaf")
    assert json.loads(leaf_request.json_schema)["$defs"]["Statement"]["properties"]["support_passages"]["items"] == {
        "maximum": 0, "minimum": 0, "type": "integer"}


def test_once_the_main_module_finds_the_information_sufficient_the_answer_is_read_from_it_in_short_form():
    """The 0.5B model's main-module answers were sentences (median 11 words on the calib slice, 24 of 134
    right): by default the main module decides when to stop and the answer is read in the question's form."""
    class Wordy(Script):
        def __call__(self, request, item):
            response = super().__call__(request, item)
            if is_main(request) and '"American"' in response.text:
                return Generation(response.text.replace('"American"', '"The director of Levity is American."'))
            return response

    log = []
    done, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", Wordy(), log=log)
    assert (done.answer, done.resolved_by) == ("American", "answered")
    assert log[-1][1].step == "final" and trace(item)["iterations"][-1]["final"] == "American"
    assert trace(item)["iterations"][-1]["answer"] == "The director of Levity is American."
    done, _ = drive(MIGRES(MigresConfig(answer_step="main")), "What nationality is the director of Levity?", Wordy())
    assert (done.answer, done.resolved_by) == ("The director of Levity is American.", "answered")


@pytest.mark.parametrize("read", ["```\n```", "Answer:\n", ""])
def test_a_closing_read_that_cleans_to_nothing_leaves_the_main_modules_answer(read):
    """The main module had answered "American" and the read of the information wrote a bare fence: the row
    answered "" as "answered"."""
    class Blank(Script):
        def __call__(self, request, item):
            return Generation(read) if request.step == "final" else super().__call__(request, item)

    done, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", Blank())
    assert (done.answer, done.resolved_by) == ("American", "answered")
    last = trace(item)["iterations"][-1]
    assert (last["answer"], last["final"], last["fallback"]) == ("American", read, "main")
    done, item = drive(MIGRES(MigresConfig()), "What nationality is the director of Levity?", Script())
    assert "fallback" not in trace(item)["iterations"][-1]  # a read that answered is the answer


def test_a_statement_citing_passages_in_another_shape_is_read_and_a_bad_one_skipped():
    """support_passages 0 (not [0]) or [[0]] raised TypeError: the question became an error row."""
    script = Script()

    def respond(request, item):
        if isinstance(request, Generate) and request.step == "leaf" and "directed by" in request.messages[-1][1]:
            return Generation(json.dumps({"useful_information": [
                {"info": "Levity was directed by Ed Solomon.", "support_passages": 0},
                {"info": "Nested.", "support_passages": [[0]]}, {"info": "Flag.", "support_passages": True}]}), 100, 20)
        return script(request, item)
    done, item = drive(MIGRES(MigresConfig(max_iterations=2)), "What nationality is the director of Levity?", respond)
    assert [i["info"] for i in trace(item)["information"]] == ["Levity was directed by Ed Solomon.", "Ed Solomon is American."]
    assert [e["info"] for e in trace(item)["iterations"][0]["extracted"]] == ["Levity was directed by Ed Solomon."]
    assert done.answer == "American"


def test_a_query_that_differs_from_an_earlier_one_only_in_case_or_punctuation_is_not_new():
    """"Who directed Levity" after "Who directed Levity?" cost a whole iteration (retrieve, rank, leaf, main)."""
    script = Script(extract=False, queries=("who directed  Levity",), retrieve=lambda q: [FILM])
    done, item = drive(MIGRES(MigresConfig()), "Who directed Levity?", script)
    assert history(item) == ["Who directed Levity?", "The nationality of Ed Solomon"]
    assert done.resolved_by == "no_new_query"


class MainSays(Script):
    """The main module answers ``said`` every time."""

    def __init__(self, said, **kw):
        super().__init__(**kw)
        self.said = said

    def __call__(self, request, item):
        if is_main(request):
            self.main_prompts.append(request.messages[-1][1])
            return Generation(json.dumps({"answer": self.said, "confidence": 4, "explanation": "",
                                          "missing_information": "The nationality of Ed Solomon"}))
        return super().__call__(request, item)


def test_a_main_answer_that_cleans_to_nothing_is_not_an_answer():
    """With answer_step main, "```" was accepted (not blank) and returned cleaned: an empty answer, "answered"."""
    for said in ("```", "Answer:"):
        done, item = drive(MIGRES(MigresConfig(answer_step="main", max_iterations=2)), "Who directed Levity?",
                           MainSays(said, extract=False))
        assert done.resolved_by != "answered" and done.answer.strip()
        assert [it["answer"] for it in trace(item)["iterations"]] == [said, said]


def test_a_main_answer_naming_a_choice_in_other_words_is_that_choice_and_symbols_make_another_query():
    """"Yes." from a server that ignores the schema is yes (as the endpoint replica reads a judgment); and
    "C#" after "C++" is a new query, though their words are the same."""
    item = Item("Were Levity and Ed Solomon both American?", kind="yes-no")
    done, item = drive_item(MIGRES(MigresConfig(answer_step="main")), item, MainSays("Yes.", extract=False))
    assert (done.answer, done.resolved_by) == ("yes", "answered")
    script = Script(extract=False, queries=("Who created C#",), retrieve=lambda q: [FILM])
    _, item = drive(MIGRES(MigresConfig(max_iterations=2)), "Who created C++?", script)
    assert history(item) == ["Who created C++?", "Who created C#"]


def test_a_main_answer_outside_a_closed_forms_choices_is_unparsed_not_the_answer():
    """A server that ignores the schema's enum: "[99]" became a yes/no question's answer."""
    script = MainSays("[99]", extract=False)
    item = Item("Were Levity and Ed Solomon both American?", kind="yes-no")
    done, item = drive_item(MIGRES(MigresConfig(answer_step="main", max_iterations=1)), item, script)
    assert (done.answer, done.resolved_by) == ("no", "max_iterations")
    assert item.counts["parse_failures"] == 2  # asked again with more tokens, then unanswerable
