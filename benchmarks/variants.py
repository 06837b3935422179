"""What the answer-variant scripts share (prompt_variants, migres_answer_variants,
self_reasoning_variants): their arguments, the evidence of an earlier run, one in-process generator,
and scoring as ``ragsift evaluate`` scores. For choosing on a calibration slice, never a reported one."""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parser(doc: str, run_flag: str, run_help: str, evidence_required: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", required=True)
    p.add_argument(run_flag, required=evidence_required, help=run_help)
    p.add_argument("--corpus", required=evidence_required)
    p.add_argument("--generator", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--out")
    p.add_argument("--variants", help="comma-separated names (default: all)")
    return p


def taken_ids(*slices: str) -> set[str]:
    """Ids of the named DEV slices (``results/slices/<name>.txt``) and of the 200-question sample:
    the questions a new tuning slice or few-shot example must not come from."""
    import pyarrow.parquet as pq

    ids = {line for name in slices for line in (ROOT / "results/slices" / f"{name}.txt").read_text().split()}
    return ids | set(pq.read_table(ROOT / "data/demo/sample_questions.parquet", columns=["id"])["id"].to_pylist())


def passages(corpus: str, ids) -> dict:
    """Passage records of ``ids`` from the corpus Parquet, by id."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from schemas.records import Passage

    table = pq.read_table(corpus, columns=["id", "title", "text"])
    table = table.filter(pc.is_in(table["id"], value_set=pa.array(sorted(set(ids)))))
    return {r["id"]: Passage(r["id"], r["title"] or "", r["text"], 0.0) for r in table.to_pylist()}


def generator(model: str):
    """The generator actor's own class, in this process: the same templating, sampling and choices."""
    from actors.generator import Generator
    from jobs.pools import llm_settings
    from schemas.config import LLMConfig, SamplingConfig

    return Generator(llm_settings(LLMConfig(model=model)), SamplingConfig().model_dump())


def score(answers: list[str], questions: list[dict], verdicts: tuple[str, ...] | None = None) -> dict[str, float]:
    """EM, F1 and accuracy (gold contained) in percent over the questions with a gold answer, as
    ``ragsift evaluate``: a gold among ``verdicts`` (the claim labels the answers are in; the default
    answer_form's, as evaluate's outside a run) is matched as a label."""
    from jobs import metrics as M
    from schemas.config import AnswerFormConfig

    verdicts = tuple(AnswerFormConfig().verdicts) if verdicts is None else verdicts
    s = {"EM": 0.0, "F1": 0.0, "acc": 0.0}
    scored = [(answer, q["answers"]) for answer, q in zip(answers, questions) if M.gold_answers(q["answers"])]
    for answer, gold in scored:
        s["EM"] += M.exact_match(answer, gold)
        s["F1"] += M.f1(answer, gold)
        s["acc"] += M.accuracy(answer, gold, verdicts)
    return {k: round(100 * v / max(len(scored), 1), 1) for k, v in s.items()}
