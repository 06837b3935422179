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

from jobs.cli import add_config_arguments
from jobs.relevance_pairs import PAIRS
from jobs.storage import check_kept
from jobs.train_know import train_know
from jobs.train_relevance import train_relevance
from schemas.config import home_expanded, load_config
from schemas.training import KnowTraining, RelevanceTraining

# Flags are shortcuts for the fields of the same name (schemas/training.py holds the defaults, the
# checks and the help): --config FILE and --set field=value layer beneath them, as in every job.
SETTINGS = {"relevance": RelevanceTraining, "know": KnowTraining}


def _flags(p: argparse.ArgumentParser, section: type) -> None:
    add_config_arguments(p)
    # --debug after the judge, as every other job takes it last (SUPPRESS: `train --debug know` keeps it)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of a failure")
    for name, field in section.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = not field.is_required() and default not in (None, [])
        help_ = " ".join(filter(None, [field.description, f"(default: {default})" if shown else ""]))
        if field.annotation is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif name == "exclude":
            p.add_argument(flag, action="append", default=None, help=help_)
        else:
            p.add_argument(flag, default=None, help=help_)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="judge", required=True)
    _flags(sub.add_parser("relevance", help=f"M_rel: a bi-encoder (or cross-encoder) from gold passages and hard "
                                            f"negatives; --mine-only writes <output>/{PAIRS}, --pairs trains from it"),
           RelevanceTraining)
    _flags(sub.add_parser("know", help="M_know: a classifier from `ragsift label` know / unknown labels"),
           KnowTraining)


def settings(args: argparse.Namespace) -> RelevanceTraining | KnowTraining:
    """The typed settings: defaults, then --config, then --set, then the flags (a bad value, or a
    required one given nowhere, is a ConfigError naming its field). ``--exclude`` adds to the config's
    list rather than replacing it: it is what keeps the reported slices out of training."""
    section = SETTINGS[args.judge]
    flags = {name: getattr(args, name) for name in section.model_fields if name != "exclude"}
    layered = load_config(section, args.config, args.set, **flags)
    return layered.model_copy(update={"exclude": [*layered.exclude, *map(home_expanded, args.exclude or [])]})


def run(args: argparse.Namespace) -> int:
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    config = settings(args)
    check_kept(config.output)
    (train_relevance if args.judge == "relevance" else train_know)(config, log)
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("train", argv)


if __name__ == "__main__":
    sys.exit(main())
