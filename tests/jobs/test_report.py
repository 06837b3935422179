import base64
import io
import json
import os
import re
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from jobs.report import main
from schemas.errors import UserError
from schemas.tables import ANSWERS


def answer_row(qid: str, strategy: str, answer: str, resolved_by: str, **extra) -> dict:
    row = {name: None for name in ANSWERS.names}
    row.update(id=qid, question=f"q {qid}", strategy=strategy, answer=answer, resolved_by=resolved_by,
               retrieved_ids=["p1", "p2"], retrieved_scores=[0.9, 0.5], citations=["p1"], n_llm_calls=2,
               n_retrievals=1, n_subquestions=0, depth=0, n_parse_failures=0, prompt_tokens=100,
               completion_tokens=10, latency_s=1.5, trace="[]")
    row.update(extra)
    return row


@pytest.fixture
def run_dir(tmp_path):
    questions = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"id": "a", "question": "q a", "answers": ["Paris"], "dataset": "nq", "gold_passage_ids": ["p1"]},
        {"id": "b", "question": "q b", "answers": ["yes"], "dataset": "strategyqa", "gold_passage_ids": ["p9"]},
    ]), questions)
    run = tmp_path / "run"
    for strategy, rows in {
        "rag": [answer_row("a", "rag", "Paris", "retrieval"), answer_row("b", "rag", "no", "retrieval")],
        "raisf": [answer_row("a", "raisf", "Paris", "self_knowledge", n_retrievals=0),
                  answer_row("b", "raisf", "yes", "decomposition", depth=2, n_subquestions=3, n_llm_calls=9)],
    }.items():
        (run / strategy).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), run / strategy / "part-00000.parquet")
    (run / "labels").mkdir()  # `ragsift label` output beside the answers: not answer rows
    pq.write_table(pa.table({"id": ["a"], "label": ["relevant"]}), run / "labels" / "relevance.parquet")
    (run / "metrics.json").write_text(json.dumps({"stages": {"generator": {
        "utilisation": {"bin_s": 2.0, "busy": [1.0, 0.5, 0.25, 0.0]}}}}))
    return run, questions


def images(page: str) -> list[Image.Image]:
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_has_every_plot_and_the_scores(run_dir, tmp_path):
    run, questions = run_dir
    out = tmp_path / "report.html"
    assert main(["--runs", str(run), "--questions", str(questions), "--out", str(out)]) == 0
    page = out.read_text()
    # accuracy, resolution, the cost-quality plane, cost, depth, utilisation
    assert [i.size[0] > 300 for i in images(page)] == [True] * 6
    for title in ("Accuracy", "How questions were resolved", "Cost and quality", "Cost per question",
                  "Sub-question depth", "Stage utilisation"):
        assert f"<h2>{title}</h2>" in page
    # raisf: 2/2 correct overall, the decomposition module resolved b (50% of questions) correctly
    assert "<td>raisf</td><td>ALL</td><td>2</td><td>2</td><td>100.0</td>" in page  # n, scored, EM
    assert "<td>rag</td><td>ALL</td><td>2</td><td>2</td><td>50.0</td>" in page
    assert "<td>50.0 / 1</td>" in page


def test_several_runs_are_labelled_and_a_run_without_metrics_has_no_utilisation_plot(run_dir, tmp_path):
    run, questions = run_dir
    other = tmp_path / "other"
    shutil.copytree(run, other)
    (other / "metrics.json").unlink()
    (run / "metrics.json").unlink()
    out = tmp_path / "report.html"
    assert main(["--runs", str(run), str(other), "--questions", str(questions), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<td>run/rag</td>" in page and "<td>other/raisf</td>" in page
    assert len(images(page)) == 5 and "Stage utilisation" not in page


def test_a_run_of_several_engine_actors_plots_each_engines_utilisation(run_dir, tmp_path, monkeypatch):
    import jobs.report

    run, questions = run_dir
    engines = [{"stages": {"generator": {"utilisation": {"bin_s": 2.0, "busy": busy}}}} for busy in ([1.0, 0.5], [0.25, 0.75])]
    (run / "metrics.json").write_text(json.dumps({  # engine.actors = 2: jobs/engine_actors.merge_metrics
        "stages": {"generator": {"calls": 4}}, "engines": engines}))
    figures = []
    drawn = jobs.report._png
    monkeypatch.setattr(jobs.report, "_png", lambda fig: figures.append(fig) or drawn(fig))  # each figure, as drawn
    out = tmp_path / "report.html"
    assert main(["--runs", str(run), "--questions", str(questions), "--out", str(out)]) == 0
    assert len(images(out.read_text())) == 6 and "Stage utilisation" in out.read_text()
    (axes,) = [ax for fig in figures for ax in fig.axes if ax.get_title() == "Stage utilisation over time"]
    # one series an engine, each of its own busy fractions at its bins' middles
    assert [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in axes.get_lines()] == [
        ("run engine 0: generator", [1.0, 3.0], [100.0, 50.0]), ("run engine 1: generator", [1.0, 3.0], [25.0, 75.0])]


def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    """The page as a browser shows it: every embedded PNG decodes and paints (a broken image would
    leave a small icon: the plots' colours would be missing from the screenshot)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs Debian chromium (.ci/run); it is missing")
        pytest.skip("no chromium (apt-get install chromium)")
    run, questions = run_dir
    out = tmp_path / "report.html"
    assert main(["--runs", str(run), "--questions", str(questions), "--out", str(out)]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1400,3000",
                    f"--screenshot={shot}", out.as_uri()], check=True, capture_output=True, timeout=120)
    pixels = Image.open(shot).convert("RGB")
    colours = pixels.getcolors(maxcolors=1 << 20)

    def painted(rgb, tol=12):
        return sum(n for n, c in colours if all(abs(a - b) <= tol for a, b in zip(c, rgb)))

    assert painted((31, 119, 180)) > 2_000  # tab:blue bars (resolution, depth) and the utilisation line
    assert painted((68, 1, 84)) > 2_000  # the accuracy heatmap's 0% cells (viridis)


def test_runs_in_folders_of_the_same_name_get_labels_that_tell_them_apart(tmp_path):
    from jobs.report import run_labels

    assert run_labels(["runs/beta", "runs/rag"]) == ["beta", "rag"]
    a, b = tmp_path / "a" / "out", tmp_path / "b" / "out"
    assert run_labels([str(a), str(b)]) == ["a/out", "b/out"]  # both "out" before: one overwrote the other
    with pytest.raises(UserError, match="same run twice"):
        run_labels([str(a), str(a)])
    # runs on an object store: told apart by bucket and key, never labelled with the credentials in their URIs
    assert run_labels(["s3://AKIAX:s3cr3t@bucket1/runs/out", "s3://AKIAX:s3cr3t@bucket2/runs/out?region=eu"]) == [
        "bucket1/runs/out", "bucket2/runs/out"]


def test_report_scores_recall_at_the_k_the_run_retrieved_as_compare_does(run_dir):
    """Before, report scored recall over every retrieved passage: a strategy reading past k (MIGRES over
    its iterations) read 100 in the report and 50 in the same run's eval.json."""
    from jobs.evaluate import evaluate
    from jobs.report import load_run

    run, questions = run_dir
    (run / "config.yaml").write_text("retrieval:\n  k: 1\n")
    rows = [answer_row("a", "rag", "Paris", "retrieval", retrieved_ids=["p2", "p1"]),
            answer_row("b", "rag", "no", "retrieval", retrieved_ids=["p9", "p1"])]
    pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), run / "rag" / "part-00000.parquet")
    shown = {(r["strategy"], r["dataset"]): r["recall@k any"] for r in load_run(str(run), str(questions), None)["scores"]}
    compared = {(r["strategy"], r["dataset"]): r["recall@k any"] for r in evaluate(str(run), str(questions), k=1)[0]}
    assert shown[("rag", "ALL")] == compared[("rag", "ALL")] == 50.0
    (run / "config.yaml").unlink()  # a folder of answers without a run's config: every passage retrieved
    assert {r["strategy"]: r["recall@k any"] for r in load_run(str(run), str(questions), None)["scores"]
            if r["dataset"] == "ALL"}["rag"] == 100.0


def test_a_strategy_of_no_tokens_stays_on_the_cost_quality_plane():
    """Before, the plane's log axis hid a strategy whose every row was an error (0 tokens a question)."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jobs.evaluate import cost_quality

    fig, ax = plt.subplots()
    cost_quality(ax, [{"strategy": "rag", "dataset": "ALL", "tokens/q": 700.0, "F1": 35.0, "acc": 33.0},
                      {"strategy": "broken", "dataset": "ALL", "tokens/q": 0.0, "F1": 0.0, "acc": 0.0}])
    assert len(ax.collections) == 2  # F1 and accuracy, each a point per strategy
    for points in ax.collections:
        shown = ax.transData.transform(points.get_offsets())
        assert len(shown) == 2 and all(math.isfinite(v) for xy in shown for v in xy)
    plt.close(fig)


def test_the_page_goes_where_out_says_on_any_filesystem_not_into_a_local_folder_named_after_the_uri(run_dir, tmp_path,
                                                                                                    monkeypatch):
    """Before, `--out s3://bucket/r.html` wrote a local folder `s3:` (as `--out file:///...` wrote `file:`)."""
    run, questions = run_dir
    monkeypatch.chdir(tmp_path)
    assert main(["--runs", str(run), "--questions", str(questions), "--out", f"file://{tmp_path}/pages/r.html"]) == 0
    assert (tmp_path / "pages" / "r.html").read_text().startswith("<!") and not (tmp_path / "file:").exists()


def test_report_warns_of_a_run_not_finished(run_dir, tmp_path, capsys):
    run, questions = run_dir
    (run / "_manifest.json").write_text(json.dumps({"input.rows": 4, "commit.shard_rows": 2}))  # rag, raisf: 1 of 2 parts
    assert main(["--runs", str(run), "--questions", str(questions), "--out", str(tmp_path / "r.html")]) == 0
    assert "rag has 1 of its 2 parts; raisf has 1 of its 2 parts" in capsys.readouterr().err
    assert "<strong>Not finished</strong>: " in (tmp_path / "r.html").read_text()  # the page says it too
    (run / "_manifest.json").write_text(json.dumps({"input.rows": 2, "commit.shard_rows": 2}))
    assert main(["--runs", str(run), "--questions", str(questions), "--out", str(tmp_path / "r.html")]) == 0
    assert "warning" not in capsys.readouterr().err and "Not finished" not in (tmp_path / "r.html").read_text()


def test_report_reads_of_the_answer_rows_only_the_columns_it_scores_and_draws(run_dir, tmp_path, monkeypatch):
    """Before, report read every column of every answer row (traces, questions, passages' scores) and held
    the rows until its plots were drawn: its memory grew with the run, GBs at a million rows."""
    import jobs.evaluate

    run, questions = run_dir
    asked = []
    read_table = jobs.evaluate.read_table

    def spy(path, columns=None):
        asked.append((str(path), columns))
        return read_table(path, columns)

    monkeypatch.setattr(jobs.evaluate, "read_table", spy)
    out = tmp_path / "report.html"
    assert main(["--runs", str(run), "--questions", str(questions), "--out", str(out)]) == 0
    parts = [columns for path, columns in asked if "part-" in path]
    assert len(parts) == 2 and all(columns and "trace" not in columns and "question" not in columns for columns in parts)
    assert "<td>raisf</td><td>ALL</td><td>2</td><td>2</td><td>100.0</td>" in out.read_text()


def test_runs_given_with_several_runs_flags_are_all_reported():
    """`--runs A --runs B` kept only B: the page left A out and said nothing."""
    import argparse

    from jobs.report import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--runs", "a", "--runs", "b", "c", "--questions", "q.parquet", "--out", "r.html"])
    assert args.runs == ["a", "b", "c"]
