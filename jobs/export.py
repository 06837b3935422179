"""``ragsift export``: a run's answers as JSON Lines other tools read.

    ragsift export --answers out --format openai-batch --to out/answers.jsonl [--strategy rag]

openai-batch  one line per (question, strategy) as vLLM's ``run-batch`` and the OpenAI Batch API write
              their output: ``{"id", "custom_id": <question id>, "response": {"status_code": 200,
              "request_id", "body": <a chat.completion whose message is the answer>}, "error": null}``;
              an error row has status 500, no body, and its error. ``custom_id`` is the question id,
              so the lines match an OpenAI batch input file read as questions (jobs/formats.py).
              ``finish_reason`` is "length" when a generation of the row stopped at its max_tokens
              (``n_truncated`` > 0: for direct and rag, whose one generation is the answer, the answer was
              cut off; for the other strategies a step was, which may or may not have cost the answer),
              else "stop" (also for rows written before ragsift counted cut-off generations). The answer
              is a strategy's final answer, cleaned (a short answer is its first line), not one
              generation's text.
rows          every column of the answer rows, one JSON object a line (lists stay lists).

With several strategies in the run, ``--strategy`` picks one for openai-batch (one answer per
custom_id); rows takes them all. Streamed a Parquet file at a time: parts in input order, and within a
part in the order its questions were answered (as the OpenAI Batch API, which promises no order; vLLM's
``run-batch`` keeps the input's): match lines by ``custom_id``. A run that is not finished (a part
missing: killed, or still answering) is refused unless ``--partial``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import uuid

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow.fs import FileType

from jobs.evaluate import answer_files, one_run
from jobs.output import unfinished
from jobs.storage import check_kept, filesystem, open_parquet, redact
from schemas.errors import UserError

# what each format reads of an answer row (rows takes what is there)
READ_COLUMNS = {"openai-batch": ("id", "strategy", "answer", "error", "prompt_tokens", "completion_tokens"),
                "rows": ("id", "strategy")}


def batch_line(row: dict, model: str) -> dict:
    request_id = f"ragsift-{row['strategy']}-{row['id']}"
    custom_id = str(row["id"])  # the batch format's custom_id is a string, whatever the id column held
    if row["error"] is not None:
        return {"id": f"ragsift-{uuid.uuid4().hex}", "custom_id": custom_id,
                "response": {"status_code": 500, "request_id": request_id, "body": None}, "error": row["error"]}
    prompt, completion = row["prompt_tokens"] or 0, row["completion_tokens"] or 0
    body = {"id": request_id, "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": row["answer"]},
                         "finish_reason": "length" if row.get("n_truncated") else "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    return {"id": f"ragsift-{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None}


def generator_model(path: str) -> str:
    """The generator the run answered with, from the run identity in the Parquet metadata."""
    meta = open_parquet(path).schema_arrow.metadata or {}
    identity = json.loads(meta.get(b"ragsift", b"{}"))
    return str(identity.get("generator.model") or "ragsift")


def strategies_of(part: str) -> set[str]:
    """The strategies a file answered, from its rows: a part's path says it only under an output
    directory, a file may be named on its own (``--answers part-00000.parquet``), and a file that is
    not a part may hold several."""
    return set(pc.unique(open_parquet(part).read(columns=["strategy"])["strategy"]).to_pylist())


def where(uri: str) -> tuple[str, str]:
    """Which file ``uri`` names: its filesystem's kind and its absolute path (local links resolved)."""
    fs, path = filesystem(uri)
    return fs.type_name, os.path.realpath(path) if fs.type_name == "local" else path


def check_readable(files: list[str], to: str, form: str) -> None:
    """Refuse before ``to`` is touched: writing it truncates it at once, so a file it names among the
    answers, or an answer file without a column the format reads, would lose what was there."""
    if where(to) in {where(f) for f in files}:
        raise UserError(f"--to {redact(to)} is one of the answer files it would read: write elsewhere")
    for f in files:
        missing = [c for c in READ_COLUMNS[form] if c not in open_parquet(f).schema_arrow.names]
        if missing:
            raise UserError(f"{redact(f)} has no column {missing}, which --format {form} reads: "
                            "export answers written by `ragsift answer` / `compare`")


def export(answers: str, to: str, form: str, strategy: str | None = None, partial: bool = False, log=None) -> int:
    # an empty part (a shard with no question) names no strategy
    files = [f for f in one_run(answers, answer_files(answers), "export") if open_parquet(f).metadata.num_rows]
    if strategy:
        files = [f for f in files if strategy in strategies_of(f)]
        if not files:
            raise UserError(f"no answers of strategy {strategy!r} in {redact(answers)}"
                            + (" (export takes one strategy, or every one without --strategy)" if "," in strategy else ""))
    elif form == "openai-batch" and len(set().union(*map(strategies_of, files))) > 1:
        raise UserError(f"{redact(answers)} holds several strategies: pick one with --strategy "
                        "(an OpenAI batch file has one response per custom_id)")
    # a batch file of 2 answers for 16 requests reads as complete to whoever is handed it
    if short := unfinished(answers, {strategy} if strategy else None):
        if not partial:
            raise UserError(f"{short}: finish it first (the same `ragsift answer` command resumes it), or pass "
                            "--partial to export the questions answered so far")
        (log or (lambda message: None))(f"--partial: {short}; exporting the questions answered so far")
    check_readable(files, to, form)
    fs, path = filesystem(to)
    if fs.get_file_info(path).type == FileType.Directory:
        raise UserError(f"--to {redact(to)} is a directory: name the file to write")
    if fs.type_name == "local":  # as answer's --output: a folder named for the file is made
        fs.create_dir(os.path.dirname(os.path.abspath(path)), recursive=True)
    # written beside ``to`` and moved over it at the end, so a failure leaves what ``to`` held; a pipe, a
    # link or a device (/dev/stdout) is written as it is: moving a file over it would replace it. The
    # name beside it is this export's own: a fixed ``<to>.tmp`` was a file of the user's, or another export's
    special = fs.type_name == "local" and (os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)))
    target = path if special else f"{path}.ragsift-{uuid.uuid4().hex[:12]}.tmp"
    lines = 0
    try:
        with fs.open_output_stream(target) as out:
            for f in files:
                model = generator_model(f)
                source_fs, source = filesystem(f)
                with source_fs.open_input_file(source) as handle:
                    for row in pq.read_table(handle).to_pylist():
                        if strategy and row["strategy"] != strategy:
                            continue
                        if row.get("step_tokens") is not None:  # an Arrow map reads as (key, value) pairs
                            row["step_tokens"] = dict(row["step_tokens"])
                        record = batch_line(row, model) if form == "openai-batch" else row
                        out.write((json.dumps(record, default=str) + "\n").encode())
                        lines += 1
        if not special:
            fs.move(target, path)
    except BaseException:
        if not special:
            with contextlib.suppress(OSError):  # it may not have been created
                fs.delete_file(target)
        raise
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--answers", required=True, help="an answer / compare output directory (or one Parquet file)")
    p.add_argument("--to", required=True, help="the JSON Lines file to write (local, s3://, gs://; - for stdout)")
    p.add_argument("--format", choices=["openai-batch", "rows"], default="openai-batch",
                   help="openai-batch: vLLM run-batch's output file, a response per custom_id (default); rows: the "
                        "answer rows as JSON Lines")
    p.add_argument("--strategy", help="only this strategy's answers")
    p.add_argument("--partial", action="store_true",
                   help="export a run that is not finished (killed, or still answering): the questions answered so far")


def run(args: argparse.Namespace) -> int:
    if args.strategy is not None and not args.strategy.strip():
        raise UserError(f"--strategy {args.strategy!r}: names no strategy (leave it out for every strategy's answers)")
    to = "/dev/stdout" if args.to == "-" else args.to  # as other tools' "-": it wrote a file named "-"
    check_kept(to, "--to")
    lines = export(args.answers, to, args.format, args.strategy, args.partial,
                   log=lambda message: print(message, file=sys.stderr))
    print(f"wrote {lines} lines ({args.format}) to {redact(to)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("export", argv)


if __name__ == "__main__":
    sys.exit(main())
