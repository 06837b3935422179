"""Peak memory and time of ``ragsift evaluate`` (or ``report``) scoring answers against a large question file.

    python benchmarks/evaluate_memory.py --questions 1000000 --answers 300 [--trace-chars 2000] [--code CHECKOUT] \
        [--job report]

Writes a question file of N questions (two gold answers, a dataset, a gold passage each) and one answer
part of M of them (each with a trace of that many characters) into a temporary folder, runs the CLI of
``--code`` (default: this checkout) on them in a child process and prints that child's peak RSS
(ru_maxrss) and wall time as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from schemas.tables import ANSWERS  # noqa: E402


def write_inputs(folder: Path, n: int, m: int, trace_chars: int) -> tuple[Path, Path]:
    ids = [f"q{i:08d}" for i in range(n)]
    pq.write_table(pa.table({"id": ids, "question": [f"Question {i}?" for i in range(n)],
                             "answers": [[f"a{i}", f"b{i}"] for i in range(n)], "dataset": ["nq"] * n,
                             "gold_passage_ids": [[f"p{i}"] for i in range(n)]}), folder / "questions.parquet")
    step = max(1, n // m)
    rows = [{**{f.name: None for f in ANSWERS}, "id": ids[i], "question": "?", "strategy": "rag", "answer": f"a{i}",
             "resolved_by": "passages", "retrieved_ids": [f"p{i}"], "citations": [], "n_llm_calls": 1,
             "n_retrievals": 1, "n_subquestions": 0, "depth": 0, "n_parse_failures": 0, "n_truncated": 0,
             "prompt_tokens": 10, "completion_tokens": 2, "latency_s": 0.1,
             "trace": "x" * trace_chars} for i in range(0, step * m, step)]
    (folder / "answers" / "rag").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), folder / "answers" / "rag" / "part-00000.parquet")
    return folder / "questions.parquet", folder / "answers"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=1_000_000)
    p.add_argument("--answers", type=int, default=300)
    p.add_argument("--trace-chars", type=int, default=2000, help="each answer row's trace (a real one: 0.5-20 kB)")
    p.add_argument("--code", default=str(REPO), help="the checkout whose evaluate runs")
    p.add_argument("--job", choices=["evaluate", "report"], default="evaluate")
    p.add_argument("--write-into", help=argparse.SUPPRESS)  # the inputs are written by a child of their own
    args = p.parse_args()
    if args.write_into:
        write_inputs(Path(args.write_into), args.questions, args.answers, args.trace_chars)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        # written in another process: a child forked from one holding the tables counts their pages in its peak
        subprocess.run([sys.executable, __file__, "--questions", str(args.questions), "--answers", str(args.answers),
                        "--trace-chars", str(args.trace_chars), "--write-into", tmp], check=True)
        questions, answers = Path(tmp) / "questions.parquet", Path(tmp) / "answers"
        started = time.perf_counter()
        job = (["evaluate", "--answers", str(answers), "--out", str(Path(tmp) / "scores")] if args.job == "evaluate"
               else ["report", "--runs", str(answers), "--out", str(Path(tmp) / "report.html")])
        child = subprocess.Popen([sys.executable, "-m", "jobs.cli", *job, "--questions", str(questions)], cwd=args.code,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not the writer's
        wall = time.perf_counter() - started
        if status:
            raise SystemExit(f"{args.job} failed (wait status {status})")
        if args.job == "evaluate":
            n = json.loads((Path(tmp) / "scores" / "eval.json").read_text())[-1]["n"]
        else:  # the scores table's ALL row: <td>rag</td><td>ALL</td><td>n</td>
            n = int((Path(tmp) / "report.html").read_text().split("<td>rag</td><td>ALL</td><td>")[1].split("<")[0])
    print(json.dumps({"job": args.job, "questions": args.questions, "answers": args.answers, "code": args.code,
                      "peak_rss_mb": round(usage.ru_maxrss / 1024),
                      "wall_s": round(wall, 1), "n_scored": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
