"""One registry: a strategy installed by another package (entry point ``ragsift.strategies``) runs
through the CLI with its own config section and its own prompt files, without editing ragsift."""

import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq

from strategies.registry import ANSWERING, STRATEGIES, AnswerConfig
from tests.conftest import REPO, SAMPLE_QUESTIONS

TINY = '''
"""A user's strategy: answers with the question shouted, plus a configurable suffix."""
from pydantic import Field

from engine.steps import Done
from schemas.config import Section
from strategies.base import Routine, prompt


class ShoutConfig(Section):
    suffix: str = Field("!", description="appended to the answer")


class Shout(Routine):
    name = "shout"
    Config = ShoutConfig
    stages = frozenset()

    def __init__(self, config):
        self.config = config

    def solve(self, item):
        item.trace.append({"step": "shout"})
        return Done(prompt("shout/prefix", __package__) + item.question.upper() + self.config.suffix, "shouted")
        yield  # a generator, like every strategy
'''


def test_built_in_strategies_declare_what_the_registry_needs():
    assert {"direct", "rag", "raisf", "least_to_most", "self_reasoning", "think_act", "migres"} <= set(ANSWERING)
    assert "raisf_labels" in STRATEGIES and "raisf_labels" not in ANSWERING
    config = AnswerConfig()
    assert config.raisf.d_th == 3 and config.migres.max_iterations == 5  # each strategy's own section


def test_a_strategy_from_an_entry_point_runs_through_the_cli_with_prompts_from_its_own_package(tmp_path):
    site = tmp_path / "site"
    (site / "tiny_shout-0.1.dist-info").mkdir(parents=True)
    (site / "tiny_shout" / "prompts" / "shout").mkdir(parents=True)
    (site / "tiny_shout" / "__init__.py").write_text(textwrap.dedent(TINY))
    (site / "tiny_shout" / "prompts" / "shout" / "prefix.txt").write_text("LOUDLY: \n")  # stripped, as ragsift's are
    (site / "tiny_shout-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-shout\nVersion: 0.1\n")
    (site / "tiny_shout-0.1.dist-info" / "entry_points.txt").write_text("[ragsift.strategies]\nshout = tiny_shout:Shout\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "answer", "--questions", str(SAMPLE_QUESTIONS), "--limit", "3",
                           "--output", str(tmp_path / "out"), "--strategy", "shout", "--set", "shout.suffix=?!"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pq.read_table(tmp_path / "out" / "shout").to_pylist()
    questions = pq.read_table(SAMPLE_QUESTIONS).slice(0, 3)["question"].to_pylist()
    assert sorted(r["answer"] for r in rows) == sorted("LOUDLY:" + q.upper() + "?!" for q in questions)
    assert {r["resolved_by"] for r in rows} == {"shouted"}


def test_a_plugin_that_does_not_load_leaves_the_built_in_strategies_working_and_is_named_where_asked_for(tmp_path):
    """An installed strategy plugin whose import failed (a missing dependency) failed every ragsift command,
    `--strategy rag` too, with a traceback from the registry's import."""
    site = tmp_path / "site"
    (site / "broken_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "broken_plugin.py").write_text("import a_dependency_not_installed\n")
    (site / "broken_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    entry = "[ragsift.strategies]\nbroken = broken_plugin:Broken\n"
    (site / "broken_plugin-0.1.dist-info" / "entry_points.txt").write_text(entry)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "RAY_ADDRESS": ""}
    check = "from strategies.registry import AnswerConfig; print(AnswerConfig(strategies=['rag']).strategies)"
    proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "['rag']", proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "answer", "--questions", str(SAMPLE_QUESTIONS),
                           "--output", str(tmp_path / "out"), "--strategy", "broken"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert ("strategy plugins that did not load: broken (broken_plugin:Broken: ModuleNotFoundError: No module named "
            "'a_dependency_not_installed')") in proc.stderr
