"""A run of ``answer()`` on stub actors, as its own process (the resume test kills it midway).

    python -m tests.jobs.resume_run QUESTIONS OUTPUT [--as-cli]
"""

import sys

import ray

from engine.stages import GeneratorStage, RetrieverStage
from jobs.answer import answer
from schemas.config import StageBatching
from strategies.registry import AnswerConfig
from tests.engine.fakes import FakeEncoder, FakeShard, SlowGenerator


def run(questions: str, output: str) -> int:
    config = AnswerConfig(questions=questions, output=output, strategies=["direct", "rag"],
                          commit={"shard_rows": 10}, engine={"window": 8})
    stages = {
        "generator": GeneratorStage([ray.remote(SlowGenerator).options(num_cpus=0).remote(0.1)],
                                    StageBatching(max_batch=4, max_wait_s=0.0)),
        "retriever": RetrieverStage([ray.remote(FakeEncoder).options(num_cpus=0).remote()],
                                    [ray.remote(FakeShard).options(num_cpus=0).remote("a")], StageBatching()),
    }
    answer(config, log=lambda *a: print(*a, flush=True), stages=stages)
    return 0


if __name__ == "__main__":
    questions, output = sys.argv[1:3]
    if "--as-cli" in sys.argv:  # the command's signal handling and its Ray start (jobs/cli.py, jobs/ray_session.py)
        import argparse
        import types

        from jobs.cli import _execute
        from jobs.ray_session import init_ray
        from schemas.config import RayConfig

        def job(args):
            init_ray(RayConfig(num_cpus=2, object_store_mb=128))
            return run(questions, output)

        sys.exit(_execute("answer", types.SimpleNamespace(run=job), argparse.Namespace(debug=False)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20)
    run(questions, output)
