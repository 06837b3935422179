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


def test_sweep_table_and_chart(tmp_path):
    rows = [{"value": v, "strategy": "think_act", "acc": 10.0 + i, "F1": 5.0, "retrieval ratio": 100.0 * i / 2,
             "LLM calls/q": 3.0} for i, v in enumerate(["0", "0.5", "1"])]
    write(rows, "think_act.beta_threshold", str(tmp_path))
    assert "| 0.5 | think_act | 11.0 | 5.0 | 50.0 | 3.0 |" in (tmp_path / "sweep.md").read_text()
    assert json.loads((tmp_path / "sweep.json").read_text()) == rows
    assert (tmp_path / "sweep.png").stat().st_size > 5_000
