import json

import pytest

from jobs.sweep import with_value, write
from schemas.config import ConfigError
from strategies.registry import AnswerConfig


def test_each_value_gets_its_own_validated_config_and_folder():
    base = AnswerConfig(questions="q.parquet", output="out", strategies=["think_act"])
    config = with_value(base, "think_act.beta_threshold", "0.25")
    assert config.think_act.beta_threshold == 0.25 and config.output == "out/think_act.beta_threshold=0.25"
    assert base.think_act.beta_threshold == 0.5
    with pytest.raises(ConfigError, match="beta_threshold=2: Input should be less than or equal to 1"):
        with_value(base, "think_act.beta_threshold", "2")
    with pytest.raises(ConfigError, match="questions is not a config section"):
        with_value(base, "questions.x", "1")


def test_a_value_in_a_section_left_out_sets_that_section_as_set_does():
    """`--param judge.seed` said "judge is not a config section" (judge is null unless set); `--set judge.seed=5`
    sets it."""
    base = AnswerConfig(questions="q.parquet", output="out", strategies=["raisf"])
    assert base.judge is None and with_value(base, "judge.seed", "5").judge.seed == 5


def test_sweep_table_and_chart(tmp_path):
    rows = [{"value": v, "strategy": "think_act", "acc": 10.0 + i, "F1": 5.0, "retrieval ratio": 100.0 * i / 2,
             "LLM calls/q": 3.0} for i, v in enumerate(["0", "0.5", "1"])]
    write(rows, "think_act.beta_threshold", str(tmp_path))
    assert "| 0.5 | think_act | 11.0 | 5.0 | 50.0 | 3.0 |" in (tmp_path / "sweep.md").read_text()
    assert json.loads((tmp_path / "sweep.json").read_text()) == rows
    assert (tmp_path / "sweep.png").stat().st_size > 5_000


def test_the_sweep_table_is_printed_after_every_file_so_a_closed_stdout_keeps_them(tmp_path, monkeypatch,
                                                                                   closed_stdout):
    """`ragsift sweep ... | head -1`: the table was printed before sweep.png was drawn, and the broken pipe
    ended the job without it."""
    import sys

    rows = [{"value": v, "strategy": "think_act", "acc": 50.0, "F1": 40.0, "retrieval ratio": 30.0, "LLM calls/q": 2.0}
            for v in (0.1, 0.5)]
    monkeypatch.setattr(sys, "stdout", closed_stdout)
    with pytest.raises(BrokenPipeError):
        write(rows, "think_act.beta_threshold", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json", "sweep.md", "sweep.png"]


def test_a_value_that_would_change_the_shared_pools_is_refused():
    """The values share pools started once from the base config: before, a sweep over a sampling or
    model setting ran every value with the base's and said nothing."""
    from jobs.pools import pool_plan
    from jobs.sweep import check_shared_pools

    base = AnswerConfig(questions="q.parquet", output="out", strategies=["direct"])
    needs = {"generator"}
    pools = pool_plan(base, needs)
    for param, value in [("think_act.beta_threshold", "0.25"), ("retrieval.k", "10"), ("raisf.d_th", "2")]:
        check_shared_pools(base, with_value(base, param, value), needs, pools, f"{param}={value}")
    for param, value in [("sampling.temperature", "0.7"), ("generator.model", "smollm2-135m-instruct"),
                         ("retrieval.method", "bm25"), ("engine.window", "4")]:
        with pytest.raises(ConfigError, match=f"sweep {param}={value}: this setting configures the actor pools"):
            check_shared_pools(base, with_value(base, param, value), needs, pools, f"{param}={value}")
    # a value that changes which pools the strategies ask for: trained judges need the know and ranker
    # pools the base's judge-by-prompt run never built (before: a KeyError after the values before it)
    raisf = AnswerConfig(questions="q.parquet", output="out", strategies=["raisf"], know={"model": "m_know"},
                         reranker={"model": "m_rel"})
    needs = {"generator", "retriever", "judge"}
    with pytest.raises(ConfigError, match="raisf.judges=trained: this setting configures the actor pools"):
        check_shared_pools(raisf, with_value(raisf, "raisf.judges", "trained"), needs, {}, "raisf.judges=trained")


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_sweep_values_share_one_request_cache(ray_session, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.cache import RequestCache
    from engine.stages import GeneratorStage
    from jobs.answer import answer
    from schemas.config import StageBatching
    from tests.engine.fakes import CountingGenerator

    ray = ray_session
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(6)], "question": [f"question {i}" for i in range(6)]}),
                   tmp_path / "q.parquet")
    actor = ray.remote(CountingGenerator).options(num_cpus=0).remote()
    stages = {"generator": GeneratorStage([actor], StageBatching())}
    base = AnswerConfig(questions=str(tmp_path / "q.parquet"), output=str(tmp_path / "sweep"), strategies=["direct"])
    cache, runs = RequestCache(1000), []
    for value in ("0", "1"):  # a setting direct does not read: every request alike
        config = with_value(base, "think_act.beta_threshold", value)
        runs.append(answer(config, log=lambda *_: None, stages=stages, cache=cache))
    assert ray.get(actor.count.remote()) == 6  # the second value computed nothing again
    assert runs[1]["requests_deduped"] == 6 and all(c["ok"] for c in runs[1]["exactly_once"].values())
    # each value's metrics count its own work (the second value's counted the first's 6 requests too)
    assert [run["stages"]["generator"].get("requests", 0) for run in runs] == [6, 0]


@pytest.fixture
def charts(monkeypatch) -> list:
    """The figures sweep's write draws, kept as they are closed."""
    import matplotlib.pyplot as plt

    closed, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: closed.append(fig) or close(fig))
    return closed


def plotted(fig) -> dict[str, tuple[list, list]]:
    (ax,) = fig.axes
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_values_that_are_not_numbers_are_charted_in_the_order_given(tmp_path, charts):
    # `--values true,false` (or model names) failed in float() after every run had finished
    rows = [{"value": v, "strategy": "raisf", "acc": acc, "F1": 5.0, "retrieval ratio": 50.0, "LLM calls/q": 3.0}
            for v, acc in [("true", 10.0), ("false", 20.0)]]
    write(rows, "raisf.use_labels", str(tmp_path))
    assert (tmp_path / "sweep.png").stat().st_size > 5_000
    (fig,) = charts
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["true", "false"]  # not sorted to false, true
    assert plotted(fig)["raisf acc %"] == ([0, 1], [10.0, 20.0])


def test_numbers_are_charted_at_their_values_in_increasing_order_whatever_the_order_given(tmp_path, charts):
    """A line through "1,0,0.25" in the order given zig-zagged."""
    rows = [{"value": v, "strategy": "think_act", "acc": acc, "F1": 5.0, "retrieval ratio": ratio, "LLM calls/q": 3.0}
            for v, acc, ratio in [(1, 30.0, 100.0), (0, 10.0, 0.0), (0.25, 20.0, 50.0)]]
    write(rows, "think_act.beta_threshold", str(tmp_path))
    (fig,) = charts
    assert plotted(fig) == {"think_act acc %": ([0.0, 0.25, 1.0], [10.0, 20.0, 30.0]),
                            "think_act retrieval ratio %": ([0.0, 0.25, 1.0], [0.0, 50.0, 100.0])}


def test_values_are_trimmed_and_each_swept_once_by_the_setting_they_validate_to():
    """"1,1e0" and "true,yes,on" each answered one setting in several folders, and a trailing comma swept none."""
    from jobs.sweep import distinct_values

    base = AnswerConfig(questions="q.parquet", output="out", strategies=["think_act"])
    swept = distinct_values(base, "think_act.beta_threshold", "0, 0.5,0.0,0.5 ,1,1e0")
    assert [v for v, _ in swept] == ["0", "0.5", "1"] and [c.think_act.beta_threshold for _, c in swept] == [0, 0.5, 1]
    assert [v for v, _ in distinct_values(base, "think_act.assess", "true,yes,on,false")] == ["true", "false"]
    with pytest.raises(ConfigError, match="an empty value"):
        distinct_values(base, "think_act.ambiguity_threshold", "0.5,")


@pytest.mark.parametrize("param, strategy", [("think_act.beta_threshold", "rag"), ("label.match", "rag"),
                                             ("raisf.know_threshold", "think_act")])
def test_a_setting_no_strategy_of_the_run_reads_is_refused_before_anything_runs(tmp_path, capsys, param, strategy):
    """think_act.beta_threshold with --strategy rag answered every value alike: a flat table, as if the
    setting did nothing."""
    from jobs.cli import main
    from jobs.identity import sections_unread

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    code = main(["sweep", "--param", param, "--values", "exact,1", "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--strategy", strategy])
    section = param.split(".")[0]
    assert code == 2 and f"no strategy of this run ({strategy}) reads the {section} section" in capsys.readouterr().err
    base = AnswerConfig(questions="q.parquet", output="out", strategies=["raisf_labels", "think_act"])
    assert not {"raisf", "label", "think_act"} & sections_unread(base)  # raisf_labels reads RA-ISF's section


@pytest.mark.parametrize("param, values, why", [
    ("judge.model", "smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct", "asks for the judge pool"),
    ("reranker.model", "a,b", "asks for the reranker pool"), ("nli.model", "a,b", "asks for the nli pool"),
    ("know.model", "a,b", "asks for the know pool"), ("embedder.model", "all-minilm-l6-v2,bge-small", "when the index is built"),
    ("index.bm25_k1", "0.9,1.2", "when the index is built"), ("index.index_type", "flat,hnsw", "when the index is built"),
    ("index.chunk_words", "50,100", "when the index is built")])
def test_a_pool_no_strategy_asks_for_or_how_the_index_is_built_is_refused_before_any_pool_starts(
        tmp_path, capsys, param, values, why):
    """With --strategy rag, judge.model (a pool no strategy of the run asks for), embedder.model (a run encodes
    queries with its index's embedder) or index.chunk_words (the index is already built) answered every value
    alike, and sweep.md read as if the setting had no effect."""
    from jobs.cli import main
    from jobs.sweep import check_read

    with pytest.raises(ConfigError, match=why):  # the check the sweep runs first, on the base config
        check_read(AnswerConfig(questions="q.parquet", output="out", strategies=["rag"]), param, param.split(".")[0])
    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    code = main(["sweep", "--param", param, "--values", values, "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--index-dir", str(tmp_path / "idx"), "--strategy", "rag"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and error.startswith(f"ragsift sweep: error: sweep --param {param}: ") and why in error


def test_a_sweep_parameter_is_the_field_alone(tmp_path, capsys):
    """`--param retrieval.k=3` said "--param retrieval.k=3=1: Input should be a valid integer"."""
    from jobs.cli import main

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    code = main(["sweep", "--param", "retrieval.k=3", "--values", "1", "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--strategy", "direct"])
    assert code == 2 and "name the field alone; its values go in --values" in capsys.readouterr().err


def test_a_value_folder_holding_another_run_is_refused_before_any_value_is_answered(tmp_path, capsys):
    """Values 5,1 into a sweep of other questions answered k=5 into it, then stopped at k=1's folder."""
    from jobs.cli import main
    from jobs.output import MANIFEST

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    (tmp_path / "out" / "retrieval.k=1").mkdir(parents=True)
    (tmp_path / "out" / "retrieval.k=1" / MANIFEST).write_text(json.dumps({"input.sha256": "0" * 64, "input.rows": 9}))
    code = main(["sweep", "--param", "retrieval.k", "--values", "5,1", "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--strategy", "direct", "--generator", "smollm2-135m-instruct"])
    err = capsys.readouterr().err
    assert code == 2 and "retrieval.k=1 holds output of a different run" in err, err
    assert not (tmp_path / "out" / "retrieval.k=5").exists()


@pytest.mark.parametrize("param", ["cache.enabled", "ray.num_cpus", "output", "input.split", "input.columns",
                                   '"input".split'])  # a quoted key, as --set reads it
def test_a_setting_the_run_sets_once_is_refused_as_a_sweep_parameter(tmp_path, capsys, param):
    """cache.enabled=false still read the shared cache; output was overwritten by the value's folder; each
    input.split answered the questions the base config's split converted, under its own label. Refused
    before the questions are converted under the output."""

    from jobs.cli import main

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')  # converted first, before
    code = main(["sweep", "--param", param, "--values", "1,2", "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--strategy", "direct"])
    assert code == 2 and "set it with --set instead" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("param", ["", " "])
def test_an_empty_sweep_parameter_is_refused_asking_for_a_field(tmp_path, capsys, param):
    """``--param ''`` (an unset shell variable) said "--param =0: Extra inputs are not permitted"."""
    from jobs.cli import main

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    code = main(["sweep", "--param", param, "--values", "0,1", "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--strategy", "think_act"])
    assert code == 2 and "name the config field to vary" in capsys.readouterr().err


@pytest.mark.parametrize("param", [".", "a..b"])
def test_a_sweep_parameter_with_an_empty_name_is_refused_as_the_parameter(tmp_path, capsys, param):
    """``--param .`` was refused as "override '.=': ...", an override the user never wrote."""
    from jobs.cli import main

    (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Who?", "answers": ["x"]}\n')
    code = main(["sweep", "--param", param, "--values", "0,1", "--questions", str(tmp_path / "q.jsonl"),
                 "--output", str(tmp_path / "out"), "--strategy", "think_act"])
    err = capsys.readouterr().err
    assert code == 2 and f"sweep --param {param!r}: an empty name in its dotted key" in err and "override" not in err, err


def test_a_sweep_without_gold_answers_stops_before_answering_a_value(tmp_path, capsys):
    """It answered the whole first value, then found no answers column to score it against."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.cli import main

    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"]}), tmp_path / "q.parquet")
    code = main(["sweep", "--param", "think_act.beta_threshold", "--values", "0,1", "--questions",
                 str(tmp_path / "q.parquet"), "--output", str(tmp_path / "out"), "--strategy", "think_act"])
    assert code == 2 and "no `answers` column" in capsys.readouterr().err
    assert not (tmp_path / "out" / "think_act.beta_threshold=0").exists()


def test_a_sweep_without_questions_is_a_one_line_error(tmp_path, capsys):
    """The gold check read the columns of no file: a TypeError traceback."""
    from jobs.cli import main

    code = main(["sweep", "--param", "think_act.beta_threshold", "--values", "0,1", "--output", str(tmp_path / "o"),
                 "--strategy", "think_act"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("ragsift sweep: error:")


def without_pools(monkeypatch, answer, stages=None, stop=lambda stages, wait_s=60.0: None) -> None:
    """A sweep whose pools, Ray and answering are stand-ins: ``answer`` answers each value's run, ``stages`` are
    its pools and ``stop`` stops their engines."""
    import jobs.ray_session
    from jobs import sweep as sweep_job

    monkeypatch.setattr(jobs.ray_session, "init_ray", lambda *args, **kwargs: None)
    monkeypatch.setattr("ray.wait", lambda refs, **kwargs: (refs, []))  # no pools: no Ray
    monkeypatch.setattr(sweep_job, "pool_plan", lambda *args: {})
    monkeypatch.setattr(sweep_job, "build_stages", lambda *args: {} if stages is None else stages)
    monkeypatch.setattr("jobs.pools.stop_llm_engines", stop)
    monkeypatch.setattr(sweep_job.answer_job, "answer", answer)
    monkeypatch.setattr(sweep_job.answer_job, "check_output", lambda *args, **kwargs: None)


def test_a_sweep_whose_value_ran_into_error_rows_only_exits_3_after_every_value(tmp_path, monkeypatch, capsys):
    """It exited 0 whatever its runs held, as answer did."""
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs import sweep as sweep_job
    from jobs.cli import main

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], "answers": [["x"]]}), questions)
    answered = []

    def answer(config, **kwargs):  # k=1 fails every row, k=2 none
        answered.append(config.retrieval.k)
        Path(config.output).mkdir(parents=True)
        errors = 1 if config.retrieval.k == 1 else 0
        return {"exactly_once": {"rag": {"rows": 1, "errors": errors}}, "wall_s": 1, "requests_deduped": 0}

    without_pools(monkeypatch, answer)
    monkeypatch.setattr(sweep_job, "evaluate", lambda *args, **kwargs: (
        [{"strategy": "rag", "dataset": "ALL", "acc": 0.0, "F1": 0.0, "LLM calls/q": 1.0}], []))
    monkeypatch.setattr(sweep_job, "answer_files", lambda *args: ["part"])
    monkeypatch.setattr(sweep_job, "read_table", lambda *args: pa.table({"n_retrievals": [1]}))
    code = main(["sweep", "--param", "retrieval.k", "--values", "1,2", "--questions", str(questions),
                 "--output", str(tmp_path / "sweep"), "--strategy", "rag"])
    assert code == 3 and answered == [1, 2]
    assert "ragsift sweep (retrieval.k=1): error: 1 of the output's 1 rows are error rows" in capsys.readouterr().err


def test_a_values_retrieval_ratio_is_the_share_of_its_answers_that_retrieved_and_its_llm_calls_are_evaluates(
        tmp_path, monkeypatch):
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs import sweep as sweep_job
    from jobs.cli import main

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], "answers": [["x"]]}), questions)
    retrievals = {"retrieval.k=1": [0, 2, 1, 0], "retrieval.k=2": [1, 3, 1, 0]}  # 2 of 4 retrieved; 3 of 4
    calls = {"retrieval.k=1": 2.5, "retrieval.k=2": 4.25}

    def answer(config, **kwargs):
        Path(config.output).mkdir(parents=True)
        return {"exactly_once": {"rag": {"rows": 4, "errors": 0}}, "wall_s": 1, "requests_deduped": 0}

    without_pools(monkeypatch, answer)
    monkeypatch.setattr(sweep_job, "evaluate", lambda output, *args, **kwargs: (
        [{"strategy": "rag", "dataset": "ALL", "acc": 0.0, "F1": 0.0, "LLM calls/q": calls[Path(output).name]}], []))
    monkeypatch.setattr(sweep_job, "answer_files", lambda folder: [folder])  # one part a strategy, named by its folder
    monkeypatch.setattr(sweep_job, "read_table", lambda part, columns: pa.table(
        {"n_retrievals": retrievals[Path(part).parent.name]}))
    assert main(["sweep", "--param", "retrieval.k", "--values", "1,2", "--questions", str(questions),
                 "--output", str(tmp_path / "sweep"), "--strategy", "rag"]) == 0
    table = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [(r["value"], r["retrieval ratio"], r["LLM calls/q"]) for r in table] == [(1, 50.0, 2.5), (2, 75.0, 4.25)]


def test_a_sweep_stopped_midway_stops_its_llm_engines_too(tmp_path, monkeypatch):
    """They were stopped only after the last value: Ctrl-C (or a failing value) left the engine cores to Ray's
    exit, which they outlived holding their memory."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.cli import main

    questions = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Who?"], "answers": [["x"]]}), questions)
    stopped = []

    def answer(config, **kwargs):
        raise KeyboardInterrupt

    stages = {"generator": SimpleNamespace(replicas=[])}
    without_pools(monkeypatch, answer, stages, stop=lambda stages, wait_s=60.0: stopped.append((stages, wait_s)))
    code = main(["sweep", "--param", "retrieval.k", "--values", "1,2", "--questions", str(questions),
                 "--output", str(tmp_path / "sweep"), "--strategy", "rag"])
    assert code == 130 and stopped == [(stages, 15.0)]


def test_values_are_cut_at_top_level_commas_so_lists_and_quoted_text_can_be_swept():
    """`--values '[multi-hop, sub-question],[multi-hop]'` was cut at every comma: "[multi-hop" was refused as YAML."""
    from jobs.sweep import distinct_values

    base = AnswerConfig(questions="q.parquet", output="out", strategies=["rag"])
    swept = distinct_values(base, "answer_form.detect_yes_no", "[multi-hop, sub-question], [multi-hop],['x, y']")
    assert [c.answer_form.detect_yes_no for _, c in swept] == [["multi-hop", "sub-question"], ["multi-hop"], ["x, y"]]
