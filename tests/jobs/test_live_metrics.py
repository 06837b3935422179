"""A run's counters reach Ray's metrics agent while it runs: scraped from the node's Prometheus endpoint
as a Prometheus server or the Ray dashboard would read them."""

import re
import time
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.stages import GeneratorStage
from jobs.answer import answer
from jobs.live_metrics import output_tag
from schemas.config import StageBatching
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeGenerator

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


def scrape(ray, output: str) -> dict[str, float]:
    node = ray._private.worker.global_worker.node
    text = urllib.request.urlopen(f"http://{node.node_ip_address}:{node.metrics_export_port}/metrics",
                                  timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("ray_ragsift_") and f'output="{output}"' in line:
            name = line.split("{", 1)[0]
            stage = re.search(r'stage="([^"]*)"', line)
            found[name + (f"[{stage.group(1)}]" if stage else "")] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_runs_counters_are_exported_as_ray_metrics(ray_session, tmp_path):
    ray = ray_session
    questions, out = tmp_path / "q.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"q{i}" for i in range(12)],
                             "question": [f"question {i}" + (" POISON" if i == 5 else "") for i in range(12)]}),
                   questions)
    actor = ray.remote(FakeGenerator).options(num_cpus=0).remote()
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct"], engine={"max_attempts": 2})
    answer(config, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())})

    wanted = {"ray_ragsift_pairs_done_total", "ray_ragsift_pairs_todo", "ray_ragsift_roots_in_flight",
              "ray_ragsift_stage_replicas_ready[generator]", "ray_ragsift_stage_errors_total[generator]"}
    deadline, found = time.time() + 60, {}
    while time.time() < deadline and not (wanted <= set(found) and found["ray_ragsift_pairs_done_total"] == 12):
        time.sleep(1)  # the metrics agent reports on its own interval, a gauge's value once
        found.update(scrape(ray, str(out)))
    assert found["ray_ragsift_pairs_done_total"] == 12 and found["ray_ragsift_pairs_todo"] == 12
    assert found["ray_ragsift_stage_requests_total[generator]"] >= 12
    assert found["ray_ragsift_stage_errors_total[generator]"] >= 1  # the POISON question
    assert found["ray_ragsift_stage_replicas_ready[generator]"] == 1 and found["ray_ragsift_roots_in_flight"] == 0
    assert found["ray_ragsift_tokens_total"] > 0


def test_a_run_whose_output_path_is_not_ascii_is_answered_and_its_counters_exported(ray_session, tmp_path):
    """Ray takes only ASCII tag values: a run writing under /home/josé/ stopped at its first progress report
    (UnicodeEncodeError from Metric.record), nothing answered. Its tag is now the path percent-encoded."""
    ray = ray_session
    questions, out = tmp_path / "q.parquet", tmp_path / "runs ünï 答え" / "out"
    pq.write_table(pa.table({"id": ["q0", "q1"], "question": ["question 0", "question 1"]}), questions)
    actor = ray.remote(FakeGenerator).options(num_cpus=0).remote()
    config = AnswerConfig(questions=str(questions), output=str(out), strategies=["direct"])
    metrics = answer(config, log=lambda *_: None, stages={"generator": GeneratorStage([actor], StageBatching())})
    assert metrics["roots_done"] == 2
    tag = output_tag(str(out))
    assert tag.isascii() and "%C3%BC" in tag and output_tag("/data/runs 100%/out") == "/data/runs 100%/out"
    deadline, found = time.time() + 60, {}
    while time.time() < deadline and found.get("ray_ragsift_pairs_done_total") != 2:
        time.sleep(1)
        found.update(scrape(ray, tag))
    assert found["ray_ragsift_pairs_done_total"] == 2
