"""``ragsift demo``: the embedded sample (200 questions, 3,000 passages) end to end.

Builds the index if missing (or built from another corpus), answers with ``direct`` and ``rag``,
writes Parquet, prints and saves the evaluation table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from jobs.answer import answer, error_status
from jobs.cli import strategy_names
from jobs.evaluate import evaluate, print_tables, write_reports
from jobs.index import FORMAT, IndexJobConfig, build_index, read_manifest
from jobs.models import DEFAULT_GENERATOR, ragsift_home
from jobs.pools import llm_settings
from jobs.storage import check_kept, file_sha256, filesystem
from schemas.config import as_override, built_with_index, load_config, parse_override
from schemas.errors import UserError
from strategies.registry import AnswerConfig

DATA = Path(__file__).resolve().parent.parent / "data" / "demo"
QUESTIONS = DATA / "sample_questions.parquet"
CORPUS = DATA / "sample_corpus.parquet"


def default_index_dir() -> Path:
    return ragsift_home() / "indexes" / "demo"


def corpus_sha256() -> str:
    """What the demo's index records of its corpus, and checks before it reuses the index."""
    return file_sha256(*filesystem(str(CORPUS)))


def ensure_index(index_dir: Path, shards: int, log) -> None:
    corpus_sha = corpus_sha256()
    try:
        manifest = read_manifest(index_dir)
        if (isinstance(manifest, dict) and manifest.get("format") == FORMAT
                and manifest.get("corpus_sha256") == corpus_sha and len(manifest.get("shards") or ()) == shards):
            log(f"using the demo index at {index_dir}")
            return
    except FileNotFoundError:
        pass
    except UserError as err:  # damaged: the demo builds it again, as it builds a missing one
        log(f"rebuilding the demo index at {index_dir}: {err}")
    config = load_config(IndexJobConfig, corpus=str(CORPUS), overrides=[
        as_override("index.path", str(index_dir)), f"index.shards={shards}",
        f"embedder.replicas={os.cpu_count()}"])  # Ray gives each encoder actor one thread
    build_index(config, log=log, extra={"corpus_sha256": corpus_sha})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="runs/demo", help="answers, metrics and eval tables go here")
    p.add_argument("--index-dir", help="default: $RAGSIFT_HOME/indexes/demo")
    p.add_argument("--shards", type=int, default=2, help="index shards (default 2)")
    p.add_argument("--strategy", default="direct,rag", help="comma-separated (default direct,rag)")
    p.add_argument("--generator", default=DEFAULT_GENERATOR, help=f"generator model (default {DEFAULT_GENERATOR})")
    p.add_argument("--limit", type=int, help="only the first N sample questions")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an answer config field (not what the flags above set, nor how the index is built)")
    p.add_argument("--force", action="store_true",
                   help="replace a demo of other settings in --output (`make demo` does); without it that is refused")


# set by the demo's own flags; a --set of them was silently outranked or disagreed with the index it built
FLAGGED = {"output": "--output", "questions": "none: the demo's questions are fixed", "strategies": "--strategy",
           "limit": "--limit", "generator.model": "--generator"}


def run(args: argparse.Namespace) -> int:
    log = lambda *a, **k: print(*a, **k, file=sys.stderr)  # noqa: E731
    started = time.perf_counter()
    index_dir = Path(args.index_dir).expanduser() if args.index_dir else default_index_dir()  # as the index job's config
    check_kept(args.output)
    check_kept(str(index_dir), "--index-dir")
    for item in args.set:
        keys = parse_override(item)[0]  # read as load_config reads it: a quoted key may hold "." or "="
        key = ".".join(keys)
        flag = FLAGGED.get(key) or FLAGGED.get(keys[0])
        if key in ("generator", "index"):  # a whole section replaces the flags' fields inside it (path, model)
            raise UserError(f"demo --set {key}=...: set its fields one by one ({key}.<field>=...)")
        if flag:
            raise UserError(f"demo --set {key}: set by the demo's flags ({flag})")
        if key == "index.path" or built_with_index(key):
            raise UserError(f"demo --set {key}: the demo builds its own index (--index-dir / --shards); to build one "
                            "another way, use `ragsift index` and answer from it with `ragsift answer --index-dir`")
    config = load_config(  # checked before the index is built
        AnswerConfig, None, [as_override("index.path", str(index_dir)), as_override("generator.model", args.generator),
                             *args.set],
        questions=str(QUESTIONS), output=args.output, strategies=strategy_names(args.strategy), limit=args.limit,
    )
    for llm in (config.generator, config.judge):  # the models too, not after minutes of indexing
        if llm is not None:
            llm_settings(llm)
    ensure_index(index_dir, args.shards, log)
    metrics = answer(config, log=log, force=args.force)
    table, resolved = evaluate(args.output, str(QUESTIONS), k=config.retrieval.k, strategies=config.strategies)
    write_reports(table, args.output, resolved)
    log(f"demo finished in {time.perf_counter() - started:.0f} s; tables in {args.output}/eval.md")
    print_tables(table, resolved)
    return error_status("demo", metrics, config.commit.max_error_share)


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("demo", argv)


if __name__ == "__main__":
    sys.exit(main())
