"""Strategies against a baseline on the same questions of one run: the difference of F1 and accuracy,
its 95% paired bootstrap interval, and per question how often each strategy scored above / below it.

    python benchmarks/paired.py --answers runs/cmp --questions q.parquet --baseline rag [--out paired.json]
    python benchmarks/paired.py --answers runs/a runs/b --questions a.parquet b.parquet   # pooled

Several runs (each with its own questions, given in the same order) are pooled into one comparison:
two slices too small alone can together say whether a lead holds.

At n = 200 a difference of 3-4 points is within the noise of either mean; pairing the questions
removes the questions' own difficulty from it, so the interval says whether a lead is the method's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs import metrics as M  # noqa: E402
from jobs.evaluate import grouped_rows, verdicts_of  # noqa: E402


def per_question(answers: str, questions: str) -> dict[str, dict[str, tuple[float, float]]]:
    """strategy -> question id -> (F1, accuracy), in percent."""
    scores: dict[str, dict[str, tuple[float, float]]] = {}
    verdicts = verdicts_of(answers)  # the run's claim labels, scored as labels as evaluate scores them
    for (strategy, dataset), rows in grouped_rows(answers, questions):
        if dataset != "ALL":
            continue
        scores[strategy] = {r["id"]: (100 * M.f1(r["answer"] or "", r["_answers"]),
                                      100 * M.accuracy(r["answer"] or "", r["_answers"], verdicts))
                            for r in rows if r["_answers"]}  # a question without a gold answer is not scored
    return scores


def pooled(runs: list[tuple[str, str]]) -> dict[str, dict[str, tuple[float, float]]]:
    """per_question over several (answers, questions) runs; a question is keyed by its run too, so two
    slices that share an id stay two questions. A strategy counts only where every run has it."""
    per_run = [per_question(answers, questions) for answers, questions in runs]
    common = set.intersection(*(set(scores) for scores in per_run))
    return {s: {f"{i}:{q}": v for i, scores in enumerate(per_run) for q, v in scores[s].items()}
            for s in sorted(common)}


def interval(diffs: list[float], draws: int, rng: random.Random) -> tuple[float, float]:
    means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(draws))
    return round(means[int(0.025 * draws)], 1), round(means[int(0.975 * draws) - 1], 1)


def compare(scores: dict, baseline: str, draws: int = 10_000, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    base = scores[baseline]
    table = []
    for strategy, mine in sorted(scores.items()):
        if strategy == baseline:
            continue
        ids = sorted(set(mine) & set(base))
        if not ids:
            raise SystemExit(f"{strategy} and {baseline} answered no scored question in common")
        row = {"strategy": strategy, "baseline": baseline, "n": len(ids)}
        for i, name in enumerate(("F1", "acc")):
            diffs = [mine[q][i] - base[q][i] for q in ids]
            row[f"{name} diff"] = round(sum(diffs) / len(diffs), 1)
            row[f"{name} 95% CI"] = interval(diffs, draws, rng)
            row[f"{name} above / below"] = (sum(d > 0 for d in diffs), sum(d < 0 for d in diffs))
        table.append(row)
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--answers", required=True, nargs="+", help="a run's output directory (answer or compare); "
                   "several are pooled")
    p.add_argument("--questions", required=True, nargs="+", help="the questions with gold answers, one per --answers")
    p.add_argument("--baseline", default="rag")
    p.add_argument("--out", help="also write the table as JSON here")
    args = p.parse_args(argv)
    if len(args.answers) != len(args.questions):
        p.error(f"--answers names {len(args.answers)} runs and --questions {len(args.questions)} files: give one per run")
    scores = pooled(list(zip(args.answers, args.questions)))
    if args.baseline not in scores:
        p.error(f"--baseline {args.baseline}: the run has {sorted(scores)}")
    table = compare(scores, args.baseline)
    for row in table:
        print(f"{row['strategy']} - {row['baseline']} (n={row['n']}): "
              + "; ".join(f"{m} {row[f'{m} diff']:+.1f} [{row[f'{m} 95% CI'][0]:+.1f}, {row[f'{m} 95% CI'][1]:+.1f}], "
                          f"above/below {row[f'{m} above / below'][0]}/{row[f'{m} above / below'][1]}"
                          for m in ("F1", "acc")))
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
