"""Least-to-most prompting (Zhou et al., 2022), closed-book baseline: decompose the question into
ordered sub-questions, answer them one after another with the earlier question/answer pairs in the
prompt, then answer the question itself with all of them."""

from __future__ import annotations

from pydantic import Field

from engine.steps import Done, Item
from schemas.config import AnswerFormConfig, Section
from schemas.records import Generate
from strategies.base import Routine, Solve, answer_messages, prompt, structured
from strategies.forms import (
    SUB_QUESTION,
    answered,
    detected_form,
    final_request,
    form_of,
)
from strategies.parsing import parse_string_list, string_list_schema


class LeastToMostConfig(Section):
    """Least-to-most prompting (Zhou et al.), closed-book: decompose, solve in order, answer."""

    max_subquestions: int = Field(4, ge=1, description="sub-questions a decomposition may list (the schema's maxItems)")


class LeastToMost(Routine):
    name = "least_to_most"
    Config = LeastToMostConfig
    stages = frozenset({"generator"})

    def __init__(self, config: LeastToMostConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.schema = string_list_schema("sub_questions", config.max_subquestions)

    @classmethod
    def from_run(cls, run) -> LeastToMost:
        return cls(run.least_to_most, run.answer_form)

    def solve(self, item: Item) -> Solve:
        user = prompt("least_to_most/decompose").format(question=item.question)
        request = Generate(answer_messages(user, system=None), max_tokens=160, json_schema=self.schema, step="decompose")
        limit = self.config.max_subquestions  # besides: a copy of the question is its final step, not a sub-question
        subs, ok, _ = yield from structured(
            item, request, lambda text: parse_string_list(text, "sub_questions", limit, besides=item.question), "decompose")
        item.trace.append({"step": "decompose", "sub_questions": subs, "parsed": ok})
        item.counts["subquestions"] = len(subs)
        pairs = []
        for sub in subs:  # each in order, with the pairs solved before it
            answer = yield from self.step(item, pairs, sub, detected_form(sub, SUB_QUESTION, self.forms), "solve")
            pairs.append((sub, answer or "unknown"))  # no answer is shown as RA-ISF and Think-then-Act show it, not blank
        answer = yield from self.step(item, pairs, item.question, form_of(item, self.forms), "final")
        return Done(answer, "decomposition" if pairs else "closed_book")

    def step(self, item: Item, pairs, question: str, form: str, name: str):
        solved = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in pairs)
        response = yield final_request(prompt("least_to_most/step").format(solved=solved, question=question), form, self.forms,
                                       step=name)
        return answered(item, name, response, form, self.forms)
