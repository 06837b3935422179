"""``ragsift compare``: answer a question set with several strategies, then evaluate them side by side.

The table (strategies x datasets: EM, F1, accuracy, citations, LLM calls, retrievals, sub-questions,
tokens, latency per question) is printed and written as eval.md / eval.json / eval.png next to the
answers. The questions file needs gold `answers` (and `dataset`, `gold_passage_ids` where known).
Without --strategy (or `strategies` in the config file) every answering strategy runs.
"""

from __future__ import annotations

import argparse
import sys

from jobs import answer as answer_job
from jobs.evaluate import evaluate, gold_columns, print_tables, write_reports
from jobs.storage import redact
from strategies.registry import ANSWERING


def add_arguments(p: argparse.ArgumentParser) -> None:
    answer_job.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    config = answer_job.config_from_args(args, default_strategies=ANSWERING)
    gold_columns(config.questions)  # the gold columns are checked before hours of answering
    metrics = answer_job.answer(config, log=lambda *a: print(*a, file=sys.stderr), force=args.force,
                                retry_errors=args.retry_errors)
    # only what this run answered, every question of it: another strategy left in the folder by an
    # earlier, interrupted run would sit in the same table scored on other questions
    table, resolved = evaluate(config.output, config.questions, k=config.retrieval.k, strategies=config.strategies)
    write_reports(table, config.output, resolved)
    print(f"wrote eval.md, eval.json and eval.png into {redact(config.output)}", file=sys.stderr)
    print_tables(table, resolved)
    return answer_job.error_status("compare", metrics, config.commit.max_error_share)


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("compare", argv)


if __name__ == "__main__":
    sys.exit(main())
