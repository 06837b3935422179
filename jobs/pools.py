"""The actor pools of a run, built from its config: one stage per pool the strategies ask for.

``pool_plan`` says which pools a run needs (actor class, what each replica asks Ray for, its
constructor arguments); a local Ray is sized from that plan and the stages are built from it, so
adding a pool is one entry. Model names are resolved here (the actors load the paths they are
given); what each pool really runs (a cross-encoder or the cosine fallback, which judges) is named
for the run metadata.
"""

from __future__ import annotations

import re
from contextlib import contextmanager, suppress
from pathlib import Path

from actors.encoder import Encoder
from actors.endpoint_generator import EndpointGenerator
from actors.generator import Generator
from actors.judge_folders import check_nli_folder
from actors.know import KnowClassifier, embedder_of
from actors.nli import NLICrossEncoder
from actors.reranker import ranker_class
from actors.retriever import ShardRetriever
from actors.streaming_generator import StreamingGenerator
from engine.replicas import Pool, start_replicas
from engine.stages import (
    GeneratorStage,
    KnowStage,
    NLIStage,
    RankerStage,
    RetrieverStage,
    StreamingGeneratorStage,
)
from jobs.index import MANIFEST, read_manifest
from jobs.models import embedding_dims, encoder_roles, llm_folder, loadable
from schemas.config import device_of
from schemas.errors import UserError
from strategies.registry import AnswerConfig, retrieval_methods


def pool_plan(config: AnswerConfig, needs: set[str]) -> dict[str, Pool]:
    """The pools for the stages in ``needs``: generator, judge, encoder (query vectors, and the ranker
    when no cross-encoder is configured), shards (FAISS + BM25, one actor each), ranker, know, nli."""
    plan = {}

    def llm(c) -> Pool:
        actor = EndpointGenerator if c.endpoint else StreamingGenerator if c.serving == "async" else Generator
        group = None
        if c.world_size > 1 and not c.endpoint:
            # the bundles hold the devices of vLLM's workers; the replica's own custom resources go on the
            # first bundle, where its actor runs, so `resources` still places it (as Ray Data LLM's
            # placement_group_config does, with GPUs only in the bundles)
            bundles = [dict(c.placement_group.bundle_per_worker) for _ in range(c.world_size)]
            bundles[0] = {**bundles[0], **{k: bundles[0].get(k, 0) + v for k, v in c.resources.items()}}
            group = {"bundles": bundles, "strategy": c.placement_group.strategy}
        # an endpoint's replica is an HTTP client: the GPUs are its server's (a layered config's num_gpus held
        # devices the judge pool or the shards then lacked, and on a CPU machine the run was refused)
        gpus = 0 if c.endpoint else c.num_gpus
        return Pool(actor, c.num_cpus, gpus, ((llm_settings(c), config.sampling.model_dump()),) * c.replicas,
                    c.resources, group)

    if needs & {"generator", "judge"}:
        plan["generator"] = llm(config.generator)
    if "judge" in needs and config.judge is not None:  # else the engine routes judge -> generator
        plan["judge"] = llm(config.judge)
    if needs & {"retriever", "ranker"}:
        e = config.embedder
        manifest = read_manifest(config.index.path) if "retriever" in needs else None
        # the query encoder must be the model the index was built with; the ranker may share the pool
        model = loadable(manifest["embedder"] if manifest else e.model)
        if manifest and encoder_roles(model) and not manifest.get("encoder_roles"):
            raise UserError(f"the index at {config.index.path} was built before passages were encoded as documents, "
                            f"and its embedder {manifest['embedder']!r} encodes queries and documents each its own way "
                            "(a prompt or a route for each): its queries would not match its passages; rebuild it with "
                            "`ragsift index`")
        if manifest and manifest.get("dims") and embedding_dims(model) not in (None, manifest["dims"]):
            raise UserError(f"the index at {config.index.path} holds {manifest['dims']}-d vectors but its "
                            f"embedder {manifest['embedder']!r} makes {embedding_dims(model)}-d ones: rebuild it "
                            "with `ragsift index`")
        plan["encoder"] = Pool(Encoder, e.num_cpus, e.num_gpus, ((model, e.batch_size, device_of(e)),) * e.replicas,
                               e.resources)
        if manifest:
            plan["shards"] = _shards(config, manifest)
        rr = config.reranker
        if "ranker" in needs and rr.model:
            plan["ranker"] = Pool(ranker_class(loadable(rr.model)), rr.num_cpus, rr.num_gpus,
                                  ((loadable(rr.model), rr.batch_size, rr.max_length, device_of(rr)),) * rr.replicas,
                                  rr.resources)
    if "know" in needs:
        k = config.know
        path = loadable(k.model)
        plan["know"] = Pool(KnowClassifier, k.num_cpus, k.num_gpus,
                            ((path, loadable(embedder_of(path)), k.batch_size, device_of(k)),) * k.replicas, k.resources)
    if "nli" in needs:
        n = config.nli
        check_nli_folder(loadable(n.model))
        plan["nli"] = Pool(NLICrossEncoder, n.num_cpus, n.num_gpus,
                           ((loadable(n.model), n.batch_size, n.max_length, device_of(n)),) * n.replicas, n.resources)
    return plan


def encoder_model(config: AnswerConfig) -> str:
    """The encoder pool's model, which the ranker stage's cosine fallback runs on: the index's embedder where
    the run has an index (its queries are encoded as its passages were), else ``embedder.model``."""
    index = config.index.path
    return read_manifest(index)["embedder"] if index and (Path(index) / MANIFEST).exists() else config.embedder.model


def llm_settings(c) -> dict:
    """A generator replica's settings (``actors.generator.Generator``'s first argument) from an LLM config;
    an endpoint's model is the name its server knows, not a path here."""
    if c.endpoint:
        return {**c.model_dump(), "model": c.model}
    # where it runs is the driver's word, by what the replica reserves: a multi-device replica's actor holds
    # no GPU of its own, and its process would resolve the dtype (and eager mode) from the CPU
    return {**c.model_dump(), "model": llm_folder(loadable(c.model), c.engine_kwargs.get("load_format", "auto")),
            "on_gpu": c.on_gpu, "enforce_eager": not c.on_gpu if c.enforce_eager is None else c.enforce_eager}


def _bm25(config: AnswerConfig) -> bool:
    """Whether this run retrieves with BM25 (then every shard actor loads its BM25 index)."""
    return bool(retrieval_methods(config) - {"dense"})


def _shards(config: AnswerConfig, manifest: dict) -> Pool:
    """One actor per shard: its FAISS index, and its BM25 index when this run retrieves with BM25."""
    bm25 = _bm25(config)
    if bm25 and not manifest.get("bm25"):
        raise UserError(f"{config.index.path}: this run uses BM25 retrieval ({', '.join(sorted(retrieval_methods(config)))}) "
                        "but the index has no BM25 shards; rebuild it with `ragsift index` (index.bm25=true)")
    if config.retrieval.num_gpus_per_shard > 0:
        # each shard actor would fail its start, and be restarted to fail again, before the run failed
        cpu_only = sorted({f for f in (s.get("factory", "Flat") for s in manifest["shards"])
                           if not gpu_searchable(f, manifest.get("dims"))})
        if cpu_only:
            raise UserError(f"retrieval.num_gpus_per_shard > 0, but FAISS has no GPU version of {', '.join(cpu_only)} "
                            "(GPU search takes Flat and IVF shards, IVF-PQ at 8 bits a code with 1-96 sub-quantizers of at "
                            "most 32 dims): set it to 0, or index with another index.index_type")
    return Pool(ShardRetriever, config.retrieval.num_cpus_per_shard, config.retrieval.num_gpus_per_shard,
                tuple((str(Path(config.index.path) / s["dir"]), config.index.nprobe, config.index.hnsw_ef_search, bm25,
                       s.get("passages_sha256"), manifest.get("embedder"), config.retrieval.num_gpus_per_shard > 0)
                      for s in manifest["shards"]), config.retrieval.shard_resources)


# FAISS GpuIndexIVFPQ (without precomputed tables, its cloner's default): sub-quantizers, and dims per one
GPU_PQ_SUBQUANTIZERS = {1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96}
GPU_PQ_DIMS_PER_SUBQUANTIZER = {1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32}


def gpu_searchable(factory: str, dims: int | None = None) -> bool:
    """Whether FAISS's GPU cloner takes a shard of this index_factory string: Flat and IVF; IVF-PQ only at 8 bits
    a code, with a sub-quantizer count and dims per sub-quantizer its GPU kernels have; HNSW has no GPU version."""
    if factory.startswith("HNSW"):
        return False
    pq = re.search(r"PQ(\d+)x(\d+)", factory)
    if pq is None:
        return True
    m, bits = int(pq.group(1)), int(pq.group(2))
    return bits == 8 and m in GPU_PQ_SUBQUANTIZERS and (dims is None or dims // m in GPU_PQ_DIMS_PER_SUBQUANTIZER)


def cpus_requested(plan: dict[str, Pool]) -> float:
    """The logical CPUs ``plan`` asks Ray for, so a local Ray can be sized to place every pool (an
    actor Ray cannot place waits forever, and the run with it)."""
    return sum(pool.cpus for pool in plan.values())


def gpu_demands(plan: dict[str, Pool]) -> tuple[float, ...]:
    """What ``plan`` asks of each GPU, reservation by reservation (a replica's num_gpus, or each bundle of its
    placement group): Ray places each on devices of its own (engine/gpu_packing.py), so their sum says too
    little."""
    demands: list[float] = []
    for pool in plan.values():
        for _ in pool.replicas:
            if pool.placement_group:
                demands += [bundle.get("GPU", 0.0) for bundle in pool.placement_group["bundles"]]
            else:
                demands.append(pool.num_gpus)
    return tuple(d for d in demands if d > 0)


def resources_requested(plan: dict[str, Pool]) -> dict[str, float]:
    """The custom resources ``plan`` asks Ray for, summed over every replica: what a local Ray is given."""
    total: dict[str, float] = {}
    for pool in plan.values():
        for name, amount in pool.per_replica.items():
            if name not in ("CPU", "GPU") and amount:
                total[name] = total.get(name, 0.0) + amount * len(pool.replicas)
    return total


def ray_request(config: AnswerConfig, plan: dict[str, Pool]) -> tuple[float, dict[str, float], tuple[float, ...]]:
    """The CPUs, custom resources and GPUs a run asks Ray for, to size a local Ray or to say what a
    cluster lacks: its pools', and with engine.actors > 1 its engine actors' (left out, the last engine
    actor waited forever for a place)."""
    cpus, resources = cpus_requested(plan), resources_requested(plan)
    if config.engine.actors > 1:
        cpus += config.engine.actor_cpus * config.engine.actors
        for name, amount in config.engine.actor_resources.items():
            resources[name] = resources.get(name, 0.0) + amount * config.engine.actors
    return cpus, resources, gpu_demands(plan)


def build_stages(config: AnswerConfig, needs: set[str], plan: dict[str, Pool] | None = None,
                 running: dict[str, list] | None = None) -> dict:
    """Start the actors of ``plan`` (default: ``pool_plan(config, needs)``) and wrap them in stages;
    ``running``: pools already started, by name (a Session's encoders), used instead of starting them."""

    plan = pool_plan(config, needs) if plan is None else plan
    actors, groups = dict(running or {}), {}
    for name, pool in plan.items():
        if name not in actors:
            actors[name], groups[name] = start_replicas(pool, config.engine.replica_max_restarts)
    stages = {}
    for name in ("generator", "judge"):
        if name in actors:
            stages[name] = llm_stage(actors[name], plan[name], getattr(config.engine, name), name, config.sampling.max_tokens)
            stages[name].placement_groups = groups[name]  # removed by whoever ends the pool on a Ray that outlives it
    if "shards" in actors:
        stages["retriever"] = RetrieverStage(actors["encoder"], actors["shards"], config.engine.retriever,
                                             _bm25(config), config.retrieval)
    if "ranker" in needs:
        stages["ranker"] = RankerStage(actors.get("ranker", actors["encoder"]), config.engine.ranker)
    if "know" in actors:
        stages["know"] = KnowStage(actors["know"], config.engine.know)
    if "nli" in actors:
        stages["nli"] = NLIStage(actors["nli"], config.engine.nli)
    return stages


def stop_llm_engines(stages: dict, wait_s: float = 60.0) -> None:
    """Shut the vLLM engine of each LLM replica down and wait for it (at most ``wait_s``). Left to Ray's
    shutdown at exit, each replica was killed and its engine core process, orphaned, went its own way up
    to half a minute later under load, still holding its memory while the next job loaded a model. A
    replica still starting or restarting would take the call only once its model had loaded: it is killed."""
    import ray

    ready, starting = {}, {}
    for name in ("generator", "judge"):  # the judge pool may be the generator's own replicas
        stage = stages.get(name)
        for i, replica in enumerate(stage.replicas if stage else []):
            if hasattr(replica, "shutdown"):  # an endpoint's pool has no engine of its own
                down = i in getattr(stage, "restarting", ()) or i in getattr(stage, "retired", ())
                (starting if down else ready)[id(replica)] = replica
    for replica in starting.values():
        if id(replica) not in ready:
            ray.kill(replica, no_restart=True)
    refs = [replica.shutdown.remote() for replica in ready.values()]
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s) if refs else ([], [])
    for ref in done:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001 - a replica that died meanwhile has no engine left to stop
            pass


@contextmanager
def llm_engines_stopped(stages: dict):
    """Stop the LLM engines of ``stages`` when the block ends, however it ends: after an error, Ctrl-C or
    SIGTERM too, if briefly (the user waits for the prompt back). Stopping never raises: not over the
    block's error, and not after work the block has done (committed answers do not fail for it)."""
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        with suppress(Exception):
            stop_llm_engines(stages, wait_s=STOP_AFTER_FAILURE_S if failed else 60.0)


STOP_AFTER_FAILURE_S = 15.0


def llm_stage(replicas: list, pool: Pool, batching, name: str, max_tokens: int) -> GeneratorStage:
    """The stage for a pool of generator replicas of either kind."""
    if pool.actor in (StreamingGenerator, EndpointGenerator):
        return StreamingGeneratorStage(replicas, batching, name, default_max_tokens=max_tokens)
    return GeneratorStage(replicas, batching, name)
