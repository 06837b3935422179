"""Actor pools and the Ray they run on: a local Ray holds every pool a run asks for."""

import json
import os
import subprocess
import sys

import pytest

from actors.know import WEIGHTS
from jobs.pools import cpus_requested, gpu_demands, pool_plan, ray_request
from schemas.errors import UserError
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
    # shards search on the CPU unless they reserve GPUs (FAISS saw every GPU, unreserved)
    assert plan["shards"].num_gpus == 0 and not any(args[-1] for args in plan["shards"].replicas)
    gpu_shards = pool_plan(config.model_copy(update={"retrieval": config.retrieval.model_copy(
        update={"num_gpus_per_shard": 0.5})}), {"retriever"})["shards"]
    assert gpu_shards.num_gpus == 0.5 and all(args[-1] is True for args in gpu_shards.replicas)
    # generator 1 + embedder 0.5 + 2 shards x 0.25 + cross-encoder 0.5 + know 0.5
    assert cpus_requested(plan) == 3.0
    assert cpus_requested(pool_plan(config, {"generator"})) == 1.0
    # a model pool that reserves no GPU runs on the CPU (Ray does not hide the GPUs from it); one that
    # reserves a GPU lets the actor take it; an explicit device is kept
    devices = {name: plan[name].replicas[0][-1] for name in ("encoder", "ranker", "know")}
    assert devices == {"encoder": "cpu", "ranker": "cpu", "know": "cpu"}
    on_gpu = AnswerConfig.model_validate({**config.model_dump(), "embedder": {"num_gpus": 0.25},
                                          "reranker": {"model": "m_rel", "device": "cuda:1"}})
    plan = pool_plan(on_gpu, {"generator", "retriever", "ranker"})
    assert (plan["encoder"].replicas[0][-1], plan["ranker"].replicas[0][-1]) == (None, "cuda:1")
    # without a reranker.model the ranker is the embedder pool: nothing more
    bare = AnswerConfig.model_validate({"index": {"path": str(tmp_path)}, "embedder": {"model": "e"}})
    assert list(pool_plan(bare, {"ranker"})) == ["encoder"]
    assert cpus_requested(pool_plan(bare, {"ranker"})) == 0.5
    # engine actors are asked for too (the last one waited forever on a Ray sized for the pools alone)
    split = AnswerConfig.model_validate({**bare.model_dump(), "engine": {"actors": 2, "actor_cpus": 1.5,
                                                                        "actor_resources": {"engine_node": 1}}})
    assert ray_request(split, pool_plan(split, {"ranker"})) == (3.5, {"engine_node": 2.0}, ())
    assert ray_request(bare, pool_plan(bare, {"ranker"})) == (0.5, {}, ())
    # GPUs are asked for too, so that a Ray without them is told of (they waited in silence)
    assert ray_request(on_gpu, pool_plan(on_gpu, {"generator", "retriever"}))[2] == (0.25,)


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
            with pytest.raises(UserError, match="768-d vectors but its embedder .* makes 384-d ones"):
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


def test_a_replica_over_several_devices_gets_a_placement_group_with_a_bundle_per_vllm_worker(tmp_path):
    import pytest

    from actors.generator import engine_arguments
    from jobs.pools import llm_settings, resources_requested

    for name in ("config.json", "model.safetensors"):  # a model folder as vLLM reads one (jobs/models.py)
        (tmp_path / name).write_text("{}")

    def config(**generator):
        return AnswerConfig.model_validate({"generator": {"model": str(tmp_path), **generator}})

    one = pool_plan(config(), {"generator"})["generator"]
    assert one.placement_group is None and engine_arguments(llm_settings(config().generator))[
        "distributed_executor_backend"] == "uni"
    c = config(tensor_parallel_size=2, pipeline_parallel_size=2, replicas=2, resources={"gpu_node": 1},
               placement_group={"strategy": "STRICT_PACK"})
    pool = pool_plan(c, {"generator"})["generator"]
    # 4 workers a replica; the replica's own custom resource goes on the bundle its actor runs in
    assert pool.placement_group == {"bundles": [{"GPU": 1, "CPU": 1, "gpu_node": 1}] + [{"GPU": 1, "CPU": 1}] * 3,
                                    "strategy": "STRICT_PACK"}
    assert cpus_requested({"generator": pool}) == 8 and resources_requested({"generator": pool}) == {"gpu_node": 2}
    assert gpu_demands({"generator": pool}) == (1,) * 8  # a device a worker: Ray places bundles one by one
    args = engine_arguments(llm_settings(c.generator))
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"], args["distributed_executor_backend"]) == (2, 2, "ray")
    from vllm.engine.arg_utils import EngineArgs
    EngineArgs(**args)  # the names are the pinned vLLM's own
    # GPUs held twice (by the actor and by the bundles) would never be placed: refused, naming the field
    with pytest.raises(ValueError, match="num_gpus: with tensor_parallel_size x pipeline_parallel_size = 2"):
        config(tensor_parallel_size=2, num_gpus=2)
    # a multi-device replica's actor reserves no GPU: where it runs (the dtype `auto`, eager mode) is the
    # driver's word, by its bundles, not its own process's torch (it resolved float32 from CPU flags)
    assert (args["dtype"], args["enforce_eager"]) == ("auto", False)
    assert (engine_arguments(llm_settings(config().generator))["enforce_eager"],
            engine_arguments(llm_settings(config(num_gpus=1, enforce_eager=True).generator))["enforce_eager"]) == (True, True)
    # Ray refuses 1.5 GPUs when it creates the actor, after the pools before it loaded their models: at load here
    with pytest.raises(ValueError, match=r"generator.num_gpus\n.*1.5 GPUs: a fraction shares one device; more than one "
                                         "must be a whole number"):
        config(num_gpus=1.5)
    assert config(num_gpus=2).generator.num_gpus == 2
    with pytest.raises(ValueError, match="retrieval.num_gpus_per_shard"):
        AnswerConfig.model_validate({"retrieval": {"num_gpus_per_shard": 2.5}})
    with pytest.raises(ValueError, match=r"a vLLM worker runs on one device: GPU 2 in a bundle"):
        config(tensor_parallel_size=2, placement_group={"bundle_per_worker": {"GPU": 2}})


def test_a_replica_that_reserved_no_gpu_refuses_a_gpu_build_of_vllm_and_a_fractional_bundle_is_vllms_to_know(
        tmp_path, monkeypatch):
    """With the `.[gpu]` install, a pool left at num_gpus 0 started vLLM on GPU 0 unreserved (Ray 2.60 hides no GPU
    from such an actor); vLLM's Ray workers each asked for a whole GPU inside a {GPU: 0.5} bundle: never placed."""
    import vllm.platforms

    from actors.generator import configure
    from jobs.pools import llm_settings

    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
    settings = lambda **llm: llm_settings(AnswerConfig.model_validate({"generator": {"model": str(tmp_path), **llm}}).generator)  # noqa: E731
    monkeypatch.setenv("VLLM_RAY_PER_WORKER_GPUS", "1")  # set here so that the test's value is undone after it
    configure(settings())  # the CPU build: runs on CPUs
    monkeypatch.setattr(vllm.platforms, "current_platform", type("Cuda", (), {"is_cuda_alike": lambda self: True})(),
                        raising=False)
    configure(settings())  # in-process (a benchmark's generator, no Ray actor): the machine's GPUs are its own
    monkeypatch.setattr("actors.generator._in_ray_actor", lambda: True)
    with pytest.raises(RuntimeError, match=r"reserved no GPU \(its pool's num_gpus is 0\) and this vLLM is a GPU build"):
        configure(settings())
    configure(settings(num_gpus=1))
    configure(settings(tensor_parallel_size=2, placement_group={"bundle_per_worker": {"GPU": 0.5, "CPU": 1}}))
    assert os.environ["VLLM_RAY_PER_WORKER_GPUS"] == "0.5"


def test_shards_on_gpus_are_refused_before_anything_starts_where_faiss_has_no_gpu_version(tmp_path):
    """An HNSW shard with retrieval.num_gpus_per_shard > 0: each shard actor failed its start, was restarted
    to fail again, and then the run failed."""
    from jobs.pools import gpu_searchable

    assert [gpu_searchable(f) for f in ("Flat", "IVF100,Flat", "IVF100,PQ8x8", "IVF100,PQ8x10", "HNSW32,Flat")] == [
        True, True, True, False, False]
    # GPU IVF-PQ kernels: 1-96 sub-quantizers of a listed width (768-d at pq_m 16 is 48 dims each: none)
    assert [gpu_searchable("IVF100,PQ16x8", 384), gpu_searchable("IVF100,PQ16x8", 768), gpu_searchable("IVF1,PQ5x8")] == [
        True, False, False]
    (tmp_path / "manifest.json").write_text(json.dumps({"embedder": "all-minilm-l6-v2", "dims": 384, "shards": [
        {"dir": "s0", "factory": "HNSW32,Flat"}, {"dir": "s1", "factory": "HNSW32,Flat"}]}))
    config = AnswerConfig.model_validate({"index": {"path": str(tmp_path)}, "retrieval": {"num_gpus_per_shard": 1}})
    with pytest.raises(UserError, match=r"FAISS has no GPU version of HNSW32,Flat \(GPU search takes Flat and IVF"):
        pool_plan(config, {"retriever"})
    assert pool_plan(config.model_copy(update={"retrieval": config.retrieval.model_copy(
        update={"num_gpus_per_shard": 0})}), {"retriever"})["shards"].num_gpus == 0


class _Probe:
    """Stands in for a generator replica: where it runs, and where a task it starts (as vLLM's Ray
    executor starts its workers) runs."""

    def where(self):
        import ray

        @ray.remote(num_cpus=0.5)
        def worker():
            return ray.util.get_current_placement_group().id.hex()

        group = ray.util.get_current_placement_group()
        return group.id.hex(), len(group.bundle_specs), ray.get(worker.remote())

    def die(self):
        import os
        os._exit(1)


def test_a_multi_device_replica_and_the_workers_it_starts_run_in_its_own_placement_group_also_after_a_restart(ray_session):
    from types import SimpleNamespace

    from engine.replicas import Pool, start_replicas
    from jobs.api import Session, ray_connection

    ray = ray_session
    pool = Pool(_Probe, 1, 0, ((),) * 2, {}, {"bundles": [{"CPU": 0.5}, {"CPU": 0.5}], "strategy": "PACK"})
    # as build_stages starts them (two options() calls raised AttributeError: no run over several devices started)
    replicas, made = start_replicas(pool, max_restarts=1)
    groups = [ray.get(r.where.remote(), timeout=120) for r in replicas]
    assert all(n == 2 and worker == group for group, n, worker in groups)  # the worker task joined the group
    assert groups[0][0] != groups[1][0]  # one group per replica
    try:
        ray.get(replicas[0].die.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        pass
    import time
    deadline = time.monotonic() + 120
    while True:  # calls fail while the actor restarts
        try:
            again = ray.get(replicas[0].where.remote(), timeout=120)
            break
        except ray.exceptions.ActorUnavailableError:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    assert again[0] == groups[0][0]  # restarted on its own devices
    assert len(made) == 2
    # closing a Session on a Ray it did not start gives back what the groups reserve (they were left holding it)
    session = Session()
    session.stages, session.ray = {"generator": SimpleNamespace(replicas=replicas, placement_groups=made)}, ray_connection()
    session.close()
    deadline = time.monotonic() + 60  # Ray frees a removed group's bundles in the background
    while ray.available_resources().get("CPU") != ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_a_jobs_end_shuts_each_ready_llm_engine_down_once_and_kills_a_replica_still_starting(ray_session):
    """A replica still loading would take the shutdown call only once its model had loaded (the job waited for
    it); an endpoint's replica has no engine; a judge pool on the generator's replicas is one pool."""
    from types import SimpleNamespace

    from jobs.pools import stop_llm_engines

    ray = ray_session

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self):
            self.shutdowns = 0

        def shutdown(self):
            self.shutdowns += 1

        def count(self):
            return self.shutdowns

    @ray.remote(num_cpus=0)
    class Endpoint:
        def ping(self):
            return "up"

    ready, starting, endpoint = Engine.remote(), Engine.remote(), Endpoint.remote()
    ray.get([ready.count.remote(), starting.count.remote(), endpoint.ping.remote()])
    stages = {"generator": SimpleNamespace(replicas=[ready, starting, endpoint], restarting={1}, retired=set()),
              "judge": SimpleNamespace(replicas=[ready, starting], restarting={1}, retired=set())}
    stop_llm_engines(stages, wait_s=30)
    assert ray.get(ready.count.remote()) == 1 and ray.get(endpoint.ping.remote()) == "up"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(starting.count.remote(), timeout=30)


def test_engines_are_stopped_however_the_block_ends_and_stopping_them_never_fails_work_done(monkeypatch):
    """answer, sweep and calibrate share this: a stop that raised after a sweep's runs were committed failed
    the sweep (answer alone swallowed it), and a failed block stops its engines within 15 s."""
    import jobs.pools
    from jobs.pools import llm_engines_stopped

    waits = []

    def stop(stages, wait_s):
        waits.append(wait_s)
        raise RuntimeError("a replica died while stopping")

    monkeypatch.setattr(jobs.pools, "stop_llm_engines", stop)
    with llm_engines_stopped({}):
        pass
    with pytest.raises(KeyboardInterrupt), llm_engines_stopped({}):
        raise KeyboardInterrupt
    assert waits == [60.0, 15.0]


def test_a_generator_pool_served_by_an_endpoint_reserves_no_gpu():
    """Its replicas are HTTP clients: a layered config's num_gpus held GPUs for them (on a CPU machine the
    run was refused)."""
    config = AnswerConfig(generator={"model": "served", "num_gpus": 1, "endpoint": {"base_url": "http://127.0.0.1:9/v1"}},
                          judge={"model": "smollm2-135m-instruct", "num_gpus": 0.5})
    plan = pool_plan(config, {"generator", "judge"})
    assert plan["generator"].num_gpus == 0 and gpu_demands(plan) == (0.5,)


def test_an_index_built_before_passages_were_encoded_as_documents_is_refused_for_an_embedder_with_roles(tmp_path):
    """An embedder whose config names query / document prompts now encodes each in its role: queries against
    passages encoded without theirs would not match, so such an index is rebuilt (MiniLM's are not touched)."""
    import shutil

    from jobs.index import IndexJobConfig, _build_key
    from jobs.models import encoder_roles, resolve

    prompted = tmp_path / "prompted"
    shutil.copytree(resolve("all-minilm-l6-v2"), prompted)
    settings = prompted / "config_sentence_transformers.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "prompts": {"query": "query: "}}))
    assert encoder_roles(str(prompted)) and not encoder_roles(resolve("all-minilm-l6-v2"))
    index = tmp_path / "index"
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps({"format": 1, "embedder": str(prompted), "dims": 384, "shards": []}))
    with pytest.raises(UserError, match="built before passages were encoded as documents.*rebuild it"):
        pool_plan(AnswerConfig(index={"path": str(index)}), {"retriever"})
    # and its shards are built again: their key says how its passages were encoded
    config = IndexJobConfig(corpus="c.parquet", index={"path": str(index)}, embedder={"model": str(prompted)})
    assert _build_key(config, 3, [0, 3], "ab", roles=True) != _build_key(config, 3, [0, 3], "ab")
