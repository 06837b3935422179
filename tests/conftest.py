import os

# Offline and quiet before any library import; set here so plain `pytest` behaves like `make test`.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# tests count what their runs compute: none reads another test's (or an earlier run's) responses from the
# disk request cache; the cache's own tests turn it on with a path of their own
os.environ.setdefault("RAGSIFT_NO_CACHE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "data" / "demo"
SAMPLE_QUESTIONS = DEMO / "sample_questions.parquet"
SAMPLE_CORPUS = DEMO / "sample_corpus.parquet"
# The override for real-model runs that are not about serving: on a CPU an async replica is three processes
# that each import vLLM, ~25 s more a start than a batch one (BENCHMARKS.md, "Starting a replica on a CPU")
IN_BATCH = "generator.serving=batch"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (starting Ray costs ~4 s)."""
    import ray

    from jobs.ray_session import init_ray
    from schemas.config import RayConfig

    init_ray(RayConfig(num_cpus=4))
    yield ray
    ray.shutdown()


@pytest.fixture
def closed_stdout():
    """A stand-in for stdout, a pipe whose reader has gone (`ragsift evaluate | head -1`): a write raises
    BrokenPipeError, on which rich points stdout's descriptor at /dev/null and exits; this one's is /dev/null
    already. Set it as sys.stdout in the test's body: pytest sets its own capture there after the fixtures."""
    import io

    descriptor = os.open(os.devnull, os.O_WRONLY)

    class ClosedPipe(io.TextIOBase):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            return descriptor

    yield ClosedPipe()
    os.close(descriptor)
