"""Actor pools and the Ray they run on: a local Ray holds every pool a run asks for."""

import json
import os
import subprocess
import sys

from actors.know import WEIGHTS
from jobs.pools import cpus_requested, pool_plan
from strategies.registry import AnswerConfig
from tests.conftest import REPO


def test_a_local_ray_is_sized_by_the_same_plan_the_pools_are_built_from(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the models here are names only: not looked up
    (tmp_path / "manifest.json").write_text(json.dumps({"embedder": "e", "shards": [{"dir": "s0"}, {"dir": "s1"}]}))
    (tmp_path / "m_know").mkdir()
    (tmp_path / "m_know" / WEIGHTS).write_text(json.dumps({"embedder": "e", "coef": [], "intercept": 0.0}))
    config = AnswerConfig.model_validate({"index": {"path": str(tmp_path)}, "generator": {"model": "g"},
                                          "reranker": {"model": "m_rel"}, "know": {"model": str(tmp_path / "m_know")}})
    plan = pool_plan(config, {"generator", "retriever", "ranker", "know"})
    assert {name: len(pool.replicas) for name, pool in plan.items()} == {
        "generator": 1, "encoder": 1, "shards": 2, "ranker": 1, "know": 1}
    assert [args[0] for args in plan["shards"].replicas] == [str(tmp_path / "s0"), str(tmp_path / "s1")]
    # generator 1 + embedder 0.5 + 2 shards x 0.25 + cross-encoder 0.5 + know 0.5
    assert cpus_requested(plan) == 3.0
    assert cpus_requested(pool_plan(config, {"generator"})) == 1.0
    # without a reranker.model the ranker is the embedder pool: nothing more
    bare = AnswerConfig.model_validate({"index": {"path": str(tmp_path)}, "embedder": {"model": "e"}})
    assert list(pool_plan(bare, {"ranker"})) == ["encoder"]
    assert cpus_requested(pool_plan(bare, {"ranker"})) == 0.5


def test_an_index_whose_vectors_do_not_match_its_embedder_is_refused_before_anything_starts(tmp_path):
    """Before, every row became an AssertionError row, the parts were committed and the run exited 0."""
    import pytest

    from jobs.models import resolve
    model = resolve("all-minilm-l6-v2")  # 384-d
    config = AnswerConfig.model_validate({"index": {"path": str(tmp_path)}})
    for dims, ok in ((384, True), (768, False)):
        (tmp_path / "manifest.json").write_text(json.dumps({"embedder": model, "dims": dims, "shards": [{"dir": "s0"}]}))
        if ok:
            assert "shards" in pool_plan(config, {"retriever"})
        else:
            with pytest.raises(ValueError, match="768-d vectors but its embedder .* makes 384-d ones"):
                pool_plan(config, {"retriever"})


def test_a_local_ray_is_started_with_at_least_the_cpus_the_pools_request():
    """On a 2-core box RA-ISF with trained judges asks for 2.75 CPUs; with Ray sized to os.cpu_count() its
    know and ranker actors were never placed and the run waited forever."""
    code = ("import os, ray; from jobs.ray_session import init_ray; from schemas.config import RayConfig; "
            "init_ray(RayConfig(), os.cpu_count() + 1.5); print(int(ray.cluster_resources()['CPU']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) == os.cpu_count() + 2
