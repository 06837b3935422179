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
    tune360  the first 60 per dataset (the six above) of train outside know: a second tuning set

Order: sha256 of the question id, so the cut is fixed and independent of file order. Writes
<out>/<slice>.parquet for each, the id lists (results/slices/*.txt keep them under version control;
a list that differs from the one there is refused, not overwritten) and near_copies.json beside them.

Near copies: MuSiQue composes its questions from single-hop ones, and DEV holds several questions
ending in the same last hop ("Who plays Marty's girlfriend ...?" worded two ways; id
`musique-2hop__<hop>_<last hop>`), so one answer. The cut goes by id and does not separate them;
near_copies.json counts, for each reported set, the questions of every other set that share a last
hop with it (results/README.md, "Question sets").

    python benchmarks/dev_slices.py --dev ../shared/data/questions_dev.parquet --out runs/slices
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
    know = set(slices["know"])
    slices["tune360"] = [r["id"] for d in DATASETS for r in [r for r in rest if r["dataset"] == d and r["id"] not in know][:60]]
    return slices


def last_hop(qid: str) -> str | None:
    """The last single-hop question a MuSiQue question is composed of (None for other datasets)."""
    return qid.split("__")[1].split("_")[-1] if qid.startswith("musique-") and "__" in qid else None


def near_copies(slices: dict[str, list[str]], reported=("sample", "eval")) -> dict:
    """For each reported set, the questions of each other set that share a MuSiQue last hop with it."""
    hops = {name: {last_hop(i) for i in ids} - {None} for name, ids in slices.items()}
    return {shown: {name: sorted(i for i in ids if last_hop(i) in hops[shown])
                    for name, ids in slices.items() if name != shown}
            for shown in reported}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", default="../shared/data/questions_dev.parquet")
    p.add_argument("--sample", default=str(Path(__file__).resolve().parent.parent / "data/demo/sample_questions.parquet"))
    p.add_argument("--out", default="runs/slices")
    p.add_argument("--ids", default=str(Path(__file__).resolve().parent.parent / "results/slices"))
    args = p.parse_args()
    dev = pq.read_table(args.dev)
    sample_ids = set(pq.read_table(args.sample, columns=["id"])["id"].to_pylist())
    index = {qid: i for i, qid in enumerate(dev["id"].to_pylist())}
    if not sample_ids or not sample_ids <= set(index):  # else sample questions would be cut into the slices
        raise SystemExit(f"{args.sample}: not the sample of {args.dev} ({len(sample_ids - set(index))} of "
                         f"{len(sample_ids)} ids are not DEV questions)")
    out, ids_dir = Path(args.out), Path(args.ids)
    out.mkdir(parents=True, exist_ok=True)
    ids_dir.mkdir(parents=True, exist_ok=True)
    slices = cut(dev, sample_ids)
    for name, ids in slices.items():  # all checked before anything is written
        listed = ids_dir / f"{name}.txt"
        if name != "train" and listed.exists() and listed.read_text().split() != ids:
            raise SystemExit(f"{listed}: the committed list differs from this cut (another DEV file or sample?); "
                             "the tables were made with the committed one, so it is not overwritten")
    for name, ids in slices.items():
        pq.write_table(dev.take([index[i] for i in ids]), out / f"{name}.parquet")
        if name != "train":  # the rest of DEV: its rule is enough
            (ids_dir / f"{name}.txt").write_text("".join(f"{i}\n" for i in ids))
        print(f"{name}: {len(ids)} questions -> {out / name}.parquet")
    copies = near_copies({"sample": sorted(sample_ids), **slices})
    (ids_dir / "near_copies.json").write_text(json.dumps(copies, indent=1))
    for shown, others in copies.items():
        print(f"MuSiQue questions sharing a last hop with {shown}: "
              + ", ".join(f"{name} {len(ids)}" for name, ids in others.items()) + " (train holds know and tune360)")

if __name__ == "__main__":
    main()
