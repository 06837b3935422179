"""ragsift evaluate's scores: which rows they average over, and the answer files it accepts."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.evaluate import evaluate
from schemas.errors import UserError
from schemas.tables import ANSWERS, SchemaError


def answer_row(qid: str, answer: str, strategy: str = "rag", **values) -> dict:
    row = {f.name: None for f in ANSWERS}
    row.update(id=qid, question=f"question {qid}", strategy=strategy, answer=answer, resolved_by="passages",
               retrieved_ids=[], citations=[], n_llm_calls=1, n_retrievals=1, n_subquestions=0, depth=0,
               n_parse_failures=0, prompt_tokens=100, completion_tokens=5, latency_s=1.0)
    row.update(values)
    return row


def write(tmp_path, rows: list[dict], questions: list[dict], part: str = "rag/part-00000.parquet"):
    (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=ANSWERS), tmp_path / part)
    pq.write_table(pa.Table.from_pylist(questions), tmp_path / "questions.parquet")
    return str(tmp_path), str(tmp_path / "questions.parquet")


def overall(table: list[dict]) -> dict:
    (row,) = [r for r in table if r["dataset"] == "ALL"]
    return row


def test_answer_scores_average_over_the_questions_with_a_gold_answer_and_costs_over_all(tmp_path):
    questions = [{"id": "a", "question": "?", "answers": ["Paris"]}, {"id": "b", "question": "?", "answers": []},
                 {"id": "c", "question": "?", "answers": [None, ""]}]
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("b", ""), answer_row("c", "")], questions)
    row = overall(evaluate(answers, qs)[0])
    assert (row["n"], row["scored"], row["EM"], row["F1"], row["acc"]) == (3, 1, 100.0, 100.0, 100.0)
    assert row["tokens/q"] == 105.0


def test_a_null_inside_a_gold_list_is_skipped_not_a_crash(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("b", "Rome")],
                        [{"id": "a", "question": "?", "answers": ["Paris", None]},
                         {"id": "b", "question": "?", "answers": ["Oslo"]}])
    row = overall(evaluate(answers, qs)[0])
    assert (row["scored"], row["EM"]) == (2, 50.0)


def test_yes_no_accuracy_and_accuracy_agree_on_a_yes_no_question(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Yes, there is no doubt")],
                        [{"id": "a", "question": "?", "answers": ["no"]}])
    row = overall(evaluate(answers, qs)[0])
    assert row["acc"] == 0.0 and row["yes/no acc (n)"] == "0.0 (1)"


def test_a_file_with_only_the_answer_columns_is_a_schema_error_naming_what_is_missing(tmp_path):
    pq.write_table(pa.table({"id": ["a"], "strategy": ["rag"], "answer": ["Paris"]}), tmp_path / "mine.parquet")
    pq.write_table(pa.table({"id": ["a"], "question": ["?"], "answers": [["Paris"]]}), tmp_path / "q.parquet")
    with pytest.raises(SchemaError, match="error"):
        evaluate(str(tmp_path / "mine.parquet"), str(tmp_path / "q.parquet"))


def test_two_runs_under_one_folder_are_a_clear_error_not_one_merged_score(tmp_path):
    questions = [{"id": "a", "question": "?", "answers": ["Paris"]}]
    write(tmp_path, [answer_row("a", "Paris")], questions, "beta=0/rag/part-00000.parquet")
    answers, qs = write(tmp_path, [answer_row("a", "Rome")], questions, "beta=1/rag/part-00000.parquet")
    with pytest.raises(UserError, match="evaluate each run's folder"):
        evaluate(answers, qs)


@pytest.mark.parametrize("k", ["0", "-1", "two"])
def test_a_recall_cut_off_below_one_is_refused_by_the_cli(k, capsys):
    import argparse

    from jobs.evaluate import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--answers", "a", "--questions", "q", "--k", k])
    assert "at least 1" in capsys.readouterr().err


def test_export_refuses_several_runs_under_one_folder_and_skips_an_empty_part(tmp_path):
    from jobs.export import export

    questions = [{"id": "a", "question": "?", "answers": ["Paris"]}]
    write(tmp_path, [answer_row("a", "Paris")], questions, "run/rag/part-00000.parquet")
    write(tmp_path, [], questions, "run/rag/part-00001.parquet")  # a shard with no question: no strategy
    assert export(str(tmp_path / "run"), str(tmp_path / "out.jsonl"), "openai-batch") == 1
    write(tmp_path, [answer_row("a", "Rome")], questions, "beta=1/rag/part-00000.parquet")
    with pytest.raises(UserError, match="export each run's folder"):
        export(str(tmp_path), str(tmp_path / "out.jsonl"), "rows")


def test_an_answer_to_a_question_not_in_the_file_is_an_error_not_dropped(tmp_path):
    """Before, such rows were skipped: a wrong questions file scored nothing, then the CLI crashed."""
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("zz", "Rome")],
                        [{"id": "a", "question": "?", "answers": ["Paris"]}])
    with pytest.raises(UserError, match=r"not in .*questions.parquet \(\{'rag': 1\} per strategy\)"):
        evaluate(answers, qs)


def test_the_error_row_of_a_question_without_an_id_is_scored_at_its_row(tmp_path):
    """The answer job gives a row without an id the stand-in id <row N> (its error row); evaluate dropped it."""
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("<row 1>", "", error="null id")],
                        [{"id": "a", "question": "?", "answers": ["Paris"]}, {"id": None, "question": "?", "answers": ["x"]}])
    row = overall(evaluate(answers, qs)[0])
    assert (row["n"], row["errors"], row["EM"]) == (2, 1, 50.0)


def test_a_repeated_question_id_is_scored_against_its_first_row_where_it_was_answered(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Paris")],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "dataset": "nq"},
                         {"id": "a", "question": "?", "answers": ["Rome"], "dataset": "tqa"}])
    table = evaluate(answers, qs)[0]
    assert [(r["dataset"], r["EM"]) for r in table] == [("nq", 100.0), ("ALL", 100.0)]


def test_a_dataset_named_all_is_refused_and_questions_without_a_dataset_count_in_all_only(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("b", "x")],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "dataset": "ALL"},
                         {"id": "b", "question": "?", "answers": ["y"], "dataset": "nq"}])
    with pytest.raises(UserError, match="a dataset named ALL"):
        evaluate(answers, qs)
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("b", "x")],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "dataset": None},
                         {"id": "b", "question": "?", "answers": ["y"], "dataset": "nq"}])
    assert [(r["dataset"], r["n"]) for r in evaluate(answers, qs)[0]] == [("nq", 1), ("ALL", 2)]


def test_recall_leaves_out_error_rows_and_null_gold_passage_ids(tmp_path):
    """README: error rows are not retrieval misses; a null gold passage id is no gold (it was a miss)."""
    answers, qs = write(tmp_path, [answer_row("a", "Paris", retrieved_ids=["p1"], citations=["p1"]),
                                   answer_row("b", "", retrieved_ids=["p7"], error="boom")],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "gold_passage_ids": ["p1", None]},
                         {"id": "b", "question": "?", "answers": ["x"], "gold_passage_ids": ["p1"]}])
    row = overall(evaluate(answers, qs)[0])
    assert (row["recall@k any"], row["recall@k all"], row["cite P / R (n)"]) == (100.0, 100.0, "100.0 / 100.0 (1)")


def test_null_counts_in_a_hand_written_file_are_a_schema_error_naming_them(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Paris", n_llm_calls=None)],
                        [{"id": "a", "question": "?", "answers": ["Paris"]}])
    with pytest.raises(SchemaError, match=r"null values in \['n_llm_calls'\]"):
        evaluate(answers, qs)


def test_a_pipe_in_a_dataset_name_stays_in_its_cell(tmp_path):
    from jobs.evaluate import markdown, resolution_markdown

    answers, qs = write(tmp_path, [answer_row("a", "Paris")],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "dataset": "nq|open"}])
    scores, resolved = evaluate(answers, qs)
    for text in (markdown(scores), resolution_markdown(resolved)):
        lines = text.splitlines()
        assert all(line.replace("\\|", "").count("|") == lines[0].count("|") for line in lines)


def test_reports_go_where_the_answers_are_on_any_filesystem_not_into_a_local_folder_named_after_the_uri(
        tmp_path, monkeypatch):
    from jobs.evaluate import answers_folder, write_reports
    from jobs.report import read_metrics

    answers, questions = write(tmp_path, [answer_row("a", "Paris")], [{"id": "a", "question": "q", "answers": ["Paris"]}])
    table, resolved = evaluate(answers, questions)
    monkeypatch.chdir(tmp_path)
    uri = f"file://{tmp_path}/cmp"  # as s3://bucket/cmp: Path() made it ./file:/.../cmp
    write_reports(table, uri, resolved)
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["eval.json", "eval.md", "eval.png", "resolution.json"]
    assert not (tmp_path / "file:").exists()
    assert (tmp_path / "cmp" / "eval.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "cmp" / "metrics.json").write_text('{"wall_s": 3}')
    assert read_metrics(f"{uri}/metrics.json") == {"wall_s": 3}  # report read it with Path: no metrics
    assert answers_folder(f"file://{tmp_path}/rag/part-00000.parquet") == f"file://{tmp_path}/rag"
    assert answers_folder(uri) == uri


def test_questions_in_json_lines_or_csv_are_read_as_answer_reads_them(tmp_path):
    import json

    answers, _ = write(tmp_path, [answer_row("007", "Paris"), answer_row("8", "Rome")], [])
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text("".join(json.dumps(q) + "\n" for q in [{"id": "007", "question": "q", "answers": ["Paris"]},
                                                           {"id": "8", "question": "q", "answers": ["Lyon"]}]))
    csv = tmp_path / "q.csv"
    csv.write_text("id,question,answers\n007,q,Paris\n8,q,Lyon|Nice\n")
    for questions in (jsonl, csv):  # "not a readable Parquet file" before, though answer had taken them
        table, _ = evaluate(answers, str(questions))
        assert (overall(table)["n"], overall(table)["EM"]) == (2, 50.0)
    with pytest.raises(UserError, match="which split was answered is the answer run's choice"):
        evaluate(answers, "hf:some/dataset")  # its default split, train, may not be the one answered
    csv.write_text("id,question,answers\n007,q,Paris\n")  # the other file: named as given, not its converted copy
    with pytest.raises(UserError, match=rf"questions that are not in {csv} \("):
        evaluate(answers, str(csv))


def test_evaluate_writes_its_files_before_printing_so_a_closed_stdout_keeps_them(tmp_path):
    """`ragsift evaluate ... | head -1`: the table was printed first, rich exited on the broken pipe, and
    eval.json was never written."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    answers, questions = write(tmp_path, [answer_row("a", "Paris")], [{"id": "a", "question": "q", "answers": ["Paris"]}])
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the first write
    try:
        subprocess.run([sys.executable, "-m", "jobs.cli", "evaluate", "--answers", answers, "--questions", questions],
                       cwd=REPO, stdout=writer, stderr=subprocess.DEVNULL, timeout=300)
    finally:
        os.close(writer)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("eval", "resolution"))) == [
        "eval.json", "eval.md", "eval.png", "resolution.json"]


def test_a_null_resolution_in_a_hand_written_file_is_a_schema_error_not_a_traceback(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Paris", resolved_by=None), answer_row("b", "Rome")],
                        [{"id": "a", "question": "?", "answers": ["Paris"]}, {"id": "b", "question": "?", "answers": ["x"]}])
    with pytest.raises(SchemaError, match=r"null values in \['resolved_by'\]"):
        evaluate(answers, qs)


def test_evaluate_scores_recall_at_the_runs_own_k_as_compare_and_report_do_and_says_which(tmp_path):
    """It took every retrieved passage (compare and report cut at the run's retrieval.k): the same rows read
    66.7 in compare's table and 100 once evaluate wrote over it."""
    import json

    from jobs.cli import run_job

    answers, qs = write(tmp_path, [answer_row("a", "Paris", retrieved_ids=["p1", "p2", "p3"])],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "gold_passage_ids": ["p1", "p3"]}])
    (tmp_path / "config.yaml").write_text("retrieval: {k: 2}\n")
    assert run_job("evaluate", ["--answers", answers, "--questions", qs]) == 0
    row = overall(json.loads((tmp_path / "eval.json").read_text()))
    assert (row["recall@k any"], row["recall@k all"], row["k"]) == (100.0, 0.0, 2)
    assert run_job("evaluate", ["--answers", answers, "--questions", qs, "--k", "3"]) == 0
    row = overall(json.loads((tmp_path / "eval.json").read_text()))
    assert (row["recall@k all"], row["k"]) == (100.0, 3)
    # one part of the run: the run's k too (it scored all retrieved)
    assert run_job("evaluate", ["--answers", f"{answers}/rag/part-00000.parquet", "--questions", qs]) == 0
    assert overall(json.loads((tmp_path / "rag" / "eval.json").read_text()))["k"] == 2
    (tmp_path / "config.yaml").unlink()  # answers without their run's config: every passage retrieved
    assert run_job("evaluate", ["--answers", answers, "--questions", qs]) == 0
    assert overall(json.loads((tmp_path / "eval.json").read_text()))["k"] is None


def test_only_the_gold_of_the_answered_questions_and_of_those_without_an_id_is_read_into_rows(tmp_path):
    """Scoring 300 answers against 1M questions held every question as a dict (1.45 GB)."""
    from jobs.evaluate import gold_needed

    answers, qs = write(tmp_path, [answer_row("b", "Rome")],
                        [{"id": q, "question": "?", "answers": [q]} for q in ("a", "b", None, "c", "b")])
    by_id, unnamed = gold_needed(qs, ["id", "question", "answers"], [str(tmp_path / "rag" / "part-00000.parquet")])
    assert by_id == {"b": {"id": "b", "answers": ["b"]}} and unnamed == {2: {"id": None, "answers": [None]}}


def test_evaluate_reads_of_an_answer_part_only_the_columns_it_scores_not_the_traces(tmp_path, monkeypatch):
    """Every answer row was held, its trace included, until its group was scored: 3 GB for a million answers."""
    import jobs.evaluate as evaluate_module

    answers, qs = write(tmp_path, [answer_row("a", "Paris", trace="x" * 1000)],
                        [{"id": "a", "question": "?", "answers": ["Paris"]}])
    read, real = [], evaluate_module.read_table
    monkeypatch.setattr(evaluate_module, "read_table",
                        lambda uri, columns=None: read.append((uri, columns)) or real(uri, columns))
    assert overall(evaluate(answers, qs)[0])["EM"] == 100.0
    (part_columns,) = [columns for uri, columns in read if uri.endswith("part-00000.parquet")]
    assert part_columns is not None and "trace" not in part_columns and "question" not in part_columns



def test_the_parts_of_a_split_passage_are_found_and_cited_as_their_passage(tmp_path):
    """An index of passages split into parts (index.chunk_words) retrieves ids <id>#<n>; the gold names whole
    passages. Where the run's identity (in each part's metadata) says so, a part counts as its passage; an
    id of the same shape from an index that split nothing is an id like any other."""
    import json

    rows = [answer_row("a", "Paris", retrieved_ids=["p9#0", "p1#3", "p1#4"], citations=["p1#3", "p2"])]
    questions = [{"id": "a", "question": "?", "answers": ["Paris"], "gold_passage_ids": ["p1"]}]
    answers, qs = write(tmp_path, rows, questions)
    row = overall(evaluate(answers, qs, k=2)[0])
    assert (row["recall@k any"], row["cite P / R (n)"]) == (0.0, "0.0 / 0.0 (1)")  # no split index: "p1#3" is not p1
    schema = ANSWERS.with_metadata({"ragsift": json.dumps({"index.chunks": {"words": 100, "overlap": 0, "split": 9}})})
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "rag/part-00000.parquet")
    row = overall(evaluate(answers, qs, k=2)[0])
    assert (row["recall@k any"], row["cite P / R (n)"]) == (100.0, "50.0 / 100.0 (1)")
    assert overall(evaluate(answers, qs, k=1)[0])["recall@k any"] == 0.0  # k parts, not k passages


def test_a_run_on_a_read_only_mount_is_scored_and_told_to_write_elsewhere(tmp_path, monkeypatch, capsys):
    """evaluate of a published run on a read-only mount ended with pyarrow's "[Errno 30] Failed to open local
    file .../eval.json", not a word of --out."""
    import errno

    from jobs import evaluate as evaluate_job
    from jobs.cli import main

    answers, qs = write(tmp_path, [answer_row("a", "Paris")], [{"id": "a", "question": "?", "answers": ["Paris"]}])
    real = evaluate_job.write_reports

    def read_only(table, out, *args, **kwargs):
        if str(out) == str(answers):
            raise OSError(errno.EROFS, f"Failed to open local file '{out}/eval.json'. Detail: [errno 30] Read-only file system")
        return real(table, out, *args, **kwargs)

    monkeypatch.setattr(evaluate_job, "write_reports", read_only)
    assert main(["evaluate", "--answers", answers, "--questions", qs]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Read-only file system" in err and "pass --out DIR" in err
    assert main(["evaluate", "--answers", answers, "--questions", qs, "--out", str(tmp_path / "scores")]) == 0
    assert (tmp_path / "scores" / "eval.json").exists()


def test_the_printed_table_shows_a_dataset_name_with_brackets_as_written(tmp_path, capsys):
    """rich read the cells as markup: `squad[v2]` printed as `squad`, and `x[/y]` raised MarkupError."""
    from jobs.evaluate import print_table

    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("b", "Rome")],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "dataset": "squad[v2]"},
                         {"id": "b", "question": "?", "answers": ["Rome"], "dataset": "x[/y]"}])
    table, _ = evaluate(answers, qs)
    print_table(table)
    out = capsys.readouterr().out
    assert "squad[v2]" in out and "x[/y]" in out


def test_recall_at_k_counts_a_row_that_retrieved_but_kept_no_passage_as_a_miss(tmp_path):
    """MIGRES's rows hold the passages its filter kept: one that kept none left recall's denominator (100.0
    over the one question that kept its gold)."""
    gold = {"answers": ["x"], "gold_passage_ids": ["g"]}
    answers, qs = write(tmp_path, [answer_row("a", "x", strategy="migres", retrieved_ids=["g"]),
                                   answer_row("b", "x", strategy="migres", retrieved_ids=[], n_retrievals=3),
                                   answer_row("c", "x", strategy="migres", retrieved_ids=[], n_retrievals=0)],
                        [{"id": q, "question": "?", **gold} for q in "abc"], part="migres/part-00000.parquet")
    row = overall(evaluate(answers, qs)[0])
    assert (row["recall@k any"], row["recall@k all"]) == (50.0, 50.0)  # c never retrieved: not scored


def test_tokens_per_correct_answer_counts_only_the_tokens_of_questions_with_a_gold_answer(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "Paris"), answer_row("b", "whatever", prompt_tokens=1000)],
                        [{"id": "a", "question": "?", "answers": ["Paris"]}, {"id": "b", "question": "?", "answers": []}])
    row = overall(evaluate(answers, qs)[0])
    assert (row["tokens/correct"], row["tokens/q"]) == (105, 555.0)


def test_a_claim_is_scored_by_the_runs_own_verdict_labels(tmp_path):
    answers, qs = write(tmp_path, [answer_row("a", "NOT SUPPORTED")],
                        [{"id": "a", "question": "?", "answers": ["SUPPORTED"], "kind": "claim"}])
    assert overall(evaluate(answers, qs)[0])["acc"] == 100.0  # outside a run: FEVER's labels, containment here
    (tmp_path / "config.yaml").write_text("answer_form: {verdicts: [SUPPORTED, NOT SUPPORTED]}\n")
    table, resolved = evaluate(answers, qs)
    assert overall(table)["acc"] == 0.0
    assert overall(resolved)["modules"]["passages"]["Corr"] == 0


def test_evaluating_a_strategy_folder_scores_recall_at_the_runs_own_k_and_warns_if_it_is_unfinished(tmp_path, capsys):
    import json

    from jobs.cli import run_job

    answers, qs = write(tmp_path, [answer_row("a", "Paris", retrieved_ids=["p1", "p2", "p3"])],
                        [{"id": "a", "question": "?", "answers": ["Paris"], "gold_passage_ids": ["p1", "p3"]}])
    (tmp_path / "config.yaml").write_text("retrieval: {k: 2}\n")
    (tmp_path / "_manifest.json").write_text(json.dumps({"input.rows": 2, "commit.shard_rows": 1}))
    assert run_job("evaluate", ["--answers", f"{answers}/rag", "--questions", qs]) == 0
    row = overall(json.loads((tmp_path / "rag" / "eval.json").read_text()))
    assert (row["recall@k all"], row["k"]) == (0.0, 2)
    assert "rag" in row["unfinished"] and "warning" in capsys.readouterr().err


def test_evaluate_of_answers_without_rows_says_so(tmp_path, capsys):
    from jobs.cli import run_job

    answers, qs = write(tmp_path, [], [{"id": "a", "question": "?", "answers": ["Paris"]}])
    assert run_job("evaluate", ["--answers", answers, "--questions", qs]) != 0
    assert "no rows to score" in capsys.readouterr().err


def test_the_cost_and_resolution_figures_are_each_rows_average_or_maximum_in_eval_and_resolution_json(tmp_path):
    import json

    from jobs.cli import run_job

    rows = [answer_row("a", "Paris", n_llm_calls=1, n_subquestions=0, latency_s=1.0, depth=0, n_parse_failures=0,
                       n_truncated=0),
            answer_row("b", "Rome", n_llm_calls=4, n_subquestions=3, latency_s=2.5, depth=2, n_parse_failures=1,
                       n_truncated=2),
            answer_row("c", "Oslo", n_llm_calls=2, n_subquestions=1, latency_s=0.25, depth=1, n_parse_failures=2,
                       n_truncated=None)]  # a row written before ragsift counted cut-off generations
    answers, qs = write(tmp_path, rows, [{"id": q, "question": "?", "answers": ["Paris"]} for q in "abc"])
    assert run_job("evaluate", ["--answers", answers, "--questions", qs]) == 0
    scores = overall(json.loads((tmp_path / "eval.json").read_text()))
    # 7 / 3 calls, 4 / 3 sub-questions, 3.75 / 3 s: averages over the 3 rows
    assert (scores["LLM calls/q"], scores["sub-q/q"], scores["latency s"]) == (2.33, 1.33, 1.25)
    resolution = overall(json.loads((tmp_path / "resolution.json").read_text()))
    # the deepest row's depth (not the last's 1 nor the sum 3), and the sums of failures and cut-off generations
    assert (resolution["sub-questions/q"], resolution["max depth"], resolution["parse failures"],
            resolution["cut off"]) == (1.33, 2, 3, 2)
