"""Self-Reasoning (Xia et al.): one structured trajectory per question over the top-k passages.

    RAP  relevant (bool) + relevant_reason              is the evidence about the question?
    EAP  cite_list: [{cite_index, cite_content, cite_reason}]   which passages, and why
    TAP  analysis (long answer with [n] citations) + answer (<= 10 words)

The paper fine-tunes a model to write this trajectory; here the prompt is its GPT-4 instruction
(Appendix, Figures 5 and 6) and vLLM decodes it under a JSON schema. Irrelevant evidence -> the
answer comes from the model's own knowledge (``resolved_by=internal_knowledge``). FEVER-style claims
(``kind=claim``) use the fact-verification variant. A trajectory that does not parse is retried once
with twice the tokens; then the fallback is a plain read of the same passages (for a claim, a judgment
among the three verdicts, so that a claim never gets a free-text answer).
"""

from __future__ import annotations

import json
import re

from jobs.strategies.base import (Ask, Done, Item, answer_messages, ask, clean_answer, format_passages,
                                  parse_failed, prompt)
from jobs.strategies.parsing import parse_json_object
from schemas.config import SelfReasoningConfig
from schemas.records import Generate, Judge, Judgment, Retrieve

VERDICTS = {"SUPPORT": "SUPPORTS", "REFUTE": "REFUTES", "NOT ENOUGH INFO": "NOT ENOUGH INFO"}
_CITE = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


def verdict(said: str) -> str:
    """The model's SUPPORT / REFUTE / NOT ENOUGH INFO as FEVER's label (unknown text is kept as said)."""
    return VERDICTS.get(said.strip().upper(), said)


def trajectory_prompt(question: str, passages, claim: bool) -> str:
    """The instruction a trajectory is written to (also the prompt of its training label)."""
    return prompt("selfreason_fever" if claim else "selfreason_qa").format(
        passages=format_passages(passages), question=question)


def trajectory_schema(k: int, claim: bool) -> str:
    answer = {"type": "string", "enum": list(VERDICTS)} if claim else {"type": "string"}
    cite = {"type": "object", "required": ["cite_index", "cite_content", "cite_reason"], "properties": {
        "cite_index": {"type": "integer", "minimum": 1, "maximum": k},
        "cite_content": {"type": "string"}, "cite_reason": {"type": "string"}}}
    return json.dumps({"type": "object", "required": ["relevant", "relevant_reason", "cite_list", "analysis", "answer"],
                       "properties": {"relevant": {"type": "boolean"}, "relevant_reason": {"type": "string"},
                                      "cite_list": {"type": "array", "items": cite, "maxItems": k},
                                      "analysis": {"type": "string"}, "answer": answer}}, sort_keys=True)


class SelfReasoning:
    name = "self_reasoning"
    stages = frozenset({"generator", "judge", "retriever"})

    def __init__(self, config: SelfReasoningConfig):
        self.config = config

    def start(self, item: Item) -> Ask:
        return ask(item, "retrieve", [Retrieve(item.question, self.config.k)])

    def resume(self, item: Item, responses):
        (response,) = responses
        if response.error:
            return Done("", "error", error=response.error)
        return getattr(self, "_after_" + item.state["phase"])(item, response)

    def _after_retrieve(self, item, retrieval):
        item.passages = retrieval.passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in retrieval.passages]})
        return self._trajectory(item, self.config.max_tokens)

    def _trajectory(self, item, max_tokens):
        claim = item.kind == "claim"
        user = trajectory_prompt(item.question, item.passages, claim)
        return ask(item, "trajectory", [Generate(answer_messages(user, system=None), max_tokens=max_tokens,
                                                 json_schema=trajectory_schema(max(1, len(item.passages)), claim))])

    def _after_trajectory(self, item, gen):
        t = parse_json_object(gen.text)
        answer = t.get("answer") if t else None
        if not isinstance(answer, str) or not answer.strip():
            if parse_failed(item, "trajectory", gen.text):
                return self._trajectory(item, 2 * self.config.max_tokens)
            item.trace.append({"step": "trajectory", "parsed": False, "output": gen.text})
            return self._read(item)
        relevant = t.get("relevant") is not False
        cited = self._citations(item, t) if relevant else []
        item.trace.append({"step": "trajectory", "relevant": relevant, "relevant_reason": t.get("relevant_reason"),
                           "cite_list": t.get("cite_list"), "analysis": t.get("analysis"), "answer": answer})
        answer = verdict(answer) if item.kind == "claim" else clean_answer(answer)
        return Done(answer, "passages" if relevant else "internal_knowledge", cited)

    def _citations(self, item, t) -> list[str]:
        """Passage ids cited in cite_list or as [n] in the analysis, in order, valid indices only."""
        indices = [c.get("cite_index") for c in t.get("cite_list") or [] if isinstance(c, dict)]
        for group in _CITE.findall(str(t.get("analysis") or "")):
            indices += [int(n) for n in group.split(",")]
        ids = []
        for n in indices:
            if isinstance(n, int) and 1 <= n <= len(item.passages) and item.passages[n - 1].id not in ids:
                ids.append(item.passages[n - 1].id)
        return ids

    def _read(self, item):
        passages = format_passages(item.passages)
        if item.kind == "claim":
            user = prompt("selfreason_fever_read").format(passages=passages, question=item.question)
            return ask(item, "read", [Judge((("user", user),), tuple(VERDICTS))])
        user = prompt("rag_user").format(passages=passages, question=item.question)
        return ask(item, "read", [Generate(answer_messages(user))])

    def _after_read(self, item, response):
        if isinstance(response, Judgment):
            item.trace.append({"step": "fallback_verdict", "label": response.label, "probs": response.probs})
            answer = verdict(response.label)
        else:
            item.trace.append({"step": "fallback_read", "output": response.text})
            answer = clean_answer(response.text)
        return Done(answer, "fallback", [p.id for p in item.passages])
