"""Python API for notebooks: run strategies over an in-memory table and get the answers back.

    from jobs.api import answer_table
    answers = answer_table(df, strategies=["rag"], index_dir="~/.cache/ragsift/indexes/demo",
                           columns={"question": "query"}, overrides=["generator.model=qwen2.5-coder-1.5b-instruct"])

The questions (a pandas DataFrame, Arrow table, ``datasets.Dataset`` or list of dicts) are written to
Parquet and answered by the same ``answer`` job as the CLI (same engine, config, exactly-once
output), then read back: one row per (question, strategy), as a DataFrame for DataFrame input and
an Arrow table otherwise.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.inputs import to_arrow


def answer_table(questions: Any, strategies: list[str] | str = "rag", *, index_dir: str | None = None,
                 columns: dict[str, str] | None = None, config: str | None = None, overrides: list[str] = (),
                 output: str | None = None, log=None):
    """Answer ``questions`` with each strategy; see the module docstring. ``output`` keeps the run
    (answers, metrics.json) there instead of in a temporary directory."""
    from jobs.answer import answer
    from jobs.evaluate import answer_files
    from schemas.config import load_config
    from strategies.registry import AnswerConfig

    table = to_arrow(questions, columns)
    strategies = [strategies] if isinstance(strategies, str) else list(strategies)
    with tempfile.TemporaryDirectory(prefix="ragsift-") as tmp:
        path = Path(tmp) / "questions.parquet"
        pq.write_table(table, path)
        extra = [f"index.path={Path(index_dir).expanduser()}"] if index_dir else []
        cfg = load_config(AnswerConfig, config, [*overrides, *extra], questions=str(path),
                          output=output or str(Path(tmp) / "answers"), strategies=strategies)
        answer(cfg, log=log or (lambda *a, **k: None), force=True)
        answers = pa.concat_tables([pq.read_table(f) for f in answer_files(cfg.output)])
    return answers.to_pandas() if type(questions).__module__.startswith("pandas") else answers
