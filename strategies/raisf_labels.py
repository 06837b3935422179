"""RA-ISF's training-data collection (Liu et al., Appendix A) as a strategy: the labels for the three
judge models, from one pass of the model over a question.

    A.1 M_know   the model answers closed-book; ``ragsift label`` compares with the gold answer
                 (same -> know, else unknown)
    A.2 M_rel    retrieve k passages; the model judges each one relevant / irrelevant
    A.3 M_decom  "Please break down this question into several sub-questions and list them"

The closed-book answer, the decomposition and the retrieval are asked for together; the relevance
judgments follow. The final answer is the closed-book one; the labels are in the trace.
"""

from __future__ import annotations

from engine.steps import Done, Item
from schemas.config import AnswerFormConfig
from schemas.records import Generate, Retrieve
from strategies.base import Lenient, Routine, Solve, answer_messages, passes, prompt
from strategies.forms import answered, final_request, form_of
from strategies.parsing import parse_string_list, string_list_schema
from strategies.raisf import DECOMPOSE_TOKENS, RaisfConfig, judge_request, p_yes


class RaisfLabels(Routine):
    name = "raisf_labels"
    answers = False  # its answers are labels: `ragsift label`, not `compare`

    def __init__(self, config: RaisfConfig, forms: AnswerFormConfig | None = None,
                 collect=("self_knowledge", "relevance", "decomposition")):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.collect = set(collect)
        self.decompose_schema = string_list_schema("sub_questions", config.max_subquestions)
        self.stages = frozenset({"generator"} | ({"judge", "retriever"} if "relevance" in self.collect else set()))

    @classmethod
    def from_run(cls, run) -> RaisfLabels:
        return cls(run.raisf, run.answer_form, run.label.collect)

    def solve(self, item: Item) -> Solve:
        """The closed-book answer always (the answer of the row); retrieval and decomposition when collected,
        asked together; then a relevance judgment per passage. A failed retrieval, decomposition or
        judgment is a missing label, not a failed row."""
        form = form_of(item, self.forms)
        requests = [final_request(prompt("raisf/answer").format(question=item.question), form, self.forms,
                                  step="closed_book")]
        if "relevance" in self.collect:
            requests.append(Retrieve(item.question, self.config.k))
        if "decomposition" in self.collect:
            requests.append(Generate(answer_messages(prompt("raisf/decompose").format(question=item.question),
                                                     system=None),
                                     max_tokens=DECOMPOSE_TOKENS, json_schema=self.decompose_schema, step="decompose"))
        responses = yield Lenient(requests)
        closed, rest = responses[0], iter(responses[1:])
        retrieval = next(rest) if "relevance" in self.collect else None
        decomposed = next(rest) if "decomposition" in self.collect else None
        if closed.error:
            return Done("", "error", error=closed.error)
        answer = answered(item, "closed_book", closed, form, self.forms)
        if decomposed is not None and not decomposed.error:
            subs, ok = parse_string_list(decomposed.text, "sub_questions", self.config.max_subquestions,
                                         besides=item.question)  # as RA-ISF decomposes: a copy takes no one's place
            if not ok:
                item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
            item.trace.append({"step": "decompose", "sub_questions": subs, "parsed": ok})
        if retrieval is None:
            return Done(answer, "labels")
        if retrieval.error or not retrieval.passages:
            item.trace.append({"step": "retrieve", "ids": [], "error": retrieval.error})
            return Done(answer, "labels")
        item.passages = retrieval.passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in retrieval.passages]})
        judgments = yield Lenient([judge_request(prompt("raisf/relevance").format(
            question=item.question, passage=p.shown), "relevance") for p in retrieval.passages])
        # a failed judgment is no label: None, skipped by the label job; cut unrounded, as RA-ISF cuts it (0.49996
        # rounded passed a 0.5 cut RA-ISF's judge would not)
        scores = [None if j.error else p_yes(j, self.config.judge_by) for j in judgments]
        item.trace.append({"step": "relevance", "p_yes": [None if p is None else round(p, 4) for p in scores],
                           "relevant": [None if p is None else passes(p, self.config.relevance_threshold) for p in scores]})
        return Done(answer, "labels")
