"""``ragsift evaluate``: answers + gold questions -> metrics per strategy and dataset.

EM and F1 (SQuAD normalisation), accuracy (a gold answer contained in the prediction), yes/no
accuracy on questions whose gold is yes/no, and retrieval recall@k (any / all gold passages in the
top k) on questions with gold passages. Answer scores average over the questions that have a gold
answer (`scored`); costs over all `n`. Printed as a table, written as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator

import pyarrow as pa

from jobs import metrics as M
from jobs.chunks import passage_of
from jobs.output import PART, claimed, unfinished
from jobs.question_sources import as_parquet
from jobs.questions import by_first_id, gold_ids, question_columns, stand_in_row
from jobs.storage import check_kept, filesystem, join, open_parquet, read_table, redact, unwritable, uri_of
from schemas.errors import UserError
from schemas.tables import SchemaError

COLUMNS = ["strategy", "dataset", "n", "scored", "EM", "F1", "acc", "yes/no acc (n)", "recall@k any", "recall@k all",
           "cite P / R (n)", "errors", "LLM calls/q", "retrievals/q", "sub-q/q", "tokens/q", "tokens/correct",
           "latency s"]


ANSWER_COLUMNS = ("id", "strategy", "answer")  # what makes a Parquet file a part of ragsift answers
SCORED_COLUMNS = ("error", "resolved_by", "retrieved_ids", "n_llm_calls", "n_retrievals", "n_subquestions", "depth",
                  "n_parse_failures", "prompt_tokens", "completion_tokens", "latency_s")  # what evaluate reads of them


def answer_files(output: str) -> list[str]:
    """Committed answer parts under an output directory (``<strategy>/part-NNNNN.parquet``), or one file.
    Other Parquet files there are not answers: ``labels/`` from ``ragsift label`` (skipped by schema), a
    copy of a part beside it (``part-00000 copy.parquet``: skipped by name; its rows were counted twice
    and the folder refused as several runs)."""
    fs, root = filesystem(output)
    from pyarrow.fs import FileSelector, FileType

    info = fs.get_file_info(root)
    if info.type == FileType.File:  # one part named directly: it must be one (a question file is not)
        missing = [c for c in ANSWER_COLUMNS if c not in open_parquet(output).schema_arrow.names]
        if missing:
            raise SchemaError(f"{output} is not a file of ragsift answers (no column {missing})")
        return [output]
    if info.type == FileType.NotFound:
        raise FileNotFoundError(f"{output} does not exist")
    files = sorted(i.path for i in fs.get_file_info(FileSelector(root, recursive=True))
                   if i.type == FileType.File and PART.fullmatch(i.path.rsplit("/", 1)[-1])
                   and not any(part.startswith(("_", ".")) for part in i.path[len(root):].split("/")))
    files = [uri for f in files if set(ANSWER_COLUMNS) <= set(open_parquet(uri := uri_of(output, f)).schema_arrow.names)]
    if not files and claimed(output):  # a run's folder whose first part is not committed yet: no stray folder
        raise FileNotFoundError(f"{redact(output)} holds a run that has committed no part yet (it is answering its "
                                "first questions, or stopped before a part was whole): rerun once one is committed")
    if not files:
        raise FileNotFoundError(f"no answer Parquet files in {redact(output)} (a run's answers are <strategy>/"
                                "part-NNNNN.parquet; give another file itself to read it)")
    return files


def one_run(answers: str, files: list[str], job: str) -> list[str]:
    """``files``, once it is sure they hold one run: a run writes each (strategy, question) once, so a
    second answer means several runs under one folder (a sweep's), whose rows would be merged."""
    seen: set[tuple[str, str]] = set()
    for path in files:
        table = open_parquet(path).read(columns=["strategy", "id"])
        for key in zip(table["strategy"].to_pylist(), table["id"].to_pylist()):
            if key in seen:
                raise UserError(f"{redact(answers)} holds more than one answer of {key[0]} to question {key[1]!r} "
                                f"(several runs under one folder, e.g. a sweep's): {job} each run's folder")
            seen.add(key)
    return files


def checked(files: list[str]) -> list[str]:
    """Answer files that hold every column evaluate reads (an answer file written by hand may not)."""
    for path in files:
        pf = open_parquet(path)
        missing = [c for c in SCORED_COLUMNS if c not in pf.schema_arrow.names]
        if missing:
            raise SchemaError(f"{path} has answers but not the columns {missing} that evaluate reads: "
                              "evaluate answers written by `ragsift answer` / `compare`")
        counts = pf.read(columns=list(SCORED_COLUMNS[1:2] + SCORED_COLUMNS[3:]))  # resolutions and counts, read once
        empty = [c for c in counts.column_names if counts[c].null_count]
        if empty:
            raise SchemaError(f"{path} has null values in {empty}, which evaluate sums and groups by: "
                              "evaluate answers written by `ragsift answer` / `compare`")
    return files


def evaluate(answers: str, questions: str, k: int | None = None, strategies: list[str] | None = None,
             job: str = "evaluate", each: Callable[[tuple[str, str], dict], None] | None = None,
             ) -> tuple[list[dict], list[dict]]:
    """(scores per strategy and dataset, how questions were resolved), from one read of the files;
    of ``strategies`` only where given (compare scores what it ran, not a folder's other strategies).
    ``each`` sees every (key, row) as it is tallied (report keeps a few numbers of each for its plots)."""
    # tallied a row at a time, not held: a million answers held as rows (their traces too) took 3 GB
    scores: dict[tuple[str, str], Tally] = {}
    resolved: dict[tuple[str, str], Resolution] = {}
    verdicts = verdicts_of(answers)
    for key, row in joined_rows(answers, questions, job, strategies, columns=SCORED_READ):
        scores.setdefault(key, Tally(k, verdicts)).add(row)
        resolved.setdefault(key, Resolution(verdicts)).add(row)
        if each is not None:
            each(key, row)
    order = sorted(scores, key=group_order)
    return [scores[key].result(*key) for key in order], [resolved[key].result(*key) for key in order]


class Resolution:
    """One (strategy, dataset) group's resolution figures, a row at a time."""

    def __init__(self, verdicts: tuple[str, ...] = ()):
        self.verdicts = verdicts
        self.n = self.retrievals = self.subs = self.depth = self.parse_failures = self.cut_off = 0
        self.modules: dict[str, list[int]] = {}  # resolved_by -> [rows, correct]

    def add(self, row: dict) -> None:
        self.n += 1
        self.retrievals += row["n_retrievals"]
        self.subs += row["n_subquestions"]
        self.depth = max(self.depth, row["depth"])
        self.parse_failures += row["n_parse_failures"]
        self.cut_off += row.get("n_truncated") or 0  # rows written before ragsift counted them: none
        module = self.modules.setdefault(row["resolved_by"], [0, 0])
        module[0] += 1
        module[1] += M.accuracy(row["answer"] or "", row["_answers"], self.verdicts)

    def result(self, strategy: str, dataset: str) -> dict:
        n = self.n
        return {"strategy": strategy, "dataset": dataset, "n": n, "retrievals/q": round(self.retrievals / n, 2),
                "sub-questions/q": round(self.subs / n, 2), "max depth": self.depth,
                "parse failures": self.parse_failures, "cut off": self.cut_off,
                "modules": {m: {"WR": round(100 * rows / n, 1), "Corr": int(correct)}
                            for m, (rows, correct) in sorted(self.modules.items())}}


def gold_columns(questions: str) -> list[str]:
    """The gold columns of a Parquet question file, refused when they cannot be scored: compare and
    sweep call this before answering, so a missing column is not found after hours of it."""
    cols = question_columns(questions)
    if "answers" not in cols:
        raise UserError(f"{questions}: no `answers` column to evaluate against")
    if "dataset" in cols and "ALL" in read_table(questions, ["dataset"]).column("dataset").to_pylist():
        raise UserError(f"{questions}: a dataset named ALL (the name of the row over all questions): rename it")
    return cols


def grouped_rows(answers: str, questions: str, job: str = "evaluate",
                 strategies: list[str] | None = None) -> list[tuple[tuple[str, str], list[dict]]]:
    """Answer rows joined with their gold question (``_gold``, and its usable gold answers as ``_answers``),
    grouped by (strategy, dataset) plus (strategy, ALL): what report draws its distributions from."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for key, row in joined_rows(answers, questions, job, strategies):
        groups[key].append(row)
    return sorted(groups.items(), key=lambda kv: group_order(kv[0]))


def group_order(key: tuple[str, str]) -> tuple:
    strategy, dataset = key
    return strategy, dataset == "ALL", dataset


# what scoring reads of an answer row (its trace and question text, the bulk of a part, are not)
SCORED_READ = ("id", "strategy", "answer", *SCORED_COLUMNS, "citations", "n_truncated")


def joined_rows(answers: str, questions: str, job: str = "evaluate", strategies: list[str] | None = None,
                columns: tuple[str, ...] | None = None) -> Iterator[tuple[tuple[str, str], dict]]:
    """Each answer row (of ``columns`` where they are in its file; all of them without) joined with its gold
    question as grouped_rows joins it, once under (strategy, its dataset) and once under (strategy, ALL), a
    file at a time; an answer to a question not in ``questions`` is an error, raised after the last row."""
    given, questions = questions, as_parquet(questions)  # a CSV / JSON Lines file read through a converted copy
    cols = gold_columns(questions)
    files = one_run(answers, checked(answer_files(answers)), job)
    gold_by_id, unnamed = gold_needed(questions, cols, files)
    unmatched: Counter = Counter()
    for path in files:
        schema = open_parquet(path).schema_arrow
        names, split = schema.names, split_index(schema)
        for row in read_table(path, [c for c in columns if c in names] if columns else None).to_pylist():
            if strategies is not None and row["strategy"] not in strategies:
                continue
            g = gold_of(row["id"], gold_by_id, unnamed)
            if g is None:
                unmatched[row["strategy"]] += 1
                continue
            row["_gold"], row["_answers"], row["_split"] = g, M.gold_answers(g.get("answers")), split
            if g.get("dataset"):  # a question without one counts in ALL only
                yield (row["strategy"], g["dataset"]), row
            yield (row["strategy"], "ALL"), row
    if unmatched:
        raise UserError(f"{redact(answers)} holds answers to questions that are not in {redact(given)} "
                        f"({dict(unmatched)} per strategy): evaluate against the questions the run answered")


def split_index(schema: pa.Schema) -> bool:
    """Whether the answers of this file (its run's identity, in the part's metadata) read an index of split
    passages (``index.chunk_words``): their passage ids are parts ``<id>#<n>``, the gold ids whole passages."""
    try:
        identity = json.loads((schema.metadata or {}).get(b"ragsift", b"{}"))
    except ValueError:
        return False
    return isinstance(identity, dict) and bool(identity.get("index.chunks"))


def reads_split_index(files: list[str]) -> bool:
    """Whether the run of these answer files read an index of split passages (``split_index`` of their parts)."""
    return any(split_index(open_parquet(f).schema_arrow) for f in files)


def gold_needed(questions: str, cols: list[str], files: list[str]) -> tuple[dict, dict[int, dict]]:
    """The gold of the questions these answer files answer: by id (a repeated id's first row), and the
    questions without an id by their row. Only those become Python rows: scoring 300 answers against a
    file of 1M questions held every question as a dict (1.45 GB)."""
    import pyarrow.compute as pc

    answered = pa.concat_arrays([pc.unique(open_parquet(f).read(columns=["id"])["id"]).cast(pa.string())
                                 for f in files]) if files else pa.array([], pa.string())
    table = read_table(questions, ["id", *[c for c in ("answers", "dataset", "gold_passage_ids") if c in cols]])
    ids = table["id"].cast(pa.string())
    nameless = pc.is_null(ids)
    keep = pc.or_(pc.fill_null(pc.is_in(ids, value_set=pc.unique(answered.drop_null())), False), nameless)
    rows = pc.indices_nonzero(keep).to_pylist()
    picked = table.filter(keep).to_pylist()
    return (by_first_id([r for r in picked if r["id"] is not None]),
            {i: r for i, r in zip(rows, picked) if r["id"] is None})


def gold_of(qid: str, gold_by_id: dict, unnamed: dict[int, dict]) -> dict | None:
    """The question an answer row answers: by id, or for a row without one by its stand-in ``<row N>``
    (jobs/questions.py), the N-th question, where it has no id."""
    if qid in gold_by_id and qid is not None:
        return gold_by_id[qid]
    row = stand_in_row(qid)
    return unnamed.get(row) if row is not None else None


class Tally:
    """One (strategy, dataset) group's scores and costs, summed a row at a time (in the rows' order: the
    same sums as over the group held whole)."""

    def __init__(self, k: int | None, verdicts: tuple[str, ...] = ()):
        self.k = k  # the recall cut-off; None: all retrieved
        self.verdicts = verdicts  # the run's claim labels: a gold among them is a label, not words to find
        self.n = self.scored = self.errors = self.yn_n = self.yn_ok = self.rec_n = self.cite_n = 0
        self.em = self.f1 = self.acc = self.rec_any = self.rec_all = self.cite_p = self.cite_r = 0.0
        self.calls = self.tokens = self.scored_tokens = self.latency = self.retrievals = self.subs = 0.0

    def add(self, row: dict) -> None:
        golds, pred = row["_answers"], row["answer"] or ""
        self.n += 1
        self.scored += bool(golds)
        self.errors += row["error"] is not None
        self.em += M.exact_match(pred, golds)
        self.f1 += M.f1(pred, golds)
        self.acc += M.accuracy(pred, golds, self.verdicts)
        if M.is_yes_no(golds):
            self.yn_n += 1
            self.yn_ok += M.accuracy(pred, golds)
        gold = gold_ids(row["_gold"].get("gold_passage_ids"))
        # a part of a split passage is found, or cited, as its passage: the gold names whole passages
        passages = (lambda ids: [passage_of(i) for i in ids]) if row.get("_split") else (lambda ids: ids)  # noqa: E731
        retrieved, cited = passages(row["retrieved_ids"] or []), passages(row.get("citations") or [])
        # an error row's passages are where it stopped, not a retrieval to score (README: not misses); a row
        # that retrieved and kept none (MIGRES's filter keeps what it reads) found no gold: a miss, not left out
        if gold and (retrieved or row["n_retrievals"]) and row["error"] is None:
            a, b = M.recall_at_k(retrieved, gold, self.k or len(retrieved)) if retrieved else (0.0, 0.0)
            self.rec_any, self.rec_all, self.rec_n = self.rec_any + a, self.rec_all + b, self.rec_n + 1
        # citation precision / recall against gold passages, only where the model cited (a reader's
        # passages are its retrieval, scored by recall@k above)
        if gold and cited:
            hit = len(set(cited) & set(gold))
            self.cite_p += hit / len(set(cited))
            self.cite_r += hit / len(set(gold))
            self.cite_n += 1
        self.calls += row["n_llm_calls"]
        self.retrievals += row["n_retrievals"]
        self.subs += row["n_subquestions"]
        self.tokens += row["prompt_tokens"] + row["completion_tokens"]
        if golds:  # only a question with a gold answer can be answered correctly
            self.scored_tokens += row["prompt_tokens"] + row["completion_tokens"]
        self.latency += row["latency_s"]

    def result(self, strategy: str, dataset: str) -> dict:
        n, scored, acc, tokens = self.n, self.scored, self.acc, self.tokens
        pct = lambda x, d: round(100 * x / d, 1) if d else None  # noqa: E731
        return {
            "strategy": strategy, "dataset": dataset, "n": n, "scored": scored,
            "EM": pct(self.em, scored), "F1": pct(self.f1, scored), "acc": pct(acc, scored),
            "yes/no acc (n)": f"{pct(self.yn_ok, self.yn_n)} ({self.yn_n})" if self.yn_n else None,
            "recall@k any": pct(self.rec_any, self.rec_n), "recall@k all": pct(self.rec_all, self.rec_n),
            "k": self.k,
            "cite P / R (n)": (f"{pct(self.cite_p, self.cite_n)} / {pct(self.cite_r, self.cite_n)} ({self.cite_n})"
                               if self.cite_n else None),
            "errors": self.errors,
            "LLM calls/q": round(self.calls / n, 2), "retrievals/q": round(self.retrievals / n, 2),
            "sub-q/q": round(self.subs / n, 2), "tokens/q": round(tokens / n, 1),
            # cost of one accurate answer: the tokens of the questions that could be (those with a gold)
            "tokens/correct": round(self.scored_tokens / acc) if acc else None,
            "latency s": round(self.latency / n, 2),
        }


def _markdown(head: list[str], rows: list[list]) -> str:
    cell = lambda v: "" if v is None else str(v).replace("|", "\\|")  # noqa: E731 - a dataset may be named "a|b"
    lines = ["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, cells)) + " |" for cells in rows]) + "\n"


def markdown(table: list[dict]) -> str:
    return _markdown(list(COLUMNS), [[row[c] for c in COLUMNS] for row in table])


def resolution_cells(table: list[dict]) -> tuple[list[str], list[list]]:
    """The resolution table as a header and rows of cells (markdown here, HTML in the report)."""
    modules = sorted({m for row in table for m in row["modules"]})
    head = ["strategy", "dataset", "n", *(f"{m} WR% / Corr" for m in modules),
            "retrievals/q", "sub-questions/q", "max depth", "parse failures", "cut off"]
    rows = [[row["strategy"], row["dataset"], row["n"],
             *(f"{row['modules'][m]['WR']} / {row['modules'][m]['Corr']}" if m in row["modules"] else ""
               for m in modules),
             row["retrievals/q"], row["sub-questions/q"], row["max depth"], row["parse failures"],
             row.get("cut off", 0)] for row in table]
    return head, rows


def resolution_markdown(table: list[dict]) -> str:
    return _markdown(*resolution_cells(table))


def print_table(table: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(title="ragsift evaluation (percent)")
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("strategy", "dataset") else "right")
    for row in table:
        # as Text: a str is rich markup, and a dataset named `squad[v2]` printed as `squad` (`x[/y]` raised)
        t.add_row(*(Text("" if row[c] is None else str(row[c])) for c in COLUMNS),
                  end_section=row["dataset"] == "ALL")
    Console(width=200).print(t)


def print_tables(table: list[dict], resolved: list[dict]) -> None:
    """The evaluation and how questions were resolved, on stdout; print them after writing the files: rich
    exits the process when stdout is a pipe its reader closed."""
    print_table(table)
    print(resolution_markdown(resolved))


def write_reports(table: list[dict], out_dir: str, resolved: list[dict] | None = None,
                  unfinished_run: str | None = None) -> list[str]:
    """eval.json / eval.md / eval.png (and resolution.json) in ``out_dir``: a local folder or an
    object store's, like the answers beside them. ``unfinished_run``: what ``unfinished`` said of the run,
    written into the files (left beside a run that then finished, they read as its scores). Returns their names."""
    fs, root = filesystem(out_dir)
    fs.create_dir(root, recursive=True)
    if unfinished_run:
        table = [{**row, "unfinished": unfinished_run} for row in table]
    files = {"eval.json": json.dumps(table, indent=2)}
    text = (f"**Not finished**: {unfinished_run}; scored are the questions answered so far.\n\n" if unfinished_run
            else "") + markdown(table)
    if resolved:
        files["resolution.json"] = json.dumps(resolved, indent=2)
        text += "\n## How questions were resolved\n\n" + resolution_markdown(resolved)
    files["eval.md"] = text
    png = io.BytesIO()
    chart(table, png)
    files["eval.png"] = png.getvalue()
    for name, content in files.items():
        with fs.open_output_stream(f"{root}/{name}") as f:
            f.write(content.encode() if isinstance(content, str) else content)
    return list(files)


def cost_quality(ax, table: list[dict]) -> None:
    """The cost-quality plane: F1 and accuracy against tokens per question, one point per strategy
    (a strategy that costs more and answers worse sits right of and below another)."""
    overall = sorted((r for r in table if r["dataset"] == "ALL"), key=lambda r: r["strategy"])
    for metric, marker in (("F1", "o"), ("acc", "^")):
        ax.scatter([r["tokens/q"] for r in overall], [r[metric] or 0 for r in overall], marker=marker, label=metric)
    for r in overall:
        ax.annotate(r["strategy"], (r["tokens/q"], r["F1"] or 0), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("symlog", linthresh=1)  # log-like, but a strategy of 0 tokens (all error rows) stays on it
    ax.set_xlabel("tokens per question")
    ax.set_ylabel("percent")
    ax.legend(fontsize=8)
    ax.set_title("cost and quality (all questions)")


def chart(table: list[dict], path) -> None:
    """F1 per strategy and dataset, the cost-quality plane and LLM calls per question, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = sorted({r["strategy"] for r in table})
    datasets = sorted({r["dataset"] for r in table}, key=lambda d: (d == "ALL", d))
    f1 = {(r["strategy"], r["dataset"]): r["F1"] or 0 for r in table}
    fig, (ax, plane, cost) = plt.subplots(1, 3, figsize=(16, 4), gridspec_kw={"width_ratios": [3, 1.5, 1]})
    width = 0.8 / len(strategies)
    for i, s in enumerate(strategies):
        ax.bar([d + i * width for d in range(len(datasets))], [f1.get((s, d), 0) for d in datasets], width, label=s)
    ax.set_xticks([d + 0.4 - width / 2 for d in range(len(datasets))], datasets, rotation=30)
    ax.set_ylabel("F1 (%)")
    ax.legend(fontsize=8)
    ax.set_title("F1 by dataset")
    cost_quality(plane, table)
    overall = {r["strategy"]: r for r in table if r["dataset"] == "ALL"}
    cost.bar(strategies, [overall[s]["LLM calls/q"] if s in overall else 0 for s in strategies])
    cost.set_title("LLM calls per question")
    cost.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_folder(answers: str) -> str:
    """The run an answers path belongs to: itself, the run of one part of it (``<run>/<strategy>/part-N``), or
    of one strategy's folder (``<run>/<strategy>``, where the run's config.yaml is one level up)."""
    import pyarrow.fs as pafs

    if PART.search(answers):  # <run>/<strategy>/part-NNNNN.parquet
        return {3: answers.rsplit("/", 2)[0], 2: "."}.get(len(answers.rsplit("/", 2)), "..")
    fs, root = filesystem(answers)
    root = root.rstrip("/")
    if "/" not in root or fs.get_file_info(root).type != pafs.FileType.Directory:
        return answers
    parent = root.rsplit("/", 1)[0]
    if (fs.get_file_info(f"{root}/config.yaml").type != pafs.FileType.File
            and fs.get_file_info(f"{parent}/config.yaml").type == pafs.FileType.File
            and any(PART.fullmatch(i.path.rsplit("/", 1)[-1]) for i in fs.get_file_info(pafs.FileSelector(root)))):
        return uri_of(answers, parent)
    return answers


def run_config(answers: str) -> dict:
    """The config.yaml of the run an answers path belongs to; {} for answers outside a run (a file of one's own)
    or an unreadable one."""
    import yaml

    fs, where = filesystem(join(run_folder(answers), "config.yaml"))
    try:
        with fs.open_input_stream(where) as f:
            config = yaml.safe_load(f.read().decode())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def retrieval_k(run: str) -> int | None:
    """The recall@k cut-off compare scores a run at, and evaluate and report by default: its config.yaml's
    retrieval.k (a strategy that retrieves more than k, MIGRES over its iterations, is not credited with
    what it read past k), also for one part or one strategy's folder of it (its run folder's config.yaml is
    found from there); all retrieved for answers outside a run (a file of one's own)."""
    k = (run_config(run).get("retrieval") or {}).get("k")
    return k if isinstance(k, int) and k > 0 else None


def verdicts_of(run: str) -> tuple[str, ...]:
    """The claim labels the run answered in (its answer_form.verdicts; the default's outside a run), which
    accuracy reads as labels, not as words to find in an answer."""
    from schemas.config import AnswerFormConfig

    labels = (run_config(run).get("answer_form") or {}).get("verdicts")
    if isinstance(labels, list) and labels and all(isinstance(v, str) for v in labels):
        return tuple(labels)
    return tuple(AnswerFormConfig().verdicts)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--answers", required=True, help="answers directory (from `answer`) or one Parquet file")
    p.add_argument("--questions", required=True, help="the questions with gold `answers`: Parquet, or any file "
                   "`answer` reads (JSON Lines, CSV, a datasets folder, hf:NAME), converted as it converts them")
    p.add_argument("--k", type=positive_int, help="recall@k cut-off (default: the run's retrieval.k, from its "
                   "config.yaml, as compare and report score it; all retrieved for answers without one)")
    p.add_argument("--out", help="where eval.json / eval.md go (default: the answers directory)")


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_kept(args.out, "--out")
    # the run's own k, as compare wrote the table this one replaces and as report scores it: all retrieved
    # credited a strategy that reads past k (its own k, sub-questions, MIGRES's iterations) with more
    k = args.k or retrieval_k(args.answers)
    table, resolved = evaluate(args.answers, args.questions, k)
    if not table:
        raise UserError(f"{redact(args.answers)}: its answer files hold no rows to score")
    # a strategy's folder of a run: whether that strategy is finished (one part file is scored as it is)
    run, strategy = run_folder(args.answers), filesystem(args.answers)[1].rstrip("/").rsplit("/", 1)[-1]  # (not a URI's query)
    if short := (None if PART.search(args.answers) else unfinished(run, {strategy} if run != args.answers else None)):
        print(f"warning: {short}; scored are the questions answered so far", file=sys.stderr)
    out = args.out or answers_folder(args.answers)
    try:
        written = write_reports(table, out, resolved, short)  # before the table is printed: a closed stdout (`| head`) ends it
    except OSError as err:
        if args.out or not unwritable(err):
            raise
        # a published run on a read-only mount is scored as any other, its files written elsewhere
        raise UserError(f"cannot write eval.json beside the answers ({err}): pass --out DIR") from err
    print(f"wrote {', '.join(written)} into {redact(out)}", file=sys.stderr)
    print_tables(table, resolved)
    return 0


def answers_folder(answers: str) -> str:
    """The answers directory, or the folder of one answers file (on any filesystem: ``Path`` made
    ``s3://b/x.parquet``'s folder ``s3:/b``, a local folder of that name)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(answers)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        return answers
    return uri_of(answers, path.rstrip("/").rsplit("/", 1)[0]) if "/" in path else "."


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("evaluate", argv)


if __name__ == "__main__":
    sys.exit(main())
