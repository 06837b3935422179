"""How many answers two runs share: per strategy, identical / different / missing (for refactors that
must not change answers; vLLM's CPU kernels are not batch-invariant, so a few may differ).

    python benchmarks/identical_answers.py runs/before runs/after [--out results/identity.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq


def answers(run: str) -> dict[tuple[str, str], tuple[str, str]]:
    out = {}
    for part in sorted(Path(run).glob("*/part-*.parquet")):
        for row in pq.read_table(part, columns=["id", "strategy", "answer", "resolved_by"]).to_pylist():
            out[(row["strategy"], row["id"])] = (row["answer"], row["resolved_by"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--out")
    args = p.parse_args()
    a, b = answers(args.before), answers(args.after)
    table = defaultdict(lambda: {"identical": 0, "different": 0, "missing": 0, "examples": []})
    for key in sorted(set(a) | set(b)):
        row = table[key[0]]
        if key not in a or key not in b:
            row["missing"] += 1
        elif a[key] == b[key]:
            row["identical"] += 1
        else:
            row["different"] += 1
            if len(row["examples"]) < 3:
                row["examples"].append({"id": key[1], "before": a[key], "after": b[key]})
    for strategy, row in sorted(table.items()):
        print(f"{strategy:16} identical {row['identical']:4}  different {row['different']:3}  missing {row['missing']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"before": args.before, "after": args.after, "strategies": table}, indent=2))


if __name__ == "__main__":
    main()
