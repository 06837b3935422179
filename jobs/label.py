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
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs import answer as answer_job
from jobs import metrics as M
from jobs.chunks import passage_of
from jobs.dataset_card import KINDS, check_hub_repo, push_to_hub, write_dataset
from jobs.evaluate import answer_files, reads_split_index
from jobs.index import read_manifest
from jobs.questions import by_first_id, gold_ids, question_columns
from jobs.storage import filesystem, join, read_table, redact, write_whole
from schemas.config import AnswerFormConfig, LabelConfig
from schemas.errors import UserError
from schemas.records import Passage
from schemas.tables import LABELS
from strategies.base import Item, clean_answer, prompt
from strategies.forms import VERDICT, form_of
from strategies.parsing import same_question
from strategies.self_reasoning import trajectory_prompt, verdict

LABEL_STRATEGIES = ("raisf_labels", "self_reasoning")
RAISF_KINDS = ("self_knowledge", "relevance", "decomposition")


def _chat(user: str, assistant: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def _correct(prediction: str, golds: list[str], match: str, verdicts: tuple[str, ...] = ()) -> bool:
    if match == "exact":
        return bool(golds) and bool(M.exact_match(prediction or "", golds))
    return bool(golds) and bool(M.accuracy(prediction or "", golds, verdicts))


def _steps(row: dict) -> dict[str, dict]:
    return {t["step"]: t for t in json.loads(row["trace"] or "[]") if "step" in t}


def raisf_labels(rows: list[dict], gold: dict[str, dict], passages: dict[str, Passage], config: LabelConfig,
                 dropped: dict[str, Counter] | None = None, split: bool = False, verdicts: tuple[str, ...] = ()) -> dict:
    """Label records (each with chat ``messages``) from ``raisf_labels`` answer rows, of the kinds
    ``config.collect`` names; ``dropped`` counts, by kind, why a question gave none. ``verdicts``: the run's claim
    labels (answer_form.verdicts), a gold among them matched as a label ("NOT SUPPORTED" is no "SUPPORTED")."""
    kinds = [k for k in RAISF_KINDS if k in config.collect]
    out: dict[str, list] = {kind: [] for kind in kinds}
    dropped = {kind: Counter() for kind in kinds} if dropped is None else dropped
    for row in rows:
        if row["error"]:  # an error row asked nothing of the model: no label of any kind
            for kind in kinds:
                dropped[kind]["error row"] += 1
            continue
        q, steps = row["question"], _steps(row)
        golds = M.gold_answers((gold.get(row["id"]) or {}).get("answers"))
        if "self_knowledge" in kinds and not golds:
            dropped["self_knowledge"]["no gold answer"] += 1
        elif "self_knowledge" in kinds:
            know = _correct(row["answer"], golds, config.match, verdicts)
            out["self_knowledge"].append({
                "id": row["id"], "question": q, "closed_book_answer": row["answer"], "gold_answers": golds,
                "label": "know" if know else "unknown",
                "messages": _chat(prompt("raisf/know").format(question=q), "yes" if know else "no")})
        relevance = steps.get("relevance")
        if "relevance" in kinds and not relevance:
            dropped["relevance"]["no passage retrieved"] += 1
        elif relevance and "relevance" in kinds:  # (a run collecting self-knowledge alone raised KeyError here)
            # the question's gold passages, where it has some: a retrieved one is gold or not (None: not known)
            golden = set(gold_ids((gold.get(row["id"]) or {}).get("gold_passage_ids"))) or None
            for pid, p_yes, relevant in zip(steps["retrieve"]["ids"], relevance["p_yes"], relevance["relevant"]):
                if pid not in passages or p_yes is None:
                    continue
                text = passages[pid].shown
                out["relevance"].append({
                    "id": row["id"], "question": q, "passage_id": pid, "passage": text, "p_yes": p_yes,
                    "label": "relevant" if relevant else "irrelevant",
                    # a part of a split passage (index.chunk_words) is gold where its passage is
                    "gold_passage": None if golden is None else (passage_of(pid) if split else pid) in golden,
                    "messages": _chat(prompt("raisf/relevance").format(question=q, passage=text),
                                      "yes" if relevant else "no")})
        if "decomposition" in kinds:
            decompose = steps.get("decompose")
            # a sub-question that repeats the question (or an earlier one) is no decomposition: RA-ISF drops
            # it (strategies/raisf.py), so as a training target it would teach M_decom to echo
            subs: list[str] = []
            for sub in (decompose or {}).get("sub_questions") or []:
                if not same_question(sub, q) and not any(same_question(sub, kept) for kept in subs):
                    subs.append(sub)
            if not decompose or not decompose["parsed"]:
                dropped["decomposition"]["no parsed decomposition"] += 1
            elif not subs:
                dropped["decomposition"]["only repeats the question"] += 1
            else:
                out["decomposition"].append({
                    "id": row["id"], "question": q, "sub_questions": subs,
                    "messages": _chat(prompt("raisf/decompose").format(question=q), json.dumps({"sub_questions": subs}))})
    return out


def self_reasoning_labels(rows: list[dict], gold: dict[str, dict], passages: dict[str, Passage],
                          config: LabelConfig, forms: AnswerFormConfig | None = None,
                          short_answer: str = "no more than 10 words", split: bool = False) -> tuple[list[dict], Counter]:
    """Trajectories that pass quality control, and why the others were dropped."""
    kept, dropped, forms = [], Counter(), forms or AnswerFormConfig()
    for row in rows:
        g = gold.get(row["id"]) or {}
        trajectory = _steps(row).get("trajectory")
        if row["error"]:
            dropped["error row"] += 1
            continue
        if not trajectory or trajectory.get("parsed") is False:
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
        if not _correct(verdict(said, forms.verdicts) if form == VERDICT else clean_answer(said), golds, config.match,
                        tuple(forms.verdicts)):
            dropped["wrong answer"] += 1
            continue
        gold_pids, cited = set(gold_ids(g.get("gold_passage_ids"))), set(row["citations"] or [])
        cited = {passage_of(c) for c in cited} if split else cited  # a part cites its passage (index.chunk_words)
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
    """``labels/<kind>.parquet`` (schemas.tables.LABELS) and ``<kind>.jsonl``, written as records come under
    temporary names and renamed by ``publish``: a run killed while it labels leaves the last run's files
    whole (they were cut to nothing, beside a summary and a dataset that still counted their records)."""

    def __init__(self, output: str, kind: str):
        self.fs, root = filesystem(output)
        self.fs.create_dir(f"{root}/labels", recursive=True)
        self.schema = LABELS[kind]
        self.paths = [f"{root}/labels/{kind}.parquet", f"{root}/labels/{kind}.jsonl"]
        self.parquet = pq.ParquetWriter(f"{self.paths[0]}.tmp", self.schema, filesystem=self.fs)
        self.jsonl = self.fs.open_output_stream(f"{self.paths[1]}.tmp")
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

    def publish(self) -> None:
        for path in self.paths:
            self.fs.move(f"{path}.tmp", path)


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


def read_split_index(output: str, strategies: list[str]) -> bool:
    """Whether the run read an index of split passages (its identity, in its parts: not the index folder, which
    may have been rebuilt since): gold ids name whole passages, the answers' ids their parts."""
    for strategy in strategies:
        try:
            files = answer_files(join(output, strategy))
        except (FileNotFoundError, UserError):  # a strategy that committed nothing labels nothing
            continue
        if reads_split_index(files):
            return True
    return False


def label(config, log=print, force: bool = False, source: str | None = None) -> dict:
    """Answer with the labelling strategies, then write the label files; returns counts per kind.
    ``source``: the questions as the user named them, where ``config.questions`` is ragsift's converted copy.

    Answers are read in chunks of parts and labels written as they come: memory holds the gold
    answers (id, answers, gold passage ids) and one chunk of answer rows with their passages."""
    cols = question_columns(config.questions)  # a bad gold column fails before the answering, not after
    if "answers" not in cols:  # said before the answering, which took hours for labels it could not make
        kinds = [k for k in RAISF_KINDS if k in config.label.collect] if "raisf_labels" in config.strategies else []
        kinds += ["self_reasoning"] if "self_reasoning" in config.strategies else []
        empty = [k for k in kinds if k in ("self_knowledge", "self_reasoning")]
        if empty == kinds:
            raise UserError(f"{redact(source or config.questions)} has no `answers` column, and every kind asked "
                            f"({', '.join(kinds)}) is labelled against gold answers: give questions with answers")
        if empty:
            log(f"warning: no `answers` column: {' and '.join(empty)} will have no labels (they need gold answers); "
                f"labelling {', '.join(k for k in kinds if k not in empty)}")
    answer_job.answer(config, log=log, force=force)
    gold = by_first_id(read_table(config.questions, [
        "id", *[c for c in ("answers", "gold_passage_ids", "kind", "dataset") if c in cols]]).to_pylist())
    summary, writers = {}, []
    split = read_split_index(config.output, config.strategies)
    if "raisf_labels" in config.strategies:
        kinds = [k for k in RAISF_KINDS if k in config.label.collect]
        raisf = {kind: LabelWriter(config.output, kind) for kind in kinds}
        dropped, seen = {kind: Counter() for kind in kinds}, 0
        for rows, ids in answer_chunks(config.output, "raisf_labels"):
            for kind, records in raisf_labels(rows, gold, passages_by_id(config.index.path, ids), config.label,
                                              dropped, split, tuple(config.answer_form.verdicts)).items():
                raisf[kind].write(records)
            seen += len(rows)
        for kind, writer in raisf.items():
            summary[kind] = {"records": writer.records, **writer.labels, "of": seen, "dropped": dict(dropped[kind])}
        writers += raisf.values()
    if "self_reasoning" in config.strategies:
        writer, dropped, seen = LabelWriter(config.output, "self_reasoning"), Counter(), 0
        for rows, ids in answer_chunks(config.output, "self_reasoning"):
            kept, why = self_reasoning_labels(rows, gold, passages_by_id(config.index.path, ids), config.label,
                                              config.answer_form, config.self_reasoning.short_answer, split)
            writer.write(kept)
            dropped.update(why)
            seen += len(rows)
        summary["self_reasoning"] = {"records": writer.records, "of": seen, "dropped": dict(dropped)}
        writers.append(writer)
    for writer in writers:
        writer.close()
    for writer in writers:  # only now, all of them: each file whole, this run's or the last one's
        writer.publish()
    remove_unlabelled(config.output, summary, log)
    fs, root = filesystem(config.output)
    write_whole(fs, f"{root}/labels/summary.json", json.dumps(summary, indent=2).encode())
    log(f"dataset ready to publish: {redact(write_dataset(config.output, summary, config, source))} (card: README.md)")
    return summary


def remove_unlabelled(output: str, summary: dict, log) -> None:
    """Remove an earlier run's label files of the kinds this run did not label (fewer strategies, another
    ``label.collect``): the summary and the dataset describe this run, and files beside them that neither
    counts would be published by nobody and read by ``train`` as if they were."""
    fs, root = filesystem(output)
    for kind in KINDS:
        if kind in summary:
            continue
        for path in (f"{root}/labels/{kind}.parquet", f"{root}/labels/{kind}.jsonl"):
            if fs.get_file_info(path).type == pafs.FileType.File:
                fs.delete_file(path)
                log(f"removed {redact(output)}/labels/{path.rsplit('/', 1)[-1]}, an earlier label run's: this run "
                    f"did not label {kind} (its answers are kept: label with it again to get the file back)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    answer_job.add_arguments(
        p, retry_errors=False,
        strategy_help="raisf_labels (RA-ISF's kinds, those in label.collect) and / or self_reasoning (trajectories); "
                      "default both",
        output_help="output directory: the labelling strategies' answers, and labels/ (a file per kind, dataset/)")
    p.add_argument("--push-to-hub", metavar="REPO",
                   help="upload <output>/labels/dataset as a Hugging Face dataset repository (needs a hub login)")


def run(args: argparse.Namespace) -> int:
    given = answer_job.given_config(args, default_strategies=LABEL_STRATEGIES)
    config = answer_job.with_questions_read(given)
    other = [s for s in config.strategies if s not in LABEL_STRATEGIES]
    if other:
        raise UserError(f"label runs {list(LABEL_STRATEGIES)} (or one of them), not {other}")
    if args.push_to_hub is not None:
        check_hub_repo(args.push_to_hub)
    summary = label(config, log=lambda *a: print(*a, file=sys.stderr), force=args.force, source=given.questions)
    print(json.dumps(summary, indent=2))
    print(f"wrote {redact(join(config.output, 'labels'))}: <kind>.parquet and .jsonl, and dataset/", file=sys.stderr)
    # labels of error rows are none: a run whose every prompt failed published an empty dataset with status 0
    status = answer_job.error_status("label", answer_job.previous_metrics(config.output) or {},
                                     config.commit.max_error_share, hint="a new --output labels them anew")
    if args.push_to_hub and status:
        print(f"ragsift label: not pushed to the hub ({args.push_to_hub}): the labels above come from too few answers",
              file=sys.stderr)
    elif args.push_to_hub:
        push_to_hub(str(Path(filesystem(config.output)[1]) / "labels" / "dataset"), args.push_to_hub)
        print(f"pushed labels/dataset to the hub as {args.push_to_hub}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("label", argv)


if __name__ == "__main__":
    sys.exit(main())
