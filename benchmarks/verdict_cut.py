"""A cut on P(first verdict) for claims (``answer_form.verdict_cut``): chosen on one run's claims, scored on
another's. The probabilities are the answer form's own (each row's final step traces them).

    python benchmarks/verdict_cut.py slices --out runs/slices    # fever_tune200 / fever_check200.parquet
    ragsift answer --questions runs/slices/fever_tune200.parquet --output runs/tune/fever_tune200 --strategy direct
    ragsift answer --questions runs/slices/fever_check200.parquet --output runs/tune/fever_check200 --strategy direct \\
        --set answer_form.verdict_cut=<the cut chosen>
    python benchmarks/verdict_cut.py score --choose runs/tune/fever_tune200 runs/slices/fever_tune200.parquet \\
        --check runs/tune/fever_check200 runs/slices/fever_check200.parquet --out results/tuning/fever_verdict_cut.json

The slices: DEV FEVER claims in id order, 40-239 (tune) and 240-439 (check; the first 40 a probe had read); no
reported slice holds a claim. The cut is midway between the two scores around
the accuracy-best split of the tune run (ties: the lower cut); the check run is scored by its own answers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

SLICES = {"fever_tune200": (40, 200), "fever_check200": (240, 200)}


def slices(out: Path, questions: str) -> None:
    table = pq.read_table(questions)
    claims = table.filter(pc.equal(table["dataset"], "fever")).sort_by("id")
    out.mkdir(parents=True, exist_ok=True)
    for name, (start, n) in SLICES.items():
        pq.write_table(claims.slice(start, n), out / f"{name}.parquet")


def rows_of(run: str, questions: str, strategy: str, labels: list[str]) -> list[tuple[float, str, str]]:
    """(P(first verdict), the answer, the gold) per claim of ``run``: the last step whose probabilities are
    the verdicts' (an earlier judgment, Think-then-Act's assessment, has its own); rows without one (questions,
    or a verdict written as text) are left out."""
    gold = {r["id"]: r["answers"][0] for r in pq.read_table(questions, columns=["id", "answers"]).to_pylist()}
    out = []
    for row in pq.read_table(Path(run) / strategy).to_pylist():
        verdicts = [t["probs"] for t in json.loads(row["trace"] or "[]") if set(t.get("probs") or ()) == set(labels)]
        if verdicts and row["id"] in gold:
            out.append((verdicts[-1][labels[0]], row["answer"], gold[row["id"]]))
    if not out:
        raise SystemExit(f"{run}/{strategy}: no row has a verdict among {labels} with its probabilities")
    return out


def scores(rows: list[tuple[float, str, str]], answers: list[str], labels: list[str]) -> dict:
    from sklearn.metrics import roc_auc_score

    recall = {lab: round(100 * sum(a == g for a, (_, _, g) in zip(answers, rows) if g == lab)
                         / max(1, sum(g == lab for _, _, g in rows)), 1) for lab in labels}
    return {"n": len(rows), "acc": round(100 * sum(a == g for a, (_, _, g) in zip(answers, rows)) / len(rows), 1),
            "recall": recall, "balanced_acc": round(sum(recall.values()) / len(labels), 1),
            "answers": {lab: answers.count(lab) for lab in labels},
            "auc_p_first": round(roc_auc_score([g == labels[0] for _, _, g in rows], [p for p, _, _ in rows]), 3)}


def choose(rows: list[tuple[float, str, str]], labels: list[str]) -> float:
    """The accuracy-best cut, midway between two neighbouring probabilities (never on one), ties the lower."""
    ps = sorted({p for p, _, _ in rows})
    cuts = [0.0] + [(a + b) / 2 for a, b in zip(ps, ps[1:])] + [1.0]
    acc = lambda cut: sum((p >= cut) == (g == labels[0]) for p, _, g in rows)  # noqa: E731
    return max(cuts, key=lambda cut: (acc(cut), -cut))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cut = sub.add_parser("slices")
    cut.add_argument("--out", type=Path, required=True)
    cut.add_argument("--questions", default="../shared/data/questions_dev.parquet")
    score = sub.add_parser("score")
    score.add_argument("--choose", nargs=2, required=True, metavar=("RUN", "QUESTIONS"))
    score.add_argument("--check", nargs=2, required=True, metavar=("RUN", "QUESTIONS"))
    score.add_argument("--strategy", default="direct")
    score.add_argument("--labels", default="SUPPORTS,REFUTES")
    score.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "slices":
        return slices(args.out, args.questions)
    labels = args.labels.split(",")
    tune, check = rows_of(*args.choose, args.strategy, labels), rows_of(*args.check, args.strategy, labels)
    chosen = choose(tune, labels)
    result = {"cut": chosen, "labels": labels, "strategy": args.strategy,
              "tune": {"run": args.choose[0], "likelier": scores(tune, [a for _, a, _ in tune], labels),
                       "at_cut": scores(tune, [labels[0] if p >= chosen else labels[1] for p, _, _ in tune], labels)},
              "check": {"run": args.check[0], "its_answers": scores(check, [a for _, a, _ in check], labels),
                        "likelier": scores(check, [labels[0] if p > 0.5 else labels[1] for p, _, _ in check], labels),
                        # the chosen cut on the check run's own probabilities (a run without the cut needs no rerun)
                        "at_cut": scores(check, [labels[0] if p >= chosen else labels[1] for p, _, _ in check], labels)}}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
