"""Self-Reasoning (Xia et al.): one structured trajectory per question over the top-k passages.

    RAP  relevant (bool) + relevant_reason              is the evidence about the question?
    EAP  cite_list: [{cite_index, cite_content, cite_reason}]   which passages, and why
    TAP  analysis (long answer with [n] citations) + answer (<= 10 words)

The paper fine-tunes a model to write this trajectory; here the prompt is its GPT-4 instruction
(Appendix, Figures 5 and 6) and vLLM decodes it under a JSON schema whose fields are in that order
(relevance, then evidence, then analysis, then the answer: the model reasons before it answers).
What the trajectory may copy is bounded (``self_reasoning.max_citations``, ``*_chars``): an untuned
model otherwise spends its tokens copying whole passages into the quotes and the analysis and never
reaches the answer; a trajectory past a bound (a server that does not enforce the schema) is cut to it,
not rejected. The answer is in the question's form (forms.py): yes / no, a verdict for
``kind=claim`` (the fact-verification variant), else a short answer. Irrelevant evidence -> the
answer comes from the model's own knowledge (``resolved_by=internal_knowledge``). The untuned 0.5B
model writes sentences in the short ``answer`` field (median 11 words on the calib slice), so by
default (``answer_step: read``) the short answer is then read from the trajectory's analysis and
answer in the question's form (EM 16.9 -> 27.7 on calib, results/README.md). ``answer_step:
follow_up`` asks for it as the next turn of the trajectory's conversation instead, so the passages
are in view as in the paper (not the default: level on F1 with ``read`` for the 1.5B model, at 1.65x
the tokens). A trajectory that does not parse is retried once with twice the tokens; then the
fallback is a plain read of the same passages, in the same form.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, create_model

from engine.steps import Done, Item
from schemas.config import AnswerFormConfig, Section
from schemas.records import Generate, Retrieve
from strategies.base import (
    Routine,
    Solve,
    answer_messages,
    clean_answer,
    format_passages,
    prompt,
    structured,
)
from strategies.forms import (
    VERDICT,
    YES_NO_FORMS,
    answered,
    choices,
    final_request,
    form_of,
)
from strategies.structured import parse_as, schema_of


class SelfReasoningConfig(Section):
    """Self-Reasoning (Xia et al.): one JSON trajectory (relevance, cited evidence, analysis, answer)."""

    k: int = Field(5, ge=1, description="passages in the trajectory's evidence (the paper: top 5)")
    max_tokens: int = Field(512, ge=32, description="tokens for the trajectory; doubled on the one retry")
    # What the trajectory may copy (the schema's maxItems / maxLength): an untuned model otherwise
    # copies whole passages into quotes and analysis and runs out of tokens before the answer.
    max_citations: int = Field(3, ge=1, description="entries of cite_list (at most k)")
    quote_chars: int = Field(200, ge=1, description="characters of one cite_content")
    reason_chars: int = Field(150, ge=1, description="characters of relevant_reason and of one cite_reason")
    analysis_chars: int = Field(500, ge=1, description="characters of the analysis (the long answer)")
    answer_chars: int = Field(80, ge=1, description="characters of a short answer (the paper: <= 10 words)")
    short_answer: str = Field("no more than 10 words", description="how the instruction describes the short "
                              "answer (the paper's words); changes results")
    answer_step: Literal["read", "follow_up", "trajectory"] = Field(
        "read", description="read: a short answer read from the trajectory's analysis and answer (one short "
        "generation more; a yes/no question or a claim keeps the trajectory's answer, a guided choice already); "
        "follow_up: the short answer asked as the next turn of "
        "the trajectory's conversation, so it sees the passages as well as the analysis (one short "
        "generation more, whose prompt repeats the trajectory's); trajectory: the trajectory's own short "
        "answer (the paper). Changes results: results/README.md")


# the paper's verdict words and FEVER's labels
VERDICTS = {"SUPPORT": "SUPPORTS", "REFUTE": "REFUTES", "NOT ENOUGH INFO": "NOT ENOUGH INFO"}
_PAPER_WORD = {label: word for word, label in VERDICTS.items()}
_CITE = re.compile(r"\[(\d+(?:\s*[,\-–]\s*\d+)*)\]")  # [2], [1, 3], [1-3]


def paper_word(label: str) -> str:
    """The word a trajectory writes for a verdict label (FEVER's SUPPORTS -> the paper's SUPPORT)."""
    return _PAPER_WORD.get(label.upper(), label)


def verdict(said: str, labels: list[str] | tuple[str, ...] = tuple(VERDICTS.values())) -> str:
    """The verdict ``said`` (a paper word or a label, any case) as the one of ``labels`` (the configured
    ``answer_form.verdicts``) it names; text that names none is kept as said. FEVER's labels were written
    whatever the labels were: a SciFact run's SUPPORT came back as SUPPORTS and scored 0."""
    word = said.strip().upper()
    for label in labels:
        if word in (label.upper(), paper_word(label).upper()):
            return label
    return said


def trajectory_prompt(question: str, passages, form: str, forms: AnswerFormConfig,
                      short_answer: str = "no more than 10 words") -> str:
    """The instruction a trajectory is written to (also the prompt of its training label)."""
    if form == VERDICT:
        words = [paper_word(v) for v in forms.verdicts]
        nei = any(w.upper() == "NOT ENOUGH INFO" for w in words)
        return prompt("self_reasoning/fever").format(passages=format_passages(passages), question=question,
                                                 verdicts=" / ".join(words),
                                                 not_enough=prompt("self_reasoning/fever_nei" if nei
                                                                   else "self_reasoning/fever_decide"))
    answer = "yes or no" if form in YES_NO_FORMS else short_answer
    return prompt("self_reasoning/qa").format(passages=format_passages(passages), question=question, answer=answer)


def trajectory_model(k: int, answers: tuple[str, ...] | None, config: SelfReasoningConfig) -> type[BaseModel]:
    """The trajectory as a pydantic model, fields in the paper's order (RAP, EAP, TAP)."""
    reason = Annotated[str, Field(max_length=config.reason_chars)]
    citation = create_model("Citation", cite_index=(int, Field(ge=1, le=k)),
                            cite_content=(str, Field(max_length=config.quote_chars)), cite_reason=(reason, ...))
    answer = Literal[answers] if answers else Annotated[str, Field(max_length=config.answer_chars)]
    return create_model("Trajectory", relevant=(bool, ...), relevant_reason=(reason, ...),
                        cite_list=(list[citation], Field(max_length=min(k, config.max_citations))),
                        analysis=(str, Field(max_length=config.analysis_chars)), answer=(answer, ...))


def within_bounds(obj: dict, k: int, config: SelfReasoningConfig, model: type[BaseModel] | None = None) -> dict:
    """A trajectory within its schema's bounds, which a server that does not enforce maxLength, maxItems or
    minimum lets a model pass (pydantic would reject the whole trajectory, its answer too, for one field): strings
    cut to their length, citations of no passage shown dropped, the citations cut to max_citations. The answer
    is cut only where it is free text (``model``'s answer has a max_length; without a model, answer_chars): a
    choice (a verdict, yes / no) cut is no choice."""
    def cut(value, n):
        return value[:n] if isinstance(value, str) and n is not None else value

    cites = obj.get("cite_list")
    if isinstance(cites, list):
        shown = []
        for c in cites:
            if isinstance(c, dict):
                index = _index(c.get("cite_index"))
                if index is None or not 1 <= index <= k:  # no passage shown, or no number
                    continue
                c = {**c, "cite_index": index}
            shown.append(c)
        cites = [{**c, "cite_content": cut(c.get("cite_content"), config.quote_chars),
                  "cite_reason": cut(c.get("cite_reason"), config.reason_chars)} if isinstance(c, dict) else c
                 for c in shown[:min(k, config.max_citations)]]
    answer_chars = config.answer_chars if model is None else _max_length(model, "answer")
    return {**obj, "relevant_reason": cut(obj.get("relevant_reason"), config.reason_chars), "cite_list": cites,
            "analysis": cut(obj.get("analysis"), config.analysis_chars), "answer": cut(obj.get("answer"), answer_chars)}


def _index(value) -> int | None:
    """A citation's passage number as an int: 7, "7" and 7.0 alike; None for what is no whole number."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if isinstance(value, int) or value.is_integer() else None


def _max_length(model: type[BaseModel], field: str) -> int | None:
    return next((m.max_length for m in model.model_fields[field].metadata if getattr(m, "max_length", None)), None)


class SelfReasoning(Routine):
    name = "self_reasoning"
    Config = SelfReasoningConfig
    stages = frozenset({"generator", "retriever"})

    def __init__(self, config: SelfReasoningConfig, forms: AnswerFormConfig | None = None):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self._models: dict[tuple, tuple[type[BaseModel], str]] = {}  # (model, schema) by (k, answers)

    @classmethod
    def from_run(cls, run) -> SelfReasoning:
        return cls(run.self_reasoning, run.answer_form)

    def solve(self, item: Item) -> Solve:
        form = form_of(item, self.forms)
        item.passages = (yield Retrieve(item.question, self.config.k)).passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in item.passages]})
        model, schema = self._model(item, form)
        user = trajectory_prompt(item.question, item.passages, form, self.forms, self.config.short_answer)
        request = Generate(answer_messages(user, system=None), max_tokens=self.config.max_tokens, json_schema=schema,
                           step="trajectory")

        def parse(text):
            t = parse_as(model, text, lambda obj: within_bounds(obj, max(1, len(item.passages)), self.config, model))
            # an answer that cleans to nothing ("```", "Answer:") is no answer: the fallback reads instead
            return t, t is not None and bool(clean_answer(t.answer))

        t, ok, response = yield from structured(item, request, parse, "trajectory")
        if not ok:  # the fallback: a plain read of the same passages, in the same form
            item.trace.append({"step": "trajectory", "parsed": False, "output": response.text})
            name = "self_reasoning/fever_read" if form == VERDICT else "rag/user"
            read = yield final_request(prompt(name).format(passages=format_passages(item.passages),
                                                           question=item.question), form, self.forms, step="fallback_read")
            # a plain read cites nothing: its passages are the retrieval, not citations
            return Done(answered(item, "fallback_read", read, form, self.forms), "fallback")
        cited = self._citations(item, t) if t.relevant else []  # RAP: irrelevant evidence cites nothing
        item.trace.append({"step": "trajectory", **t.model_dump(), "output": response.text})
        answer = verdict(t.answer, self.forms.verdicts) if form == VERDICT else clean_answer(t.answer)
        if self.config.answer_step == "read" and choices(form, self.forms) is None:
            read = yield final_request(prompt("self_reasoning/read_analysis").format(
                analysis=t.analysis, answer=t.answer, question=item.question), form, self.forms, step="read_analysis")
            answer = self._read(item, answered(item, "read_analysis", read, form, self.forms), answer)
        elif self.config.answer_step == "follow_up" and choices(form, self.forms) is None:
            # the same conversation, one turn on: the paper's model writes its short answer with the
            # passages still in view, which the read of the analysis alone does not have
            turn = prompt("self_reasoning/follow_up").format(question=item.question)
            reply = yield Generate(request.messages + (("assistant", response.text), ("user", turn)), step="follow_up")
            item.trace.append({"step": "follow_up", "output": reply.text})
            answer = self._read(item, clean_answer(reply.text), answer)
        # with no passage to read, a "relevant" verdict answers from the model's own knowledge all the same
        return Done(answer, "passages" if t.relevant and item.passages else "internal_knowledge", cited)

    @staticmethod
    def _read(item: Item, read: str, answer: str) -> str:
        """The short answer read, or where it cleans to nothing ("Answer:", "```") the trajectory's own."""
        if not read:
            item.trace[-1]["fallback"] = "trajectory"
        return read or answer

    def _model(self, item: Item, form: str) -> tuple[type[BaseModel], str]:
        answers = choices(form, self.forms)
        if form == VERDICT:
            answers = tuple(paper_word(v) for v in answers)
        key = (max(1, len(item.passages)), answers)
        if key not in self._models:
            model = trajectory_model(*key, self.config)
            self._models[key] = model, schema_of(model)
        return self._models[key]

    def _citations(self, item: Item, t) -> list[str]:
        """Passage ids cited in cite_list or as [n] in the analysis, in order, valid indices only."""
        indices = [c.cite_index for c in t.cite_list]
        for group in _CITE.findall(t.analysis):
            for part in group.split(","):
                ends = [int(n) for n in re.split(r"[-–]", part)]
                if len(ends) == 2 and ends[0] <= ends[-1]:  # a range, cut to the passages shown: "[1-1000000000]"
                    indices += range(max(1, ends[0]), min(len(item.passages), ends[-1]) + 1)
                else:
                    indices += ends
        ids = []
        for n in indices:
            if 1 <= n <= len(item.passages) and item.passages[n - 1].id not in ids:
                ids.append(item.passages[n - 1].id)
        return ids
