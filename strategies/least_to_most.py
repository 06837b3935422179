"""Least-to-most prompting (Zhou et al., 2022), closed-book baseline: decompose the question into
ordered sub-questions, answer them one after another with the earlier question/answer pairs in the
prompt, then answer the question itself with all of them."""

from __future__ import annotations

from strategies.base import Ask, Done, Item, answer_messages, ask, parse_failed, prompt
from strategies.forms import SUB_QUESTION, detected_form, final_answer, final_request, form_of, response_text
from strategies.parsing import parse_string_list, string_list_schema
from schemas.config import AnswerFormConfig, LeastToMostConfig
from schemas.records import Generate


class LeastToMost:
    name = "least_to_most"
    stages = frozenset({"generator"})

    def __init__(self, config: LeastToMostConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.schema = string_list_schema("sub_questions", config.max_subquestions)

    def start(self, item: Item) -> Ask:
        item.state.update(phase="decompose", pairs=[])
        return self._decompose(item, 160)

    def _decompose(self, item: Item, max_tokens: int) -> Ask:
        user = prompt("ltm_decompose").format(question=item.question)
        return Ask([Generate(answer_messages(user, system=None), max_tokens=max_tokens, json_schema=self.schema)])

    def resume(self, item: Item, responses):
        (gen,) = responses
        if gen.error:
            return Done("", "error", error=gen.error)
        if item.state["phase"] == "decompose":
            subs, ok = parse_string_list(gen.text, "sub_questions", self.config.max_subquestions)
            if not ok and parse_failed(item, "decompose", gen.text):
                return self._decompose(item, 320)
            item.trace.append({"step": "decompose", "sub_questions": subs, "parsed": ok})
            item.state.update(phase="solve", subs=subs)
            item.counts["subquestions"] = len(subs)
        else:
            answer = final_answer(gen)
            item.trace.append({"step": item.state["phase"], "output": response_text(gen)})
            if item.state["phase"] == "final":
                return Done(answer, "decomposition" if item.state["pairs"] else "closed_book")
            item.state["pairs"].append((item.state["subs"][len(item.state["pairs"])], answer))
        pairs, subs = item.state["pairs"], item.state["subs"]
        if len(pairs) < len(subs):
            sub = subs[len(pairs)]
            return Ask([self._step(pairs, sub, detected_form(sub, SUB_QUESTION, self.forms))])
        return ask(item, "final", [self._step(pairs, item.question, form_of(item, self.forms))])

    def _step(self, pairs, question, form):
        solved = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in pairs)
        return final_request(prompt("ltm_step").format(solved=solved, question=question), form, self.forms)
