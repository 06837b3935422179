"""``ragsift answer``: questions Parquet -> answers Parquet + run metrics.

Answers land in ``<output>/<strategy>/part-NNNNN.parquet``, one part per input shard, committed
atomically; re-running the same command resumes (jobs/output.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from contextlib import nullcontext, suppress
from pathlib import Path

from actors.judge_folders import card_of
from engine.loop import Engine
from jobs.cli import add_config_arguments, config_overrides, run_job, strategy_names
from jobs.engine_actors import Todo, run_engines
from jobs.identity import (
    calibration_record,
    code_version,
    identity_defaults,
    operational,
    run_identity,
    run_metadata,
    same_model,
)
from jobs.lease import Lease
from jobs.live_metrics import RayMetrics
from jobs.models import pinned
from jobs.output import REFUSED_HINT, ShardedOutput, check_failed, check_resumable, claimed, unfinished
from jobs.pools import build_stages, llm_engines_stopped, pool_plan, ray_request
from jobs.progress import Progress
from jobs.question_sources import materialize_questions
from jobs.questions import plan_input, question_rows, value_counts
from jobs.request_cache import open_cache
from jobs.storage import cannot_write, check_kept, filesystem, read_only, redact, write_whole
from schemas.config import dump_yaml, load_config, validated
from schemas.errors import UserError
from strategies.forms import misnamed
from strategies.registry import STRATEGIES, AnswerConfig, make_strategy


def answer(config: AnswerConfig, log=print, force: bool = False, stages: dict | None = None,
           retry_errors: bool = False, cache=None) -> dict:
    """Answer ``config.questions`` into ``config.output``; resumes a previous run of the same config,
    and with ``retry_errors`` answers its error rows again (in place, each id still once).

    ``stages`` replaces the actor pools (tests use stub actors); by default they are built from config.
    ``cache`` (jobs/request_cache.py) may be shared by runs on the same ``stages`` (a sweep, a Session);
    by default it is the disk cache of ``config``'s pools, or memory only where ``stages`` are given.
    """
    if not config.questions or not config.output:
        raise UserError("answer needs `questions` and `output` (pass --questions and --output)")
    check_kept(config.output)
    config = with_models_pinned(config)  # a Session's config too
    plan = plan_input(config.questions, limit=config.limit)  # validates the schema before any actor starts
    if not plan.rows:  # before: Ray started and the models loaded to answer nothing, exit 0
        raise UserError(f"{redact(config.questions)} holds no questions to answer (0 rows)")
    if retry_errors and force:  # --force would discard every answer whose errors --retry-errors is to answer again
        check_output(config, plan=plan, hint="--retry-errors answers its error rows with the run's own config, which "
                                             "--force does not change: give that config, or leave out --retry-errors")
    if plan.duplicate_rows:  # said only in metrics.json before: a label run's counts did not add up to the rows given
        n = len(plan.duplicate_rows)
        log(f"{n} question {'row repeats' if n == 1 else 'rows repeat'} an earlier row's id: each id is answered once, "
            "for its first row (duplicate_ids_dropped in metrics.json)")
    for said in misnamed(value_counts(config.questions, "kind", plan.rows),
                         value_counts(config.questions, "dataset", plan.rows), config.answer_form):
        log(f"warning: {said}")
    if calibrated_on(config, plan.sha256):
        log(f"warning: these questions are the slice this config's thresholds were calibrated on "
            f"({config.calibration.questions}): its scores here are fitted, not measured")
    if said := calibrated_for_others(config):
        log(f"warning: {said}")
    if said := cut_not_taken(config):
        log(f"warning: {said}")
    strategies = {n: make_strategy(n, config) for n in config.strategies}
    needs = set().union(*(s.stages for s in strategies.values()))
    learned = know_labels_generator(config.know.model) if "know" in needs else None
    if learned is not None and not same_model(learned, config.generator.model):  # an alias and its folder are one
        log(f"warning: know.model {config.know.model} learned the closed-book answers of {learned} "
            f"(its card), not of this run's generator {config.generator.model}: it predicts that model's")
    # a fresh output is claimed only after the index and the models are checked (pool_plan reads the
    # index manifest and resolves every model name): a mistyped --index-dir must not leave a manifest
    # behind, nor (with --force) discard an output it cannot replace. A finished output is left alone
    # before that: "nothing to do" needs neither.
    if read_only(config.output):
        return _finished_read_only(config, plan, log, force or retry_errors)
    pools = pool_plan(config, needs) if stages is None and (force or not claimed(config.output)) else None
    with Lease(config.output, log=log) as lease:  # one driver per output: a second one is refused, naming the first
        return _answer(config, plan, strategies, needs, pools, stages, log, force, retry_errors, cache, lease.check)


def _finished_read_only(config: AnswerConfig, plan, log, writes: bool) -> dict:
    """A rerun over a finished output this process cannot write (a pipeline that runs `answer` before it
    evaluates, on a node that mounts the runs read-only) has nothing to do, as anywhere; its lease, a file,
    failed with EROFS. An output that needs writing is refused in one line, before Ray starts."""
    identity = run_identity(config, plan)
    check_resumable(config.output, identity, identity_defaults(), operational)  # a different run: refused first
    missing = [s for s in config.strategies if not os.path.isdir(os.path.join(config.output, s))]
    if writes:
        why = "--force and --retry-errors write there"
    elif short := unfinished(config.output, set(config.strategies)):
        why = short
    elif missing:
        why = f"it has no answers of {', '.join(missing)}"
    elif not claimed(config.output):
        why = "it holds no run"
    else:
        why = _not_whole(config, plan, identity, log)
    if why:
        raise cannot_write(config.output, why, "answer into a folder it can write (--output)")
    log(f"nothing to do: every strategy's parts of {config.output} are committed (read-only here: nothing written)")
    return previous_metrics(config.output) or {}


def _not_whole(config: AnswerConfig, plan, identity: dict, log) -> str | None:
    """Why a finished output this process cannot write is not whole, as a resume would find it (a part's checksum
    or footer, each question's row once per strategy); None where it is."""
    out = ShardedOutput(config.output, identity, config.strategies, config.commit.shard_rows,
                        log=log, defaults=identity_defaults(), speed=operational, read_only=True)
    if out.damaged:
        return (f"{len(out.damaged)} part(s) fail the checks a resume makes ({', '.join(out.damaged[:3])}: damaged, "
                "or of another run) and would be answered again")
    wrong = check_failed(out.verify(plan, config.questions, config.input.read_batch_rows, config.input.max_question_chars))
    return f"its exactly-once check fails ({wrong})" if wrong else None


def know_labels_generator(model: str | None) -> str | None:
    """The generator whose labels a trained M_know learned, from its card (None: no card says)."""
    from jobs.models import resolve

    try:
        return card_of(Path(resolve(model))).get("labels_generator") if model else None
    except FileNotFoundError:  # an alias not prepared: the pools say so
        return None


def check_output(config: AnswerConfig, force: bool = False, plan=None, hint: str = REFUSED_HINT) -> None:
    """Refuse an output that holds a different run (unless ``force``), as ``answer`` does when it opens it, for a
    job that runs several answers: a sweep found it only when it reached that value, after the values before."""
    plan = plan or plan_input(config.questions, limit=config.limit)
    check_resumable(config.output, run_identity(config, plan), identity_defaults(), operational, force, hint)


def calibrated_for_others(config: AnswerConfig) -> str | None:
    """What says that this run's models are not those its config's thresholds were calibrated with (they are
    cuts on those models' scores); None where they are, or nothing was calibrated."""
    record = calibration_record(config) or {}
    models = {k: v for k, v in record.get("overridden", {}).items() if k in ("generator", "judge", "ranker")}
    if not models:
        return None
    return ("this config's thresholds were calibrated with " + ", ".join(f"{k} {record[k]}" for k in models)
            + " (its calibration record), this run has " + ", ".join(map(str, models.values()))
            + ": they are cuts on those models' scores; `ragsift calibrate` for these")


def cut_not_taken(config: AnswerConfig) -> str | None:
    """Which strategies of the run answer claims in text that ``answer_form.verdict_cut`` does not decide."""
    if config.answer_form.verdict_cut is None:
        return None
    text = [s for s in config.strategies if s == "self_reasoning" or (s == "migres" and config.migres.answer_step == "main")]
    return (f"answer_form.verdict_cut decides a claim's verdict where it is a choice; {' and '.join(text)} "
            f"{'answers claims from its' if len(text) == 1 else 'answer claims from their'} own text "
            "(Self-Reasoning's trajectory, MIGRES's main module), where it does not") if text else None


def calibrated_on(config: AnswerConfig, sha256: str | None) -> bool:
    """Whether the questions of ``sha256`` are the slice ``config`` was calibrated on: its file as the user gave
    it, or the copy ragsift converted it into (a JSON Lines slice given again converts to that copy)."""
    record = config.calibration
    return bool(record and sha256 and sha256 in (record.questions_sha256, record.converted_sha256))


def _answer(config: AnswerConfig, plan, strategies: dict, needs: set[str], pools, stages, log, force: bool,
            retry_errors: bool, cache, guard=None) -> dict:
    identity = run_identity(config, plan)
    out = ShardedOutput(config.output, identity, config.strategies, config.commit.shard_rows,
                        config.commit.row_group_rows, force=force, log=log, defaults=identity_defaults(), guard=guard,
                        speed=operational, code=code_version())
    try:
        return _answer_into(out, identity, config, plan, strategies, needs, pools, stages, log, retry_errors, cache)
    except BaseException:
        # the parts --retry-errors reopened, when the start (Ray, the pools, the cache) fails before the
        # engine's own try: no .tmp stream is left open, and a failing close does not hide why the run failed
        with suppress(Exception):
            out.close()
        raise


def _answer_into(out: ShardedOutput, identity: dict, config: AnswerConfig, plan, strategies: dict, needs: set[str],
                 pools, stages, log, retry_errors: bool, cache) -> dict:
    from jobs.ray_session import init_ray

    retried = out.reopen_errors() if retry_errors else 0
    if retried:
        log(f"--retry-errors: answering {retried} error rows of {len(out.retrying)} committed parts again")
    skip = out.skip_shards()
    shard_rows = config.commit.shard_rows
    sizes = plan.shard_sizes(shard_rows)
    for shard, questions_in_shard in sizes.items():
        if shard not in skip:
            out.sealed(shard, questions_in_shard)
    if sizes and skip >= set(sizes):  # nothing to do: no Ray, no models, and the run's metrics stay as they are
        out.close()
        check = out.verify(plan, config.questions, config.input.read_batch_rows, config.input.max_question_chars)
        if wrong := check_failed(check):  # whole parts, each as committed, that together hold a question twice or none
            raise UserError(f"{redact(config.output)}: every part is committed, but its exactly-once check fails "
                            f"({wrong}): parts changed after their commit? --force answers the questions afresh")
        log(f"nothing to do: all {len(sizes)} input shards of {redact(config.output)} are committed for every "
            "strategy, every input id once per strategy")
        previous = previous_metrics(config.output) or {}
        checked, files = previous.get("exactly_once") or {}, previous.get("files") or {}
        names = lambda paths: [p.rsplit("/", 1)[-1] for p in paths or []]  # noqa: E731 - the output may be spelt otherwise
        if all(checked.get(s) == check[s] and names(files.get(s)) == names(out.files(s)) for s in check):
            return previous
        # the session that committed the last part stopped before writing its record (or wrote it for
        # other strategies): the record is made to cover these strategies too; their counts are not known
        metrics = {**(previous or {**run_metadata(config, identity),
                                   "covers": "no session's work: recorded by a rerun that found every part committed"}),
                   "exactly_once": {**checked, **check}, "files": {**files, **{s: out.files(s) for s in check}}}
        write_record(config.model_copy(update={"strategies": list(dict.fromkeys([*files, *config.strategies]))}), metrics)
        return metrics
    # a killed run leaves parts of some strategies only: the shards no strategy needs are skipped, and
    # what each strategy has is said too (those parts are not this session's work, nor in its counts)
    resumed = {s: sum(1 for st, shard in out.committed if st == s and shard in sizes) for s in config.strategies}
    if any(resumed.values()):
        log(f"resuming: {len(skip)} of {len(sizes)} input shards committed for every strategy; parts committed "
            "before: " + ", ".join(f"{s} {n}/{len(sizes)}" for s, n in resumed.items()))
    # how the questions still to answer are read: here, or by each engine actor (every n-th of them)
    read = dict(uri=config.questions, batch_rows=config.input.read_batch_rows, limit=config.limit,
                shard_rows=shard_rows, skip_shards=skip, drop_rows=plan.duplicate_rows,
                max_chars=config.input.max_question_chars, null_id_prefix=plan.null_id_prefix)

    stages_from_config = stages is None
    split = config.engine.actors > 1
    if stages is None:
        pools = pools or pool_plan(config, needs)
        init_ray(config.ray, *ray_request(config, pools))
        stages = build_stages(config, needs, pools)
    # stages may come from an earlier run (a Session's last call, a sweep's last value, calibrate's probe):
    # each run's metrics.json and Ray counters count its own work
    for stage in stages.values():
        stage.stats = type(stage.stats)()
    metadata = run_metadata(config, identity)
    total = out.pairs_todo(sizes)
    progress = Progress(log, total)
    live = RayMetrics(redact(absolute(config.output)), total)  # the same counters for Prometheus / the Ray dashboard

    def report(engine: Engine) -> None:
        progress(engine)
        live(engine)

    # pools that are not config's (a test's stubs) must not fill the disk cache of config's models
    cache = cache if cache is not None else open_cache(config, disk=stages_from_config)
    mark = cache.run_mark()  # a cache shared with earlier runs holds their counts: metrics.json has this run's
    # left to Ray's exit, an engine core outlived the command holding its memory: the engines are stopped
    # once the parts are committed or given up (out.close), however the run ends
    with llm_engines_stopped(stages) if stages_from_config else nullcontext():
        try:
            if split:
                # each engine actor opens the disk part of the cache (a sweep's or a Session's too); its memory
                # part is the actor's own, so a request two engines make alike is computed by each
                engine_metrics = run_engines(config.engine.actors, stages, strategies, config, read,
                                             Todo(out.committed, out.retrying), out.write, report, log,
                                             cache=cache, report_every_s=progress.every_s, mark=mark)
                roots_done = engine_metrics["roots_done"]
            else:
                engine = Engine(stages, strategies, config.engine, out.write, on_progress=report,
                                progress_every_s=progress.every_s, log=log, cache=cache)
                engine.run(question_rows(**read), config.strategies, todo=lambda strategy, q: out.todo(strategy, q.shard, q.id))
                engine_metrics, roots_done = engine.metrics(), engine.roots_done
                engine_metrics["request_cache"].update(cache.counts_since(mark))
        finally:
            progress.close()
            left = out.close()
    check = out.verify(plan, config.questions, config.input.read_batch_rows, config.input.max_question_chars)

    metrics = {**metadata, "covers": "this session's work; exactly_once covers the whole output",
               **engine_metrics, "duplicate_ids_dropped": len(plan.duplicate_rows),
               "shards_resumed": len(skip), "parts_resumed": resumed,
               "errors_retried": retried, "parts_committed": out.commits, "exactly_once": check,
               "error_rows": by_strategy(out.error_rows),
               "files": {s: out.files(s) for s in config.strategies}}
    write_record(config, metrics)
    if given_up := (metrics.get("request_cache") or {}).get("disk_error"):  # said only in metrics.json before
        log(f"warning: this run gave up its request cache on disk: {given_up}")
    if unsaved := (metrics.get("request_cache") or {}).get("unsaved"):
        log(f"warning: {unsaved} responses of this run were not saved to the request cache on disk: another process "
            "held its file locked (a rerun computes them again)")
    if left or not all(c["ok"] for c in check.values()):
        raise RuntimeError(f"output incomplete: uncommitted parts {left[:5]}, check {check}")
    log(f"answered {roots_done} (question, strategy) pairs in {metrics['wall_s']} s -> "
        f"{redact(config.output)}; every input id once per strategy{errors_said(out.error_rows)}")
    return metrics


def by_strategy(error_rows: Counter) -> dict[str, int]:
    counts: Counter = Counter()
    for (strategy, _), n in error_rows.items():
        counts[strategy] += n
    return dict(sorted(counts.items()))


def errors_said(error_rows: Counter) -> str:
    """The error rows this session wrote and their commonest reason: a run whose every row was an error (its
    prompts over the context window) ended with the same line as one that answered every question."""
    if not error_rows:
        return ""
    reasons: Counter = Counter()
    for (_, why), n in error_rows.items():
        reasons[why] += n
    why, n = reasons.most_common(1)[0]
    counts = by_strategy(error_rows)
    return (f"; {sum(counts.values())} of them error rows ({', '.join(f'{s} {c}' for s, c in counts.items())}), "
            f"most often \"{why}\" ({n}): each row's `error` says why, `--retry-errors` answers them again")


def write_record(config: AnswerConfig, metrics: dict) -> None:
    """metrics.json and the resolved config.yaml, each written beside and moved into place (whole or not at
    all: a run killed while writing one left it damaged)."""
    resolved = config.model_dump(mode="json")
    # local paths made absolute: `--config config.yaml` from another folder read `questions: data/q.parquet`
    # relative to where it ran, and failed, or wrote a new output
    resolved.update(questions=redact(absolute(config.questions)), output=redact(absolute(config.output)))
    if resolved["index"]["path"]:
        resolved["index"]["path"] = absolute(resolved["index"]["path"])
    if resolved["cache"]["path"]:
        resolved["cache"]["path"] = absolute(resolved["cache"]["path"])
    # whether a rerun uses the disk cache is the rerun's to say (--no-cache, RAGSIFT_NO_CACHE): recorded, the
    # default `enabled: true` read back with `--config` outweighed RAGSIFT_NO_CACHE=1
    resolved["cache"].pop("enabled")
    fs, root = filesystem(config.output)
    record = {"metrics.json": json.dumps(metrics, indent=2), "config.yaml": dump_yaml(resolved)}
    for name, data in record.items():
        write_whole(fs, f"{root}/{name}", data.encode())


def absolute(uri: str) -> str:
    """A local path as an absolute one; a URI (``s3://``, ``hf:NAME``) as it is."""
    return uri if "://" in uri or uri.startswith("hf:") else os.path.abspath(uri)


def previous_metrics(output: str) -> dict | None:
    fs, root = filesystem(output)
    try:
        with fs.open_input_stream(f"{root}/metrics.json") as f:
            return json.loads(f.read())
    except (OSError, json.JSONDecodeError):  # none yet, or not readable: the caller says what it knows
        return None


QUESTIONS_HELP = ("questions (id, question[, answers...]): Parquet, JSON Lines (FlashRAG's too), CSV or an OpenAI "
                  "batch input file (local, s3://, gs://), a datasets save_to_disk directory or hf:NAME")
# strategies that are steps of other jobs (calibrate's probe, label's RA-ISF labelling), not answers to compare
INTERNAL = ("calibration_probe", "raisf_labels")


def add_arguments(p: argparse.ArgumentParser, retry_errors: bool = True, strategy_help: str | None = None,
                  output_help: str | None = None) -> None:
    """``answer``'s flags; the jobs built on it (compare, calibrate, label, sweep) share them, and those that
    do not answer error rows again pass ``retry_errors=False`` rather than accept a flag they ignore; a job
    whose strategies are its own says so in ``strategy_help`` (``argparse.SUPPRESS``: it takes none)."""
    p.add_argument("--questions", help=f"{QUESTIONS_HELP}; rename columns with --set input.columns=...")
    p.add_argument("--output", help=output_help or "output directory: <strategy>/part-NNNNN.parquet, metrics.json, "
                   "config.yaml")
    p.add_argument("--index-dir", help="index directory (index.path)")
    p.add_argument("--strategy", help=strategy_help or
                   f"comma-separated, from {sorted(s for s in STRATEGIES if s not in INTERNAL)}")
    p.add_argument("--generator", help="generator model: offline alias, local path or hub name")
    p.add_argument("--limit", type=int, help="answer only the first N questions")
    p.add_argument("--force", action="store_true",
                   help="discard existing output written with a different config instead of refusing")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the disk request cache (cache.enabled=false); a sweep's values "
                        "then share no request either")
    if retry_errors:
        p.add_argument("--retry-errors", action="store_true",
                       help="answer the error rows of an existing output again, in place (the other rows are kept)")
    add_config_arguments(p)


def config_from_args(args: argparse.Namespace, default_strategies: tuple[str, ...] = (),
                     strategies: list[str] | None = None) -> AnswerConfig:
    """The config from defaults, --config, --set and flags; ``default_strategies`` (a job's own default)
    applies only when neither --strategy nor the config file names strategies; ``strategies`` (a job
    that runs its own, e.g. calibrate's probe) replaces them. Either way the strategies' own checks run.
    Its ``questions`` are the file the run reads: the user's, or its converted copy (``with_questions_read``)."""
    return with_questions_read(given_config(args, default_strategies, strategies))


def given_config(args: argparse.Namespace, default_strategies: tuple[str, ...] = (),
                 strategies: list[str] | None = None) -> AnswerConfig:
    """``config_from_args`` with the questions as the user named them (a JSON Lines file, a ``datasets``
    folder, ``hf:NAME``), not yet converted."""
    overrides = config_overrides(args, {"index_dir": "index.path", "generator": "generator.model"})
    overrides += ["cache.enabled=false"] if getattr(args, "no_cache", False) else []
    chosen = strategy_names(args.strategy)
    config = load_config(AnswerConfig, args.config, overrides, questions=args.questions,
                         output=args.output, strategies=chosen, limit=args.limit)
    if strategies or (default_strategies and "strategies" not in config.model_fields_set):
        config = validated(AnswerConfig, {**config.model_dump(exclude_unset=True),
                                          "strategies": list(strategies or default_strategies)})
    if not (config.questions and config.output):
        raise UserError("needs questions and an output: pass --questions and --output (or set `questions` and "
                        "`output` in the config)")
    check_kept(config.output)  # before with_questions_read converts the questions into it
    return with_models_pinned(config)


MODEL_SECTIONS = ("generator", "judge", "embedder", "reranker", "nli", "know")


def with_models_pinned(config: AnswerConfig) -> AnswerConfig:
    """``config`` with every model named by a relative local path made absolute (jobs/models.py ``pinned``):
    the run's identity and its recorded config.yaml then name the folder it loaded."""
    updates = {}
    for name in MODEL_SECTIONS:
        section = getattr(config, name)
        if section is not None and (path := pinned(section.model)) != section.model:
            updates[name] = section.model_copy(update={"model": path})
    return config.model_copy(update=updates) if updates else config


def with_questions_read(config: AnswerConfig) -> AnswerConfig:
    """``config`` with ``questions`` the Parquet file a run reads: the user's own, or the copy of theirs
    converted into ``<output>/_input/`` (jobs/question_sources.py)."""
    questions = materialize_questions(config.questions, config.output, config.input.columns, config.input.split)
    return config.model_copy(update={"questions": questions})


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    metrics = answer(config, log=lambda *a: print(*a, file=sys.stderr), force=args.force,
                     retry_errors=args.retry_errors)
    return error_status("answer", metrics, config.commit.max_error_share)


ERROR_ROWS_STATUS = 3  # not 1, which any uncaught exception exits with


RETRY_HINT = "`--retry-errors` answers them again"


def error_status(job: str, metrics: dict, limit: float | None, hint: str = RETRY_HINT) -> int:
    """A finished run's exit status: ERROR_ROWS_STATUS where its output's error rows are over ``limit`` (a
    share of all its rows, every strategy's; None: where every row is an error row), else 0. A run whose every
    prompt was over the context window exited 0, and a `set -e` pipeline published its error rows as answers.
    The whole output, not this session's part: a resume that answered the last questions well ended 0 over
    a run of error rows."""
    checks = (metrics.get("exactly_once") or {}).values()
    rows, errors = sum(c.get("rows", 0) for c in checks), sum(c.get("errors", 0) for c in checks)
    if not rows or not errors or (errors < rows if limit is None else errors / rows <= limit):
        return 0
    why = "all of them" if limit is None else f"more than commit.max_error_share {limit}"
    print(f"ragsift {job}: error: {errors} of the output's {rows} rows are error rows ({why}); all are committed: "
          f"each row's `error` says why, and {hint}", file=sys.stderr)
    return ERROR_ROWS_STATUS


def main(argv: list[str] | None = None) -> int:
    return run_job("answer", argv)


if __name__ == "__main__":
    sys.exit(main())
