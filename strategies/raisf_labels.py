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

from strategies.base import Done, Item, answer_messages, ask, prompt
from strategies.forms import final_answer, final_request, form_of, response_text
from strategies.parsing import parse_string_list, string_list_schema
from strategies.raisf import DECOMPOSE_TOKENS, judge_request, p_yes
from schemas.config import AnswerFormConfig, RaisfConfig
from schemas.records import Generate, Retrieve


class RaisfLabels:
    name = "raisf_labels"
    def __init__(self, config: RaisfConfig, forms: AnswerFormConfig | None = None,
                 collect=("self_knowledge", "relevance", "decomposition")):
        self.config = config
        self.forms = forms or AnswerFormConfig()
        self.collect = set(collect)
        self.decompose_schema = string_list_schema("sub_questions", config.max_subquestions)
        self.stages = frozenset({"generator"} | ({"judge", "retriever"} if "relevance" in self.collect else set()))

    def start(self, item: Item):
        """The closed-book answer always (the answer of the row); retrieval and decomposition when collected."""
        requests = [final_request(prompt("raisf_answer").format(question=item.question), form_of(item, self.forms),
                                  self.forms)]
        if "relevance" in self.collect:
            requests.append(Retrieve(item.question, self.config.k))
        if "decomposition" in self.collect:
            requests.append(Generate(answer_messages(prompt("raisf_decompose").format(question=item.question),
                                                     system=None),
                                     max_tokens=DECOMPOSE_TOKENS, json_schema=self.decompose_schema))
        return ask(item, "collect", requests)

    def resume(self, item: Item, responses):
        return getattr(self, "_after_" + item.state["phase"])(item, responses)

    def _after_collect(self, item, responses):
        closed, rest = responses[0], iter(responses[1:])
        retrieval = next(rest) if "relevance" in self.collect else None
        decomposed = next(rest) if "decomposition" in self.collect else None
        if closed.error:
            return Done("", "error", error=closed.error)
        item.state["answer"] = final_answer(closed)
        item.trace.append({"step": "closed_book", "output": response_text(closed)})
        if decomposed is not None and not decomposed.error:
            subs, ok = parse_string_list(decomposed.text, "sub_questions", self.config.max_subquestions)
            if not ok:
                item.counts["parse_failures"] = item.counts.get("parse_failures", 0) + 1
            item.trace.append({"step": "decompose", "sub_questions": subs, "parsed": ok})
        if retrieval is None:
            return self._done(item)
        if retrieval.error or not retrieval.passages:
            item.trace.append({"step": "retrieve", "ids": [], "error": retrieval.error})
            return self._done(item)
        item.passages = retrieval.passages
        item.trace.append({"step": "retrieve", "ids": [p.id for p in retrieval.passages]})
        return ask(item, "relevance", [
            judge_request(prompt("raisf_relevance").format(question=item.question, passage=f"{p.title}: {p.text}"))
            for p in retrieval.passages])

    def _after_relevance(self, item, judgments):
        # a failed judgment is no label: None, skipped by the label job
        scores = [None if j.error else round(p_yes(j, self.config.judge_by), 4) for j in judgments]
        item.trace.append({"step": "relevance", "p_yes": scores,
                           "relevant": [None if p is None else p >= self.config.relevance_threshold for p in scores]})
        return self._done(item)

    def _done(self, item):
        return Done(item.state["answer"], "labels")
