"""``ragsift label``: bulk training data for judge models, from one answer run.

RA-ISF Appendix A, one pass of the model per question (strategy ``raisf_labels``):
  self_knowledge   closed-book answer vs gold -> know / unknown            (M_know)
  relevance        (question, retrieved passage) -> relevant / irrelevant  (M_rel)
  decomposition    question -> sub-questions                               (M_decom)
Self-Reasoning's quality control (strategy ``self_reasoning``): a trajectory is kept only when its
final answer is correct (optionally also its citations, ``label.citation_filter``).

Written to ``<output>/labels/<kind>.parquet`` and ``<kind>.jsonl`` in chat format
(``{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}``, the prompts the strategies
use), ready for common fine-tuning tools, and as a dataset ready to publish with its card
(``<output>/labels/dataset``, jobs/dataset_card.py); the answers stay under ``<output>/<strategy>/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs import answer as answer_job
from jobs import metrics as M
from jobs.dataset_card import check_hub_repo, push_to_hub, write_dataset
from jobs.evaluate import answer_files
from jobs.index import read_manifest
from jobs.questions import by_first_id, gold_ids, question_columns
from jobs.storage import filesystem, join, read_table, redact
from schemas.config import AnswerFormConfig, LabelConfig
from schemas.errors import UserError
from schemas.records import Passage
from schemas.tables import LABELS
from strategies.base import Item, clean_answer, prompt
from strategies.forms import VERDICT, form_of
from strategies.self_reasoning import trajectory_prompt, verdict

LABEL_STRATEGIES = ("raisf_labels", "self_reasoning")


def _chat(user: str, assistant: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def _correct(prediction: str, golds: list[str], match: str) -> bool:
    return bool(golds) and bool((M.exact_match if match == "exact" else M.accuracy)(prediction or "", golds))


def _steps(row: dict) -> dict[str, dict]:
    return {t["step"]: t for t in json.loads(row["trace"] or "[]") if "step" in t}


def raisf_labels(rows: list[dict], gold: dict[str, dict], passages: dict[str, Passage], config: LabelConfig) -> dict:
    """Label records (each with chat ``messages``) from ``raisf_labels`` answer rows."""
    out = {"self_knowledge": [], "relevance": [], "decomposition": []}
    for row in rows:
        if row["error"]:
            continue
        q, steps = row["question"], _steps(row)
        golds = M.gold_answers((gold.get(row["id"]) or {}).get("answers"))
        if golds:
            know = _correct(row["answer"], golds, config.match)
            out["self_knowledge"].append({
                "id": row["id"], "question": q, "closed_book_answer": row["answer"], "gold_answers": golds,
                "label": "know" if know else "unknown",
                "messages": _chat(prompt("raisf/know").format(question=q), "yes" if know else "no")})
        relevance = steps.get("relevance")
        if relevance:
            for pid, p_yes, relevant in zip(steps["retrieve"]["ids"], relevance["p_yes"], relevance["relevant"]):
                if pid not in passages or p_yes is None:
                    continue
                text = passages[pid].shown
                out["relevance"].append({
                    "id": row["id"], "question": q, "passage_id": pid, "passage": text, "p_yes": p_yes,
                    "label": "relevant" if relevant else "irrelevant",
                    "messages": _chat(prompt("raisf/relevance").format(question=q, passage=text),
                                      "yes" if relevant else "no")})
        decompose = steps.get("decompose")
        if decompose and decompose["parsed"] and decompose["sub_questions"]:
            subs = decompose["sub_questions"]
            out["decomposition"].append({
                "id": row["id"], "question": q, "sub_questions": subs,
                "messages": _chat(prompt("raisf/decompose").format(question=q), json.dumps({"sub_questions": subs}))})
    return out


def self_reasoning_labels(rows: list[dict], gold: dict[str, dict], passages: dict[str, Passage],
                          config: LabelConfig, forms: AnswerFormConfig | None = None,
                          short_answer: str = "no more than 10 words") -> tuple[list[dict], Counter]:
    """Trajectories that pass quality control, and why the others were dropped."""
    kept, dropped, forms = [], Counter(), forms or AnswerFormConfig()
    for row in rows:
        g = gold.get(row["id"]) or {}
        trajectory = _steps(row).get("trajectory")
        if row["error"] or not trajectory or trajectory.get("parsed") is False:
            dropped["no parsed trajectory"] += 1
            continue
        golds = M.gold_answers(g.get("answers"))
        if not golds:
            dropped["no gold answer"] += 1
            continue
        # the trajectory is the training target, so its own answer must be right: under answer_step
        # read / follow_up the row's answer is a later read of it, which can differ either way
        form = form_of(Item(row["question"], kind=g.get("kind"), dataset=g.get("dataset")), forms)
        said = str(trajectory.get("answer") or "")
        if not _correct(verdict(said) if form == VERDICT else clean_answer(said), golds, config.match):
            dropped["wrong answer"] += 1
            continue
        gold_pids, cited = set(gold_ids(g.get("gold_passage_ids"))), set(row["citations"] or [])
        precision = len(cited & gold_pids) / len(cited) if gold_pids and cited else None
        recall = len(cited & gold_pids) / len(gold_pids) if gold_pids else None
        if config.citation_filter and gold_pids and (
                (precision or 0) < config.citation_precision_min or recall < config.citation_recall_min):
            dropped["citations under threshold"] += 1
            continue
        evidence = [passages[i] for i in row["retrieved_ids"] if i in passages]
        if len(evidence) < len(row["retrieved_ids"]):
            dropped["passage missing from the index"] += 1
            continue
        target = json.dumps({k: trajectory.get(k) for k in ("relevant", "relevant_reason", "cite_list", "analysis", "answer")})
        user = trajectory_prompt(row["question"], evidence, form, forms, short_answer)
        kept.append({"id": row["id"], "question": row["question"], "passage_ids": row["retrieved_ids"],
                     "trajectory": target, "answer": row["answer"], "gold_answers": golds,
                     "citation_precision": precision, "citation_recall": recall, "messages": _chat(user, target)})
    return kept, dropped


def passages_by_id(index_path: str, ids: set[str]) -> dict[str, Passage]:
    """Title and text of ``ids`` from the index's passage stores (one filtered scan per shard)."""
    found: dict[str, Passage] = {}
    if not ids:
        return found
    wanted = pa.array(sorted(ids))
    for shard in read_manifest(index_path)["shards"]:
        table = read_table(str(Path(index_path) / shard["dir"] / "passages.parquet"), ["id", "title", "text"])
        for r in table.filter(pc.is_in(table["id"], value_set=wanted)).to_pylist():
            found[r["id"]] = Passage(r["id"], r["title"] or "", r["text"], 0.0)
    return found


class LabelWriter:
    """``labels/<kind>.parquet`` (schemas.tables.LABELS) and ``<kind>.jsonl``, written as records come."""

    def __init__(self, output: str, kind: str):
        fs, root = filesystem(output)
        fs.create_dir(f"{root}/labels", recursive=True)
        self.schema = LABELS[kind]
        self.parquet = pq.ParquetWriter(f"{root}/labels/{kind}.parquet", self.schema, filesystem=fs)
        self.jsonl = fs.open_output_stream(f"{root}/labels/{kind}.jsonl")
        self.records = 0
        self.labels: Counter = Counter()

    def write(self, records: list[dict]) -> None:
        if not records:
            return
        self.parquet.write_table(pa.Table.from_pylist(records, schema=self.schema))
        self.jsonl.write("".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in records).encode())
        self.records += len(records)
        self.labels.update(r["label"] for r in records if "label" in r)

    def close(self) -> None:
        self.parquet.close()
        self.jsonl.close()


def write_labels(output: str, kind: str, records: list[dict]) -> None:
    writer = LabelWriter(output, kind)
    writer.write(records)
    writer.close()


def answer_chunks(output: str, strategy: str, max_passage_ids: int = 100_000):
    """Answer rows of ``strategy`` in chunks of whole parts, each citing about ``max_passage_ids``
    passages at most (plus one part), so memory stays bounded and a chunk needs one scan of the
    passage stores."""
    chunk, ids = [], set()
    for f in answer_files(join(output, strategy)):
        rows = read_table(f).to_pylist()
        part_ids = {i for r in rows for i in (r["retrieved_ids"] or [])}
        if chunk and len(ids | part_ids) > max_passage_ids:
            yield chunk, ids
            chunk, ids = [], set()
        chunk += rows
        ids |= part_ids
    if chunk:
        yield chunk, ids


def label(config, log=print, force: bool = False) -> dict:
    """Answer with the labelling strategies, then write the label files; returns counts per kind.

    Answers are read in chunks of parts and labels written as they come: memory holds the gold
    answers (id, answers, gold passage ids) and one chunk of answer rows with their passages."""
    cols = question_columns(config.questions)  # a bad gold column fails before the answering, not after
    answer_job.answer(config, log=log, force=force)
    gold = by_first_id(read_table(config.questions, [
        "id", *[c for c in ("answers", "gold_passage_ids", "kind", "dataset") if c in cols]]).to_pylist())
    if "answers" not in cols:
        log("no `answers` column: no self-knowledge labels and no self-reasoning trajectories (both need gold)")
    summary = {}
    if "raisf_labels" in config.strategies:
        writers = {kind: LabelWriter(config.output, kind) for kind in ("self_knowledge", "relevance", "decomposition")}
        for rows, ids in answer_chunks(config.output, "raisf_labels"):
            for kind, records in raisf_labels(rows, gold, passages_by_id(config.index.path, ids), config.label).items():
                writers[kind].write(records)
        for kind, writer in writers.items():
            writer.close()
            summary[kind] = {"records": writer.records, **writer.labels}
    if "self_reasoning" in config.strategies:
        writer, dropped, seen = LabelWriter(config.output, "self_reasoning"), Counter(), 0
        for rows, ids in answer_chunks(config.output, "self_reasoning"):
            kept, why = self_reasoning_labels(rows, gold, passages_by_id(config.index.path, ids), config.label,
                                              config.answer_form, config.self_reasoning.short_answer)
            writer.write(kept)
            dropped.update(why)
            seen += len(rows)
        writer.close()
        summary["self_reasoning"] = {"records": writer.records, "of": seen, "dropped": dict(dropped)}
    fs, root = filesystem(config.output)
    with fs.open_output_stream(f"{root}/labels/summary.json") as f:
        f.write(json.dumps(summary, indent=2).encode())
    log(f"dataset ready to publish: {redact(write_dataset(config.output, summary, config))} (card: README.md)")
    return summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    answer_job.add_arguments(p, retry_errors=False)
    p.add_argument("--push-to-hub", metavar="REPO",
                   help="upload <output>/labels/dataset as a Hugging Face dataset repository (needs a hub login)")


def run(args: argparse.Namespace) -> int:
    config = answer_job.config_from_args(args, default_strategies=LABEL_STRATEGIES)
    other = [s for s in config.strategies if s not in LABEL_STRATEGIES]
    if other:
        raise UserError(f"label runs {list(LABEL_STRATEGIES)} (or one of them), not {other}")
    if args.push_to_hub is not None:
        check_hub_repo(args.push_to_hub)
    summary = label(config, log=lambda *a: print(*a, file=sys.stderr), force=args.force)
    print(json.dumps(summary, indent=2))
    print(f"wrote {config.output}/labels/<kind>.parquet and .jsonl, and labels/dataset/", file=sys.stderr)
    if args.push_to_hub:
        push_to_hub(str(Path(filesystem(config.output)[1]) / "labels" / "dataset"), args.push_to_hub)
        print(f"pushed labels/dataset to the hub as {args.push_to_hub}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("label", argv)


if __name__ == "__main__":
    sys.exit(main())
