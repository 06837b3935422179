"""``ragsift report``: one or more runs -> one self-contained HTML page (plots as embedded PNG).

Accuracy per strategy x dataset, how questions were resolved (RA-ISF Table 7 style), cost per
question (LLM calls, tokens, retrievals), sub-question depth, and stage utilisation over time (from
each run's metrics.json). Runs are answer/compare output directories; with several runs, strategies
are labelled ``<run>/<strategy>``.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import sys
from array import array
from collections import Counter
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from jobs.evaluate import COLUMNS, cost_quality, evaluate, resolution_cells, retrieval_k
from jobs.output import unfinished
from jobs.storage import check_kept, filesystem, join, path_of, redact
from schemas.errors import UserError


class Spread:
    """One strategy's per-question cost and depth, the four numbers a row its box and bar plots draw on:
    holding whole rows (traces too) for them made report's memory grow with the run (a million rows, GBs)."""

    def __init__(self):
        self.calls, self.tokens, self.retrievals, self.depths = (array("q") for _ in range(4))

    def add(self, row: dict) -> None:
        self.calls.append(row["n_llm_calls"])
        self.tokens.append(row["prompt_tokens"] + row["completion_tokens"])
        self.retrievals.append(row["n_retrievals"])
        self.depths.append(row["depth"])


def load_run(run: str, questions: str, label: str | None) -> dict:
    """Scores, resolution, per-question costs (for distributions) and metrics of one run directory, from
    one read of its answers, a row at a time."""
    spreads: dict[str, Spread] = {}

    def spread(key: tuple[str, str], row: dict) -> None:
        if key[1] == "ALL":
            spreads.setdefault(key[0], Spread()).add(row)

    scores, resolved = evaluate(run, questions, retrieval_k(run), job="report", each=spread)
    if label:
        for r in scores + resolved:
            r["strategy"] = f"{label}/{r['strategy']}"
        spreads = {f"{label}/{s}": v for s, v in spreads.items()}
    return {
        "scores": scores,
        "resolution": resolved,
        "spreads": spreads,
        "metrics": read_metrics(join(run, "metrics.json")),
        "label": label or Path(path_of(run)).name,
    }


def read_metrics(path) -> dict | None:
    """A run's metrics.json (a local path or an object store's URI); the answers report without it
    (missing, or damaged by a killed writer)."""
    fs, where = filesystem(str(path))
    try:
        with fs.open_input_stream(where) as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(data.decode())
    except ValueError as err:  # UnicodeDecodeError, JSONDecodeError
        print(f"report: {redact(str(path))} is damaged ({err}); the run is reported without its metrics", file=sys.stderr)
        return None


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def accuracy_figure(scores: list[dict]) -> str:
    plt = _plt()
    strategies = sorted({r["strategy"] for r in scores})
    datasets = sorted({r["dataset"] for r in scores}, key=lambda d: (d == "ALL", d))
    acc = {(r["strategy"], r["dataset"]): r["acc"] for r in scores}
    grid = [[acc.get((s, d)) if acc.get((s, d)) is not None else float("nan") for d in datasets] for s in strategies]
    fig, ax = plt.subplots(figsize=(1.2 * len(datasets) + 3, 0.5 * len(strategies) + 1.5))
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(datasets)), datasets, rotation=30)
    ax.set_yticks(range(len(strategies)), strategies)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v == v:  # not NaN
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", color="white" if v < 60 else "black", fontsize=8)
    fig.colorbar(im, ax=ax, label="accuracy (%)")
    ax.set_title("Accuracy per strategy and dataset")
    return _png(fig)


def resolution_figure(resolved: list[dict]) -> str:
    """Share of questions each module resolved (bar) and how many of those were correct (hatched)."""
    plt = _plt()
    overall = [r for r in resolved if r["dataset"] == "ALL"]
    modules = sorted({m for r in overall for m in r["modules"]})
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(overall) + 1.5))
    colours = plt.get_cmap("tab10")
    for i, r in enumerate(overall):
        left = 0.0
        for k, m in enumerate(modules):
            if m not in r["modules"]:
                continue
            share, correct = r["modules"][m]["WR"], 100 * r["modules"][m]["Corr"] / r["n"]
            ax.barh(i, share, left=left, color=colours(k % 10), label=m if i == next(
                j for j, o in enumerate(overall) if m in o["modules"]) else None)
            ax.barh(i, correct, left=left, color="none", hatch="//", edgecolor="black", linewidth=0)
            left += share
    ax.set_yticks(range(len(overall)), [r["strategy"] for r in overall])
    ax.set_xlabel("questions (%); hatched: answered correctly")
    ax.set_title("How questions were resolved")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _png(fig)


def cost_figure(spreads: dict[str, Spread]) -> str:
    plt = _plt()
    strategies = sorted(spreads)
    measures = [("LLM calls", "calls"), ("tokens", "tokens"), ("retrievals", "retrievals")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 0.4 * len(strategies) + 2.5))
    for ax, (name, field) in zip(axes, measures):
        ax.boxplot([getattr(spreads[s], field) for s in strategies], vert=False, tick_labels=strategies)
        ax.set_title(f"{name} per question")
    return _png(fig)


def cost_quality_figure(scores: list[dict]) -> str:
    """F1 and accuracy against tokens per question, one point per strategy (evaluate.cost_quality)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    cost_quality(ax, scores)
    return _png(fig)


def depth_figure(spreads: dict[str, Spread]) -> str:
    plt = _plt()
    strategies = sorted(spreads)
    counts = {s: Counter(spreads[s].depths) for s in strategies}
    depths = sorted({d for count in counts.values() for d in count})
    fig, ax = plt.subplots(figsize=(9, 3.5))
    width = 0.8 / max(1, len(strategies))
    for i, s in enumerate(strategies):
        count = counts[s]
        ax.bar([d + i * width for d in range(len(depths))], [count.get(d, 0) for d in depths], width, label=s)
    ax.set_xticks([d + 0.4 - width / 2 for d in range(len(depths))], [str(d) for d in depths])
    ax.set_xlabel("sub-question depth (0: answered without sub-questions)")
    ax.set_ylabel("questions")
    ax.legend(fontsize=8)
    ax.set_title("Sub-question depth")
    return _png(fig)


def utilisation_figure(runs: list[dict]) -> str | None:
    plt = _plt()
    series = [(f"{label}: {name}", stage["utilisation"]) for run in runs if run["metrics"]
              for label, metrics in _engines(run)
              for name, stage in metrics.get("stages", {}).items() if "utilisation" in stage]
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, u in series:
        ax.plot([(i + 0.5) * u["bin_s"] for i in range(len(u["busy"]))], [100 * b for b in u["busy"]], label=name)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("replicas busy (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.set_title("Stage utilisation over time")
    return _png(fig)


def _engines(run: dict) -> list[tuple[str, dict]]:
    """A run's metrics, or with engine.actors > 1 each engine's: the merged metrics hold no utilisation
    (each engine saw only its own batches on the shared replicas, so their busy fractions do not add up)."""
    engines = run["metrics"].get("engines")
    if engines:
        return [(f"{run['label']} engine {i}", metrics) for i, metrics in enumerate(engines)]
    return [(run["label"], run["metrics"])]


def _table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r[c]))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cells_table(head: list[str], rows: list[list]) -> str:
    return _table([dict(zip(head, cells)) for cells in rows], head)


def render(runs: list[dict]) -> str:
    scores = [r for run in runs for r in run["scores"]]
    resolved = [r for run in runs for r in run["resolution"]]
    spreads = {s: v for run in runs for s, v in run["spreads"].items()}
    figures = [("Accuracy", accuracy_figure(scores)), ("How questions were resolved", resolution_figure(resolved)),
               ("Cost and quality", cost_quality_figure(scores)),
               ("Cost per question", cost_figure(spreads)), ("Sub-question depth", depth_figure(spreads)),
               ("Stage utilisation", utilisation_figure(runs))]
    sections = "".join(f'<section><h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" '
                       f'src="data:image/png;base64,{png}"></section>' for title, png in figures if png)
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}")
    names = ", ".join(html.escape(run["label"]) for run in runs)
    # the page outlives the moment: a run reported while it answered is said to be one on the page itself
    notes = "".join(f"<p><strong>Not finished</strong>: {html.escape(run['unfinished'])}; reported are the questions "
                    "answered so far.</p>" for run in runs if run.get("unfinished"))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ragsift report: {names}</title>"
            f"<style>{style}</style></head><body><h1>ragsift report</h1><p>Runs: {names}</p>{notes}{sections}"
            f"<section><h2>Scores (percent)</h2>{_table(scores, COLUMNS)}</section>"
            f"<section><h2>Resolution by module (WR% / correct)</h2>{_cells_table(*resolution_cells(resolved))}"
            "</section></body></html>")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", nargs="+", action="extend", required=True,
                   help="answer or compare output directories (given once or repeated)")
    p.add_argument("--questions", required=True, help="the questions with gold `answers`: any file `answer` reads")
    p.add_argument("--out", required=True, help="HTML file to write")


def run_labels(runs: list[str]) -> list[str]:
    """A name per run: its folder's, or where two are alike (runs/a/out, runs/b/out) its path below the
    runs' common folder (a label names a run's rows in every plot: two alike would overwrite each other)."""
    names = [Path(path_of(r)).name for r in runs]
    if len(set(names)) == len(names):
        return names
    paths = [_where(r) for r in runs]
    if len(set(paths)) < len(paths):
        raise UserError("--runs names the same run twice")
    common = PurePosixPath(os.path.commonpath([str(p) for p in paths]))
    return [str(p.relative_to(common)) for p in paths]


def _where(run: str) -> PurePosixPath:
    """Where a run lies: a local folder's absolute path; an object store's bucket and key, never the
    credentials before them (resolved as a local path, s3://key:secret@bucket/out labelled the page's
    plots and tables with key:secret)."""
    if "://" in run:
        parts = urlsplit(run)
        return PurePosixPath("/", parts.netloc.rsplit("@", 1)[-1], parts.path.lstrip("/"))
    return PurePosixPath(Path(run).resolve())


def run(args: argparse.Namespace) -> int:
    check_kept(args.out, "--out")
    labels = run_labels(args.runs) if len(args.runs) > 1 else [None]
    runs = [load_run(r, args.questions, label) for r, label in zip(args.runs, labels)]
    for r, loaded in zip(args.runs, runs):  # its figures are of the questions answered so far (as evaluate warns)
        if short := unfinished(r):
            print(f"warning: {short}; reported are the questions answered so far", file=sys.stderr)
            loaded["unfinished"] = short
    page = render(runs)
    fs, where = filesystem(args.out)  # an s3:// --out made a local folder "s3:"
    if "/" in where:
        fs.create_dir(where.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(where) as f:
        f.write(page.encode())
    print(f"wrote {redact(args.out)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("report", argv)


if __name__ == "__main__":
    sys.exit(main())
