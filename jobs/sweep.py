"""``ragsift sweep``: one answer run per value of a config field, then a table and a chart.

    ragsift sweep --param think_act.beta_threshold --values 0,0.25,0.5,0.75,1 \\
        --questions q.parquet --index-dir idx --output runs/beta --strategy think_act

Runs go to ``<output>/<param>=<value>/`` (each resumable like ``answer``); the actor pools are built
once and shared by all runs. ``sweep.md`` / ``sweep.json`` / ``sweep.png`` hold, per value, accuracy,
F1, the retrieval ratio (share of questions that retrieved: Think-then-Act's Figure 3) and LLM calls
per question (its Figure 4 is this sweep over beta').
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from jobs import answer as answer_job
from jobs.answer import previous_metrics
from jobs.evaluate import answer_files, evaluate, gold_columns
from jobs.identity import POOL_SECTIONS, sections_unread
from jobs.pools import build_stages, llm_engines_stopped, pool_plan, ray_request
from jobs.questions import plan_input
from jobs.request_cache import open_cache
from jobs.storage import filesystem, join, read_table
from schemas.config import ConfigError, built_with_index, parse_override
from strategies.registry import make_strategy

READY_WAIT_S = 600.0  # for the pools before the first value; a replica still starting after it is the engine's wait


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", required=True, help="dotted config field, e.g. think_act.beta_threshold")
    p.add_argument("--values", required=True,
                   help="comma-separated values, each parsed as YAML (a comma inside [], {} or quotes is the value's: "
                        "'[a, b],[c]' is two lists); a list that starts with '-' is written --values=-1,0")
    answer_job.add_arguments(p, retry_errors=False)


def run(args: argparse.Namespace) -> int:
    from jobs.ray_session import init_ray

    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    # refused before the base config converts the questions: `input` is read then, once for every value
    given = args.param
    args.param = args.param.strip()  # as the values are: " retrieval.k" named a folder " retrieval.k=1"
    if not args.param:
        raise ConfigError(f"sweep --param {given!r}: name the config field to vary, e.g. think_act.beta_threshold")
    if "=" in args.param:
        raise ConfigError(f"sweep --param {given!r}: name the field alone; its values go in --values")
    key = f"{args.param}="
    try:
        section = parse_override(key)[0][0]  # as --set reads a key: a quoted part may hold "."
    except ConfigError as err:  # said of --param, not of the override "NAME=" it was read as
        raise ConfigError(f"sweep --param {args.param!r}: {str(err).removeprefix(f'override {key!r}: ')}") from None
    if section in ("cache", "ray", "output", "questions", "input"):
        raise ConfigError(f"sweep --param {args.param}: the values share one run's {section} "
                          "(set once, from the base config); set it with --set instead")
    base = answer_job.config_from_args(args)
    if base.questions:  # scored against gold: checked before any value is answered, not after the first
        gold_columns(base.questions)
    check_read(base, args.param, section)
    configs = distinct_values(base, args.param, args.values)
    needs = stages_needed(base)
    pools = pool_plan(base, needs)
    plans = {}
    for value, config in configs:
        check_shared_pools(base, config, needs, pools, f"{args.param}={value}")
        # an earlier run in a value's folder was refused when the sweep reached it, after the values before
        if config.limit not in plans:
            plans[config.limit] = plan_input(config.questions, limit=config.limit)
        answer_job.check_output(config, force=args.force, plan=plans[config.limit])
    init_ray(base.ray, *ray_request(base, pools))
    stages = build_stages(base, needs, pools)
    with llm_engines_stopped(stages):
        return _sweep(args, base, configs, stages, log)


def _sweep(args, base, configs, stages: dict, log) -> int:
    import ray

    started = time.perf_counter()
    # the first value to answer waited for the replicas to start (50 s of its 63 s), so times did not compare
    # waited on, not got: a replica that cannot start (or keeps dying as it starts) is the engine's to report
    probes = [stage.probe(r) for stage in stages.values() for r in range(len(stage.replicas))]
    done, _ = ray.wait(probes, num_returns=len(probes), timeout=READY_WAIT_S)
    if len(done) == len(probes):
        log(f"the actor pools are ready ({time.perf_counter() - started:.1f} s, in no value's time)")
    else:
        log(f"{len(probes) - len(done)} of {len(probes)} replicas not ready after {READY_WAIT_S:.0f} s: the first "
            "value's time includes their start")
    # the values share the pools, so a request two values make alike is computed once for all of them
    cache = open_cache(base) if base.cache.enabled else None
    rows, status = [], 0
    for value, config in configs:
        log(f"--- {args.param}={value}")
        before = previous_metrics(config.output)
        metrics = answer_job.answer(config, log=log, force=args.force, stages=stages,
                                    cache=cache)
        status = max(status, answer_job.error_status(f"sweep ({args.param}={value})", metrics,
                                                     config.commit.max_error_share))
        table, _ = evaluate(config.output, config.questions, k=config.retrieval.k)
        for strategy in config.strategies:
            answers = [n for f in answer_files(join(config.output, strategy))
                       for n in read_table(f, ["n_retrievals"])["n_retrievals"].to_pylist()]
            overall = next(r for r in table if r["strategy"] == strategy and r["dataset"] == "ALL")
            rows.append({"value": field_value(config, args.param), "strategy": strategy, "acc": overall["acc"],
                         "F1": overall["F1"],
                         "retrieval ratio": round(100 * sum(n > 0 for n in answers) / len(answers), 1),
                         "LLM calls/q": overall["LLM calls/q"]})
        if metrics == before:  # nothing to answer: the figures are an earlier session's
            log(f"{args.param}={value}: answered before ({metrics.get('wall_s')} s then)")
        else:
            log(f"{args.param}={value}: {metrics['wall_s']} s, {metrics['requests_deduped']} requests answered from the cache")
    write(rows, args.param, base.output)
    return status


def distinct_values(base, param: str, values: str) -> list[tuple[str, object]]:
    """Each comma-separated value (trimmed) with its config, once per value the config validates to: "0, 0.5"
    named a folder "= 0.5", and "1,1e0" or "true,yes" answered the same setting twice, in two folders."""
    kept, seen = [], []
    for value in (v.strip() for v in top_level_values(values)):
        if not value:  # YAML reads it as null: a trailing comma swept a run of "none"
            raise ConfigError(f"sweep --values {values!r}: an empty value (write null for none)")
        config = with_value(base, param, value)
        setting = field_value(config, param)
        if setting not in seen:
            seen.append(setting)
            kept.append((value, config))
    return kept


def top_level_values(text: str) -> list[str]:
    """``text`` cut at each comma outside [], {} and a quoted scalar: a list or mapping value keeps its own
    commas. A quote opens a scalar only where one begins (``it's`` is plain text)."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1  # an escaped character, a quote among them
            elif ch == quote == "'" and text[i + 1:i + 2] == "'":
                i += 1  # '' inside '...' is one quote
            elif ch == quote:
                quote = None
        elif ch in "'\"" and text[:i].rstrip()[-1:] in ("", ",", "[", "{", ":"):
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth <= 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    return [*parts, text[start:]]


def field_value(config, param: str):
    """The value ``config`` holds at the dotted ``param``, as validated."""
    node = config.model_dump(mode="json")
    for key in parse_override(f"{param}=")[0]:
        node = node[key]
    return node


def check_read(base, param: str, section: str) -> None:
    """A setting no value can change the answers by would sweep N identical runs and a flat table: a strategy's
    own section (or ``label``, the label job's) that no strategy of the run reads (think_act.beta_threshold
    with --strategy rag), a pool's that no strategy asks for (judge.model with rag), or how the index is built."""
    if section in sections_unread(base):
        unread, fix = ((f"asks for the {section} pool", "run a strategy that asks for it") if section in POOL_SECTIONS.values()
                       else (f"reads the {section} section", "add --strategy to run one that does"))
        raise ConfigError(f"sweep --param {param}: no strategy of this run ({', '.join(base.strategies)}) {unread}, "
                          f"so every value would answer alike; {fix}")
    if built_with_index(".".join(parse_override(f"{param}=")[0])):
        raise ConfigError(f"sweep --param {param}: set when the index is built (a run searches its index as built), so "
                          "every value would answer alike; build an index per value with `ragsift index` and answer "
                          "each with `ragsift answer --index-dir`")


def stages_needed(config) -> set[str]:
    return set().union(*(make_strategy(n, config).stages for n in config.strategies))


def check_shared_pools(base, config, needs: set[str], pools: dict, what: str) -> None:
    """A sweep starts its pools once, from the base config: a value that would change them (a model,
    sampling, the index, a stage's batching or retrieval settings, or which pools the strategies ask
    for, e.g. raisf.judges) would silently not apply, or fail the run after the values before it."""
    if (not stages_needed(config) <= needs or pool_plan(config, needs) != pools or config.engine != base.engine
            or config.retrieval.model_copy(update={"k": base.retrieval.k}) != base.retrieval):
        raise ConfigError(f"sweep {what}: this setting configures the actor pools, which the values share "
                          "(they start once); run `ragsift answer` once per value instead")


def with_value(base, param: str, value: str):
    """``base`` with ``param`` set to ``value`` (validated, naming the field) and its own output folder."""
    keys, parsed = parse_override(f"{param}={value}")
    data = base.model_dump()
    node = data
    for k in keys[:-1]:
        if k in node and node[k] is None:  # a section left out (judge: null) is set as `--set judge.x` sets it
            node[k] = {}
        if not isinstance(node.get(k), dict):
            raise ConfigError(f"--param {param}: {k} is not a config section")
        node = node[k]
    node[keys[-1]] = parsed
    data["output"] = join(base.output, f"{param}={value}")
    try:
        return type(base).model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"--param {param}={value}: {err.errors()[0]['msg']}") from None


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def write(rows: list[dict], param: str, output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head = ["value", "strategy", "acc", "F1", "retrieval ratio", "LLM calls/q"]
    text = f"# sweep of {param}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n"
    text += "".join("| " + " | ".join(str(r[h]) for h in head) + " |\n" for r in rows)
    fs, root = filesystem(output)
    with fs.open_output_stream(f"{root}/sweep.md") as f:
        f.write(text.encode())
    with fs.open_output_stream(f"{root}/sweep.json") as f:
        f.write(json.dumps(rows, indent=2).encode())
    fig, ax = plt.subplots(figsize=(6, 4))
    values = list(dict.fromkeys(r["value"] for r in rows))
    numeric = all(_is_number(v) and not isinstance(v, bool) for v in values)
    if numeric:  # a line through "3,1,4,2" in the order given zig-zagged
        rows = sorted(rows, key=lambda r: float(r["value"]))
    x = float if numeric else values.index  # true / false, model names: one tick each, in the order given
    for strategy in sorted({r["strategy"] for r in rows}):
        mine = [r for r in rows if r["strategy"] == strategy]
        ax.plot([x(r["value"]) for r in mine], [r["acc"] for r in mine], marker="o", label=f"{strategy} acc %")
        ax.plot([x(r["value"]) for r in mine], [r["retrieval ratio"] for r in mine], marker="x", linestyle="--",
                label=f"{strategy} retrieval ratio %")
    if not numeric:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
    ax.set_xlabel(param)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if "://" not in output:
        fig.savefig(Path(output) / "sweep.png", dpi=110)
    plt.close(fig)
    print(text)  # after every file: a stdout its reader closed ends the process


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("sweep", argv)


if __name__ == "__main__":
    sys.exit(main())
