"""The demo reuses its index only when it was built from the embedded corpus with the same shard count."""

import json

import pytest

from jobs import demo
from jobs.index import FORMAT, MANIFEST


@pytest.fixture
def builds(monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "build_index", lambda config, log, extra: calls.append((config, extra)))
    return calls


def write_manifest(index_dir, **fields):
    index_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"format": FORMAT, "corpus_sha256": demo.corpus_sha256(), "shards": [{}, {}], **fields}
    (index_dir / MANIFEST).write_text(json.dumps(manifest))


def test_the_demo_builds_its_index_where_there_is_none(tmp_path, builds):
    demo.ensure_index(tmp_path / "idx", 2, log=lambda *a: None)
    [(config, extra)] = builds
    assert config.index.path == str(tmp_path / "idx") and config.index.shards == 2
    assert extra == {"corpus_sha256": demo.corpus_sha256()}


def test_the_demo_reuses_an_index_of_its_corpus_and_shard_count(tmp_path, builds):
    write_manifest(tmp_path / "idx")
    said = []
    demo.ensure_index(tmp_path / "idx", 2, log=said.append)
    assert builds == [] and said == [f"using the demo index at {tmp_path / 'idx'}"]


@pytest.mark.parametrize("fields, shards", [({"corpus_sha256": "0" * 64}, 2), ({}, 3), ({"format": FORMAT - 1}, 2)])
def test_the_demo_rebuilds_an_index_of_another_corpus_shard_count_or_format(tmp_path, builds, fields, shards):
    write_manifest(tmp_path / "idx", **fields)
    demo.ensure_index(tmp_path / "idx", shards, log=lambda *a: None)
    assert len(builds) == 1 and builds[0][0].index.shards == shards


@pytest.mark.parametrize("text", ['{"format": ', "[]", '{"format": %d}'])
def test_a_damaged_manifest_is_rebuilt_like_a_missing_one(tmp_path, builds, text):
    """Before, every demo (make demo too) stopped at "manifest.json is damaged; rebuild it with ragsift index",
    or a KeyError / AttributeError for a manifest that reads as JSON but not as one."""
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / MANIFEST).write_text(text.replace("%d", str(FORMAT)))
    demo.ensure_index(tmp_path / "idx", 2, log=lambda *a: None)
    assert len(builds) == 1


def demo_args(tmp_path, *more):
    import argparse

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(["--output", str(tmp_path / "out"), "--index-dir", str(tmp_path / "idx"), *more])


@pytest.mark.parametrize("setting", ["index.path=/elsewhere", "index.shards=3", "output=/elsewhere", "questions=q.parquet",
                                     "limit=3", "generator.model=other"])
def test_a_set_of_what_the_demos_flags_decide_is_refused(tmp_path, builds, setting):
    """Before, `--set index.path` answered from another index than the one the demo said it used, and
    `--set output` / `questions` were silently outranked."""
    from schemas.errors import UserError

    with pytest.raises(UserError, match=f"demo --set {setting.split('=')[0]}: (set by the demo's flags|the demo builds)"):
        demo.run(demo_args(tmp_path, "--set", setting))
    assert builds == []


@pytest.mark.parametrize("setting", ["index={path: /elsewhere}", "index={nprobe: 4}", "generator={model: other}"])
def test_a_whole_section_set_past_the_demos_flags_is_refused(tmp_path, builds, setting):
    """`--set 'index={path: ...}'` answered from another index than the one the demo said it used, and
    `index={nprobe: 4}` reset its path; `generator={model: ...}` outranked --generator."""
    from schemas.errors import UserError

    with pytest.raises(UserError, match=r"set its fields one by one"):
        demo.run(demo_args(tmp_path, "--set", setting))
    assert builds == []


@pytest.mark.parametrize("setting", ["index.chunk_words=100", "index.index_type=hnsw", "embedder.model=other"])
def test_how_the_demo_index_is_built_is_refused_pointing_at_ragsift_index_and_answering_from_it(
        tmp_path, builds, monkeypatch, setting):
    """It said to "use `ragsift answer` for other index settings", which searches its index as built; and
    `--set embedder.model` was taken, answering with the demo index's embedder all the same."""
    from schemas.errors import UserError

    monkeypatch.setattr(demo, "answer", lambda *a, **k: pytest.fail("answered"))
    with pytest.raises(UserError, match=rf"demo --set {setting.split('=')[0]}: the demo builds its own index .*; to "
                                        r"build one another way, use `ragsift index` and answer from it with `ragsift "
                                        r"answer --index-dir`"):
        demo.run(demo_args(tmp_path, "--set", setting))
    assert builds == []


def test_a_search_time_index_setting_is_the_demos_to_take(tmp_path, builds, monkeypatch):
    answered = []
    monkeypatch.setattr(demo, "answer", lambda config, log, force: answered.append(config.index.nprobe) or {})
    monkeypatch.setattr(demo, "llm_settings", lambda llm: None)
    monkeypatch.setattr(demo, "evaluate", lambda *a, **k: ([], []))
    monkeypatch.setattr(demo, "write_reports", lambda *a, **k: None)
    write_manifest(tmp_path / "idx")
    demo.run(demo_args(tmp_path, "--set", "index.nprobe=4"))
    assert answered == [4]


def test_a_quoted_set_key_is_read_as_the_config_reads_it(tmp_path, builds, monkeypatch):
    """The demo's own check took each --set's text before its first "=" as the key: a quoted `index."nprobe"`
    was refused as an index build setting, and a quoted key holding "=" was cut inside its quotes."""
    answered = []
    monkeypatch.setattr(demo, "answer", lambda config, log, force: answered.append(
        (config.index.nprobe, config.answer_form.by_dataset)) or {})
    monkeypatch.setattr(demo, "llm_settings", lambda llm: None)
    monkeypatch.setattr(demo, "evaluate", lambda *a, **k: ([], []))
    monkeypatch.setattr(demo, "write_reports", lambda *a, **k: None)
    write_manifest(tmp_path / "idx")
    demo.run(demo_args(tmp_path, "--set", 'index."nprobe"=4', "--set", 'answer_form.by_dataset."index=x"=yes_no'))
    assert answered == [(4, {"index=x": "yes_no"})]


def test_a_model_that_is_not_there_is_refused_before_the_index_is_built(tmp_path, builds):
    """Before, a missing generator was found after the index build (2.5 minutes on a fresh box)."""
    with pytest.raises(FileNotFoundError, match="not-a-model"):
        demo.run(demo_args(tmp_path, "--generator", str(tmp_path / "not-a-model")))
    assert builds == []


def test_a_demo_of_other_settings_in_the_same_output_is_refused_unless_forced(tmp_path, builds, monkeypatch):
    """Before, `ragsift demo --limit 5` after `make demo` silently replaced the 200 answers. The stand-in for
    `answer` opens the output as answer does (its run identity, the refusal), and answers nothing."""
    from jobs.identity import identity_defaults, operational, run_identity
    from jobs.output import ShardedOutput
    from jobs.questions import plan_input
    from schemas.config import ConfigError

    answered = []

    def opens(config, log, force):
        identity = run_identity(config, plan_input(config.questions, limit=config.limit))
        ShardedOutput(config.output, identity, config.strategies, config.commit.shard_rows, force=force, log=log,
                      defaults=identity_defaults(), speed=operational)
        answered.append((config.limit, force))
        return {}  # its metrics: no row answered

    monkeypatch.setattr(demo, "answer", opens)
    monkeypatch.setattr(demo, "llm_settings", lambda llm: None)
    monkeypatch.setattr(demo, "evaluate", lambda *a, **k: ([], []))
    monkeypatch.setattr(demo, "write_reports", lambda *a, **k: None)
    write_manifest(tmp_path / "idx")
    demo.run(demo_args(tmp_path))
    with pytest.raises(ConfigError, match=r"differs in: input.rows \(how many questions: --limit"):
        demo.run(demo_args(tmp_path, "--limit", "5"))
    demo.run(demo_args(tmp_path, "--limit", "5", "--force"))
    assert answered == [(None, False), (5, True)]


def test_the_demo_reads_and_builds_a_tilde_index_dir_in_the_same_place(tmp_path, monkeypatch):
    """`--index-dir=~/idx` (no shell expansion after `=`): the index was built under $HOME (the config expands
    `~`) and looked for under ./~/idx, so every demo built it again."""

    from jobs import demo as demo_job

    class Reached(Exception):
        pass

    def ensure_index(index_dir, shards, log):
        raise Reached(index_dir)

    from jobs.models import ragsift_home

    monkeypatch.setenv("RAGSIFT_HOME", str(ragsift_home()))  # the prepared models stay where they are
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(demo_job, "ensure_index", ensure_index)
    args = demo_job_args(tmp_path)
    with pytest.raises(Reached) as reached:
        demo_job.run(args)
    assert reached.value.args[0] == tmp_path / "idx"


def demo_job_args(tmp_path):
    from jobs import demo as demo_job
    from jobs.cli import _parser

    return _parser("demo", demo_job).parse_args(["--index-dir", "~/idx", "--output", str(tmp_path / "o")])


def test_a_demo_whose_error_rows_pass_the_max_error_share_exits_3_as_answer_does(tmp_path, builds, monkeypatch, capsys):
    """`ragsift demo` exited 0 whatever share of its rows were error rows; answer, compare, label and sweep exit 3."""
    checked = {s: {"ok": True, "rows": 200, "errors": errors} for s, errors in (("direct", 0), ("rag", 30))}
    monkeypatch.setattr(demo, "answer", lambda config, log, force: {"exactly_once": checked})
    monkeypatch.setattr(demo, "llm_settings", lambda llm: None)
    monkeypatch.setattr(demo, "evaluate", lambda *a, **k: ([], []))
    monkeypatch.setattr(demo, "write_reports", lambda *a, **k: None)
    write_manifest(tmp_path / "idx")
    assert demo.run(demo_args(tmp_path, "--set", "commit.max_error_share=0.05")) == 3
    assert "ragsift demo: error: 30 of the output's 400 rows are error rows" in capsys.readouterr().err
    assert demo.run(demo_args(tmp_path, "--set", "commit.max_error_share=0.1")) == 0
