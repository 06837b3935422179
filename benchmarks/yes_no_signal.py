"""How much the generator knows about yes/no questions: P("yes") against the gold, closed-book and
with the passages a ``rag`` run read, on DEV yes/no questions that no other slice uses.

    python benchmarks/yes_no_signal.py slice --out runs/slices        # yesno400.parquet + results/slices/yesno400.txt
    ragsift answer --questions runs/slices/yesno400.parquet --index-dir ~/.cache/ragsift/indexes/full \\
        --output runs/tune/yesno400 --strategy rag
    python benchmarks/yes_no_signal.py score --questions runs/slices/yesno400.parquet \\
        --rag-run runs/tune/yesno400 --out results/tuning/yes_no_signal.json

The slice: 300 strategyqa questions and 100 hotpotqa / 2wiki questions whose gold is yes or no, from
``train`` (not ``know``, not tune360), in sha256-of-id order. The prompts are the shipped ones (the
yes/no system prompt, direct's and rag's user prompts); P("yes") is the answer form's own choice
probability (strategies/forms.py). Reported: AUC of P("yes") against the gold, accuracy of the
shipped rule (the likelier of yes / no), and the accuracy of the best single cut on P("yes") with
2-fold cross-validation (a cut fitted on one half, scored on the other), which is what a calibrated
yes/no threshold could add. A question whose request returned no probability is left out of its
part's scores and counted as ``no_probability``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import variants


def cut_slice(args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    dev = pq.read_table(args.dev)
    taken = variants.taken_ids("calib", "eval", "know", "tune360")
    rows = [r for r in dev.select(["id", "dataset", "answers"]).to_pylist()
            if r["id"] not in taken and r["answers"] and str(r["answers"][0]).lower() in ("yes", "no")]
    rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    ids = ([r["id"] for r in rows if r["dataset"] == "strategyqa"][:300]
           + [r["id"] for r in rows if r["dataset"] in ("hotpotqa", "2wiki")][:100])
    index = {qid: i for i, qid in enumerate(dev["id"].to_pylist())}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    pq.write_table(dev.take([index[i] for i in ids]), Path(args.out) / "yesno400.parquet")
    (variants.ROOT / "results/slices/yesno400.txt").write_text("".join(f"{i}\n" for i in ids))
    print(f"yesno400: {len(ids)} questions")


def best_cut_accuracy(p: list[float], y: list[bool]) -> float:
    """2-fold cross-validated accuracy of "yes when P(yes) >= t", t fitted on the other half."""
    halves = [list(range(0, len(p), 2)), list(range(1, len(p), 2))]
    correct = 0
    for fit, test in (halves, halves[::-1]):
        cuts = sorted({p[i] for i in fit}) + [1.1]
        t = max(cuts, key=lambda t: sum((p[i] >= t) == y[i] for i in fit))
        correct += sum((p[i] >= t) == y[i] for i in test)
    return correct / len(p)


PARTS = (("all", lambda q: True), ("strategyqa", lambda q: q["dataset"] == "strategyqa"),
         ("hotpotqa+2wiki", lambda q: q["dataset"] != "strategyqa"))  # the slice's parts, each scored alone


def part_scores(questions: list[dict], p_yes: list[float | None]) -> dict[str, dict]:
    """Each part's scores of P("yes") against the gold; a choice without a probability (its request
    failed) is left out and counted, not scored as "no"."""
    from sklearn.metrics import roc_auc_score

    scores = {}
    for part, keep in PARTS:
        idx = [i for i, q in enumerate(questions) if keep(q) and p_yes[i] is not None]
        y = [str(questions[i]["answers"][0]).lower() == "yes" for i in idx]
        p = [p_yes[i] for i in idx]
        if not idx:
            continue
        scores[part] = {
            "n": len(idx), "no_probability": sum(keep(q) and p_yes[i] is None for i, q in enumerate(questions)),
            "gold_yes": round(100 * sum(y) / len(y), 1),
            "auc": round(float(roc_auc_score(y, p)), 3),
            "answered_yes": round(100 * sum(v >= 0.5 for v in p) / len(p), 1),
            "acc_likelier": round(100 * sum((v >= 0.5) == g for v, g in zip(p, y)) / len(y), 1),
            "acc_best_cut_2fold": round(100 * best_cut_accuracy(p, y), 1)}
    return scores


def user_prompts(questions: list[dict], retrieved: dict, passages: dict) -> dict[str, list[str]]:
    """direct's and rag's user prompts per question; rag's over the passages ``retrieved`` names for it."""
    from strategies.base import format_passages, prompt

    return {"direct": [prompt("direct/user").format(question=q["question"]) for q in questions],
            "rag": [prompt("rag/user").format(question=q["question"],
                                              passages=format_passages([passages[i] for i in retrieved[q["id"]]]))
                    for q in questions]}


def score(args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    from actors.generator import Generator
    from jobs.label import passages_by_id
    from jobs.pools import llm_settings
    from schemas.config import AnswerFormConfig, LLMConfig, SamplingConfig
    from strategies.forms import YES_NO, final_request

    questions = pq.read_table(args.questions).to_pylist()
    rag_rows = pq.read_table(f"{args.rag_run}/rag", columns=["id", "retrieved_ids"]).to_pylist()
    retrieved = {r["id"]: r["retrieved_ids"] for r in rag_rows}
    passages = passages_by_id(args.index_dir, {i for ids in retrieved.values() for i in ids})
    generator = Generator(llm_settings(LLMConfig(model=args.generator)), SamplingConfig().model_dump())
    users = user_prompts(questions, retrieved, passages)
    result = {"questions": args.questions, "n": len(questions), "generator": args.generator, "by": {}}
    for strategy, texts in users.items():
        judged = generator.generate([final_request(t, YES_NO, AnswerFormConfig()) for t in texts])
        for part, scores in part_scores(questions, [(j.probs or {}).get("yes") for j in judged]).items():
            result["by"][f"{strategy}/{part}"] = scores
            print(strategy, part, scores, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("slice")
    s.add_argument("--dev", default="../shared/data/questions_dev.parquet")
    s.add_argument("--out", default="runs/slices")
    s = sub.add_parser("score")
    s.add_argument("--questions", required=True)
    s.add_argument("--rag-run", required=True, help="a ragsift run with a rag/ folder over the same questions")
    s.add_argument("--index-dir", default=os.path.expanduser("~/.cache/ragsift/indexes/full"))
    s.add_argument("--generator", default="qwen2.5-coder-0.5b-instruct")
    s.add_argument("--out", required=True)
    args = p.parse_args()
    (cut_slice if args.command == "slice" else score)(args)


if __name__ == "__main__":
    main()
