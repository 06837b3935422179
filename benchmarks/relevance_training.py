"""Does a relevance judge (M_rel, issue 17) learn on this CPU? Held-out AUC before and after training.

Questions with gold passages from the `train` slice (runs/slices/train.parquet, never the sample, calib
or eval slices), the same number per dataset; pairs mined as `ragsift train relevance` mines them
(gold passages; the top non-gold BM25 and dense passages of the full index; one easy negative); a
fifth of the questions held out by the same salted hash. Reports the held-out AUC of the untrained
MiniLM's cosine, then of the trained model, overall and per dataset:

    cross  a CrossEncoder from MiniLM (BinaryCrossEntropyLoss, positives weighted up to the negatives),
           as `ragsift train relevance --architecture cross-encoder` trains it (jobs/train_relevance.py)
    bi     MiniLM itself fine-tuned as a bi-encoder (MultipleNegativesRankingLoss on (question, gold,
           hard negative) triplets), as `ragsift train relevance` trains it; its cosine is the score

    python benchmarks/relevance_training.py --model cross --questions 600 --learning-rate 5e-5
    python benchmarks/relevance_training.py --model bi --questions 600 --learning-rate 5e-5
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_dataset_auc(test: list[dict], scores, dataset_of: dict) -> dict:
    from jobs.train_data import auc

    labels = [p["label"] for p in test]
    out = {"ALL": round(auc(labels, list(map(float, scores))), 3)}
    for name in sorted(set(dataset_of.values())):
        idx = [i for i, p in enumerate(test) if dataset_of[p["id"]] == name]
        if len({labels[i] for i in idx}) == 2:
            out[name] = round(auc([labels[i] for i in idx], [float(scores[i]) for i in idx]), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cross", "bi"], required=True)
    p.add_argument("--questions", type=int, default=600, help="questions with gold, split evenly over datasets")
    p.add_argument("--slice", default=str(ROOT / "runs/slices/train.parquet"))
    p.add_argument("--index-dir", default=str(Path.home() / ".cache/ragsift/indexes/full"))
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, help="default: 16 for cross, 32 for bi")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                   help="bfloat16 mixed precision (on this box fp32 was the faster: 1.95 against 3.4 s a step)")
    p.add_argument("--out")
    args = p.parse_args()

    import pyarrow.parquet as pq
    import torch
    from sentence_transformers import SentenceTransformer

    from jobs.models import resolve
    from jobs.relevance_pairs import mine_pairs
    from jobs.train_data import held_out
    from jobs.train_relevance import bi_encoder_trainer, cross_encoder_trainer, relevance_scores
    from schemas.training import RelevanceTraining

    torch.set_num_threads(args.threads)
    rows = [r for r in pq.read_table(args.slice).to_pylist() if r["gold_passage_ids"]]
    by = collections.defaultdict(list)
    for r in rows:
        by[r["dataset"]].append(r)
    picked = [r for d in sorted(by) for r in by[d][: args.questions // len(by)]]
    dataset_of = {r["id"]: r["dataset"] for r in picked}
    pairs = mine_pairs(picked, args.index_dir, 3, 1)
    train = [x for x in pairs if not held_out(x["id"], 0.2)]
    test = [x for x in pairs if held_out(x["id"], 0.2)]
    base = SentenceTransformer(resolve("all-minilm-l6-v2"), device="cpu")
    result = {"model": args.model, "questions": len(picked), "pairs": len(pairs), "held_out_pairs": len(test),
              "base_cosine_auc": per_dataset_auc(test, relevance_scores(base, test, bi=True), dataset_of)}
    print(json.dumps(result), flush=True)
    settings = RelevanceTraining(output="/tmp/relevance_training", questions=args.slice, index_dir=args.index_dir,
                                 epochs=args.epochs, learning_rate=args.learning_rate, bf16=args.bf16,
                                 batch_size=args.batch_size or (16 if args.model == "cross" else 32))
    make = cross_encoder_trainer if args.model == "cross" else bi_encoder_trainer
    started = time.perf_counter()
    model, trainer = make(train, settings, "cpu", Path("/tmp/relevance_training"))
    trainer.train()
    examples = len(trainer.train_dataset)
    train_s = time.perf_counter() - started
    scores = relevance_scores(model, test, bi=args.model == "bi")
    result.update(trained_auc=per_dataset_auc(test, scores, dataset_of), train_examples=examples,
                  train_s=round(train_s, 1), examples_per_s=round(examples * args.epochs / train_s, 1),
                  losses=[round(h["loss"], 3) for h in trainer.state.log_history if "loss" in h],
                  settings={**settings.model_dump(include={"base", "epochs", "batch_size", "learning_rate",
                                                           "max_length", "seed", "bf16"}), "threads": args.threads})
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
