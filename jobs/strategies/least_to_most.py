"""Least-to-most prompting (Zhou et al., 2022), closed-book baseline: decompose the question into
ordered sub-questions, answer them one after another with the earlier question/answer pairs in the
prompt, then answer the question itself with all of them."""

from __future__ import annotations

from jobs.strategies.base import Ask, Done, Item, answer_messages, ask, clean_answer, parse_failed, prompt
from jobs.strategies.parsing import parse_string_list, string_list_schema
from schemas.config import LeastToMostConfig
from schemas.records import Generate


class LeastToMost:
    name = "least_to_most"
    stages = frozenset({"generator"})

    def __init__(self, config: LeastToMostConfig):
        self.config = config
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
            answer = clean_answer(gen.text)
            item.trace.append({"step": item.state["phase"], "output": gen.text})
            if item.state["phase"] == "final":
                return Done(answer, "decomposition" if item.state["pairs"] else "closed_book")
            item.state["pairs"].append((item.state["subs"][len(item.state["pairs"])], answer))
        pairs, subs = item.state["pairs"], item.state["subs"]
        if len(pairs) < len(subs):
            return Ask([self._step(pairs, subs[len(pairs)])])
        return ask(item, "final", [self._step(pairs, item.question)])

    def _step(self, pairs, question) -> Generate:
        solved = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in pairs)
        return Generate(answer_messages(prompt("ltm_step").format(solved=solved, question=question)))
