"""RA-ISF's relevance cut as the switch between reading and decomposing, chosen by answer quality.

With ``raisf.read: retrieved`` (Algorithm 1, line 14) a question whose best passage scores at least
t is answered from all k retrieved passages, the request rag makes, and one whose passages all score
below t is decomposed. So the cut decides only which questions go to decomposition, and its value
can be read off one RA-ISF run at a higher cut t0 with rag in the same run: for t <= t0 a question
scoring below t is one RA-ISF decomposed at t0 (its answer there is the decomposition's), every other
one gets rag's answer. Approximate in one way: the decomposition answers come from the run's own
settings, where the sub-questions' nodes read and cut as that run did. Questions the run answered
closed-book (self-knowledge) never reach the cut and are left out.

Value per question = (F1 + accuracy) / 2 as ``ragsift calibrate``'s switches; the cut is chosen on
the pooled tuning runs (ties -> the higher t), never on a reported slice.

    python benchmarks/raisf_decompose_cut.py --runs runs/tune/calib_raisf_ce_g15 runs/tune/tune360_raisf_ce_g15 \\
        --questions runs/slices/calib.parquet runs/slices/tune360.parquet --out results/tuning/...json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.dataset as ds  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from jobs.calibrate import candidates, first_step, quality, switch_curve  # noqa: E402
from strategies.raisf import DECOMPOSED  # noqa: E402


def rows_of(run: str, questions: str) -> list[dict]:
    """Per question: best relevance score, rag's value, RA-ISF's value and whether RA-ISF decomposed it."""
    gold = {r["id"]: r["answers"] for r in pq.read_table(questions, columns=["id", "answers"]).to_pylist()}
    rag = {r["id"]: r for r in ds.dataset(f"{run}/rag").to_table(columns=["id", "answer"]).to_pylist()}
    out = []
    for r in ds.dataset(f"{run}/raisf").to_table(columns=["id", "answer", "resolved_by", "trace"]).to_pylist():
        relevance = first_step(r, "relevance")
        if r["id"] not in rag or relevance is None or r["resolved_by"] not in ("passages", *DECOMPOSED):
            continue
        g = gold[r["id"]]
        out.append({"best": max(relevance["p_yes"], default=0.0),
                    "rag": quality(rag[r["id"]]["answer"] or "", g), "raisf": quality(r["answer"] or "", g),
                    "decomposed": r["resolved_by"] in DECOMPOSED})
    return out


def curve_of(rows: list[dict]) -> tuple[float, list[dict]]:
    """The switch curve over cuts below the run's own (above a decomposed question's best score nothing is known)."""
    t0 = min((r["best"] for r in rows if not r["decomposed"]), default=1.0)
    scores = [r["best"] for r in rows]
    below = [r["raisf"] if r["decomposed"] else r["rag"] for r in rows]
    curve = switch_curve(scores, [r["rag"] for r in rows], below, [t for t in candidates(scores) if t <= t0])
    best = max(curve, key=lambda c: (round(c["value"], 9), c["t"]))
    return best["t"], curve


def value_at(rows: list[dict], t: float) -> dict:
    n = len(rows)
    v = sum(r["raisf"] if r["best"] < t else r["rag"] for r in rows) / n
    return {"n": n, "value": round(100 * v, 2), "decomposed": sum(r["best"] < t for r in rows),
            "rag": round(100 * sum(r["rag"] for r in rows) / n, 2),
            "raisf_as_run": round(100 * sum(r["raisf"] for r in rows) / n, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, help="compare outputs with rag and raisf")
    p.add_argument("--questions", nargs="+", required=True, help="each run's questions, in the same order")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    per_run = [rows_of(r, q) for r, q in zip(args.runs, args.questions, strict=True)]
    pooled = [r for rows in per_run for r in rows]
    t, curve = curve_of(pooled)
    result = {
        "chosen_t": t,
        "pooled": value_at(pooled, t),
        "runs": {run: {"at_chosen": value_at(rows, t), "own_best_t": curve_of(rows)[0]}
                 for run, rows in zip(args.runs, per_run)},
        "curve": [{k: round(v, 4) for k, v in c.items()} for c in curve],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=2))


if __name__ == "__main__":
    main()
