"""The DEV slices used for tuning and reporting, cut from ../shared/data/questions_dev.parquet.

    sample   the 200-question sample (data/demo): reported, never tuned on
    eval     50 questions with gold passages from each of nq, squad, hotpotqa, 2wiki, musique and
             strategyqa (300), none from the sample: reported over the full 46k-passage corpus
    calib    the next 30 questions with gold passages per dataset in the same order (fewer where a
             dataset runs out: musique has 17 left): prompts, thresholds and answer forms are chosen
             on these and only these
    train    every other DEV question (judge models train on these: `ragsift train`), and
    know     400 of them per dataset of nq, squad, hotpotqa, 2wiki, musique, strategyqa, triviaqa
             and popqa in the same order: the questions `ragsift label` collects M_know's labels on

Order: sha256 of the question id, so the cut is fixed and independent of file order. Writes
<out>/{eval,calib}.parquet and their id lists (results/slices/*.txt keep the ids under version control).

    python benchmarks/dev_slices.py --dev ../shared/data/questions_dev.parquet --out runs/slices
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATASETS = ("nq", "squad", "hotpotqa", "2wiki", "musique", "strategyqa")
SIZES = {"eval": 50, "calib": 30}
KNOW_DATASETS = DATASETS + ("triviaqa", "popqa")


def cut(dev: pa.Table, sample_ids: set[str]) -> dict[str, list[str]]:
    rows = [r for r in dev.select(["id", "dataset", "gold_passage_ids"]).to_pylist()
            if r["id"] not in sample_ids and r["gold_passage_ids"] and r["dataset"] in DATASETS]
    rows.sort(key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    slices = {name: [] for name in SIZES}
    for dataset in DATASETS:
        mine = [r["id"] for r in rows if r["dataset"] == dataset]
        start = 0
        for name, size in SIZES.items():
            slices[name] += mine[start:start + size]
            start += size
    taken = set(sample_ids).union(*slices.values())
    rest = sorted((r for r in dev.select(["id", "dataset"]).to_pylist() if r["id"] not in taken),
                  key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    slices["train"] = [r["id"] for r in rest]
    slices["know"] = [r["id"] for d in KNOW_DATASETS for r in [r for r in rest if r["dataset"] == d][:400]]
    return slices


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", default="../shared/data/questions_dev.parquet")
    p.add_argument("--sample", default=str(Path(__file__).resolve().parent.parent / "data/demo/sample_questions.parquet"))
    p.add_argument("--out", default="runs/slices")
    p.add_argument("--ids", default=str(Path(__file__).resolve().parent.parent / "results/slices"))
    args = p.parse_args()
    dev = pq.read_table(args.dev)
    sample_ids = set(pq.read_table(args.sample, columns=["id"])["id"].to_pylist())
    out, ids_dir = Path(args.out), Path(args.ids)
    out.mkdir(parents=True, exist_ok=True)
    ids_dir.mkdir(parents=True, exist_ok=True)
    index = {qid: i for i, qid in enumerate(dev["id"].to_pylist())}
    for name, ids in cut(dev, sample_ids).items():
        pq.write_table(dev.take([index[i] for i in ids]), out / f"{name}.parquet")
        if name != "train":  # the rest of DEV: its rule is enough
            (ids_dir / f"{name}.txt").write_text("".join(f"{i}\n" for i in ids))
        print(f"{name}: {len(ids)} questions -> {out / name}.parquet")


if __name__ == "__main__":
    main()
