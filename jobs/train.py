"""``ragsift train``: judge models from labelled questions, RA-ISF's own loop (Appendix A: collect,
then train the sub-modules), written as plain model directories that ragsift's actor pools load.

    ragsift train relevance --questions dev.parquet --index-dir idx --output models/m_rel \\
        --exclude results/slices/eval.txt --exclude data/demo/sample_questions.parquet
    ragsift train know --labels runs/labels --output models/m_know --exclude ...

    # mine where the index is, train where the GPU is (the cross-encoder wants a GPU's steps)
    ragsift train relevance --questions dev.parquet --index-dir idx --output pairs --mine-only --exclude ...
    ragsift train relevance --pairs pairs/pairs.parquet --architecture cross-encoder --bf16 --output models/m_rel_ce

relevance (M_rel)  (question, passage) -> relevant, from the offline MiniLM; positives are the
                   questions' gold passages, negatives the non-gold passages BM25 and dense
                   retrieval rank highest (hard negatives) and one easy one. By default MiniLM is
                   fine-tuned as a bi-encoder and a logistic fit turns its cosine into a logit
                   (``relevance_logit.json``); ``--architecture cross-encoder`` trains a
                   CrossEncoder instead (a new head: it needs more steps than a CPU gives, see
                   BENCHMARKS.md; on a GPU it learns in minutes and ranks best). Either serves
                   as ``reranker.model`` (the ranker stage) and RA-ISF's relevance judge.
know (M_know)      question -> will this generator answer correctly closed-book: logistic
                   regression on the embedder's question vectors, from ``ragsift label``'s
                   know / unknown labels; written as a CrossEncoder-free classifier directory.

Questions named by ``--exclude`` (id lists, or question Parquet files) are never trained on: the
reported sample and evaluation slice go there. A held-out share of the remaining questions (by a
hash of the id) gives the figures in the model card (``card.json`` and ``README.md`` beside the
weights: data, counts, settings, held-out metrics, examples/s).
"""

from __future__ import annotations

import argparse
import sys

from jobs.relevance_pairs import PAIRS
from jobs.train_know import train_know
from jobs.train_relevance import train_relevance


def share(text: str) -> float:
    """A held-out share: at least 0 and below 1, so something is left to train on."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a share in [0, 1)")
    return value


def positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="judge", required=True)
    rel = sub.add_parser("relevance", help="M_rel: a bi-encoder (or cross-encoder) from gold passages and hard negatives")
    rel.add_argument("--questions", help="questions Parquet with gold_passage_ids")
    rel.add_argument("--index-dir", help="the index the negatives are mined from")
    rel.add_argument("--output", required=True, help="model directory to write")
    rel.add_argument("--mine-only", action="store_true",
                     help=f"mine the pairs, write <output>/{PAIRS} and stop: train where the GPU is with --pairs")
    rel.add_argument("--pairs", help=f"train from a --mine-only run's {PAIRS} (no questions or index needed)")
    rel.add_argument("--exclude", action="append", default=[], help="id list or question Parquet never trained on")
    rel.add_argument("--base", default="all-minilm-l6-v2", help="model to start from (alias, path or hub name)")
    rel.add_argument("--architecture", choices=["bi-encoder", "cross-encoder"], default="bi-encoder",
                     help="bi-encoder: fine-tune the embedder's cosine (learns in CPU time); cross-encoder: a "
                          "CrossEncoder with a new head (needs a GPU's worth of steps)")
    rel.add_argument("--negatives", type=int, default=3, help="hard negatives per question and retrieval method")
    rel.add_argument("--random-negatives", type=int, default=1,
                     help="easy negatives per question: passages other questions retrieved")
    rel.add_argument("--epochs", type=positive, default=1.0)
    rel.add_argument("--batch-size", type=int, default=32)
    rel.add_argument("--learning-rate", type=positive, default=5e-5)
    rel.add_argument("--max-length", type=int, default=256)
    rel.add_argument("--held-out", type=share, default=0.1, help="share of questions kept out of training")
    rel.add_argument("--per-dataset", type=int, help="at most N questions of each dataset (in file order), so that "
                     "one large dataset does not make the whole training set")
    rel.add_argument("--limit", type=int, help="only the first N questions (quick runs)")
    rel.add_argument("--seed", type=int, default=0)
    rel.add_argument("--threads", type=int, help="torch threads on CPU (default: every core)")
    rel.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=False,
                     help="train in bfloat16 mixed precision (GPUs, and CPUs with AVX512-BF16 / AMX)")


    know = sub.add_parser("know", help="M_know: a classifier from `ragsift label` know / unknown labels")
    know.add_argument("--labels", required=True, help="a `ragsift label` output directory")
    know.add_argument("--output", required=True, help="model directory to write")
    know.add_argument("--exclude", action="append", default=[], help="id list or question Parquet never trained on")
    know.add_argument("--embedder", default="all-minilm-l6-v2", help="question vectors (alias, path or hub name)")
    know.add_argument("--c", type=positive, default=1.0, help="inverse regularisation strength")
    know.add_argument("--held-out", type=share, default=0.1, help="share of questions kept out of training")


def run(args: argparse.Namespace) -> int:
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    (train_relevance if args.judge == "relevance" else train_know)(args, log)
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("train", argv)


if __name__ == "__main__":
    sys.exit(main())
