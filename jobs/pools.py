"""The actor pools of a run, built from its config: one stage per pool the strategies ask for.

Model names are resolved here (the actors load the paths they are given); what each pool really
runs (a cross-encoder or the cosine fallback, which judges) is named for the run metadata.
"""

from __future__ import annotations

from pathlib import Path

from engine.stages import (
    GeneratorStage,
    KnowStage,
    NLIStage,
    RankerStage,
    RetrieverStage,
)
from jobs.index import read_manifest
from jobs.models import resolve
from strategies.registry import AnswerConfig, retrieval_methods


def build_stages(config: AnswerConfig, needs: set[str]) -> dict:
    import ray

    from actors.encoder import Encoder
    from actors.generator import Generator
    from actors.nli import NLICrossEncoder
    from actors.reranker import CrossEncoderRanker

    # a dead replica is restarted by Ray; the engine (not Ray) retries its batches, to isolate bad requests
    restarts = {"max_restarts": config.engine.replica_max_restarts, "max_task_retries": 0}

    def llm_pool(name: str, llm) -> GeneratorStage:
        actor = ray.remote(Generator).options(num_cpus=llm.num_cpus, num_gpus=llm.num_gpus, **restarts)
        settings = {**llm.model_dump(), "model": resolve(llm.model)}
        replicas = [actor.remote(settings, config.sampling.model_dump()) for _ in range(llm.replicas)]
        return GeneratorStage(replicas, getattr(config.engine, name), name)

    stages = {}
    if needs & {"generator", "judge"}:
        stages["generator"] = llm_pool("generator", config.generator)
    if "judge" in needs and config.judge is not None:  # else the engine routes judge -> generator
        stages["judge"] = llm_pool("judge", config.judge)
    if needs & {"retriever", "ranker"}:
        e = config.embedder
        manifest = read_manifest(config.index.path) if "retriever" in needs else None
        # the query encoder must be the model the index was built with; the ranker may share the pool
        encoder = ray.remote(Encoder).options(num_cpus=e.num_cpus, num_gpus=e.num_gpus, **restarts)
        model = manifest["embedder"] if manifest else e.model
        encoders = [encoder.remote(resolve(model), e.batch_size, e.device) for _ in range(e.replicas)]
        if manifest:
            shards, bm25 = _shard_actors(config, manifest, restarts)
            stages["retriever"] = RetrieverStage(encoders, shards, config.engine.retriever, bm25, config.retrieval)
        if "ranker" in needs:
            rr = config.reranker
            if rr.model:
                actor = ray.remote(CrossEncoderRanker).options(num_cpus=rr.num_cpus, num_gpus=rr.num_gpus, **restarts)
                rankers = [actor.remote(resolve(rr.model), rr.batch_size, rr.max_length, rr.device)
                           for _ in range(rr.replicas)]
            else:
                rankers = encoders
            stages["ranker"] = RankerStage(rankers, config.engine.ranker)
    if "know" in needs:
        from actors.know import KnowClassifier, embedder_of

        k = config.know
        actor = ray.remote(KnowClassifier).options(num_cpus=k.num_cpus, num_gpus=k.num_gpus, **restarts)
        path = resolve(k.model)
        embedder = resolve(embedder_of(path))
        stages["know"] = KnowStage([actor.remote(path, embedder, k.batch_size, k.device) for _ in range(k.replicas)],
                                   config.engine.know)
    if "nli" in needs:
        n = config.nli
        actor = ray.remote(NLICrossEncoder).options(num_cpus=n.num_cpus, num_gpus=n.num_gpus, **restarts)
        stages["nli"] = NLIStage([actor.remote(resolve(n.model), n.batch_size, n.max_length, n.device)
                                  for _ in range(n.replicas)], config.engine.nli)
    return stages


def _shard_actors(config: AnswerConfig, manifest: dict, restarts: dict) -> tuple[list, bool]:
    """One actor per shard: its FAISS index, and its BM25 index when this run retrieves with BM25."""
    import ray

    from actors.retriever import ShardRetriever

    bm25 = bool(retrieval_methods(config) - {"dense"})
    if bm25 and not manifest.get("bm25"):
        raise ValueError(f"{config.index.path}: this run uses BM25 retrieval ({', '.join(sorted(retrieval_methods(config)))}) "
                         "but the index has no BM25 shards; rebuild it with `ragsift index` (index.bm25=true)")
    actor = ray.remote(ShardRetriever).options(num_cpus=config.retrieval.num_cpus_per_shard, **restarts)
    return [actor.remote(str(Path(config.index.path) / s["dir"]), config.index.nprobe, config.index.hnsw_ef_search, bm25)
            for s in manifest["shards"]], bm25


def cpus_requested(config: AnswerConfig, needs: set[str]) -> float:
    """The logical CPUs the pools of ``build_stages`` ask Ray for, so a local Ray can be sized to place them all
    (an actor Ray cannot place waits forever, and the run with it)."""
    total = 0.0
    if needs & {"generator", "judge"}:
        total += config.generator.num_cpus * config.generator.replicas
    if "judge" in needs and config.judge is not None:
        total += config.judge.num_cpus * config.judge.replicas
    if needs & {"retriever", "ranker"}:
        total += config.embedder.num_cpus * config.embedder.replicas
        if "retriever" in needs:
            total += config.retrieval.num_cpus_per_shard * len(read_manifest(config.index.path)["shards"])
        if "ranker" in needs and config.reranker.model:
            total += config.reranker.num_cpus * config.reranker.replicas
    if "know" in needs:
        total += config.know.num_cpus * config.know.replicas
    if "nli" in needs:
        total += config.nli.num_cpus * config.nli.replicas
    return total


def entailment_name(config: AnswerConfig) -> str | None:
    """What verifies MIGRES's extracted statements, for the run metadata."""
    if "migres" not in config.strategies:
        return None
    return f"nli-cross-encoder:{config.nli.model}" if config.nli.model else "judge: P('yes') to an entailment prompt"


def judges_name(config: AnswerConfig) -> dict | None:
    """Which models judged RA-ISF's self-knowledge and passage relevance, for the run metadata."""
    if not {"raisf", "calibration_probe"} & set(config.strategies):
        return None
    if config.raisf.judges == "trained":
        return {"self_knowledge": f"trained classifier:{config.know.model}",
                "relevance": f"trained cross-encoder:{config.reranker.model}"}
    judge = (config.judge or config.generator).model
    return {"self_knowledge": f"P('yes') of {judge}", "relevance": f"P('yes') of {judge}"}


def ranker_name(config: AnswerConfig) -> str:
    """What the ranker stage really is, for the run metadata (never a silent stand-in)."""
    if config.reranker.model:
        return f"cross-encoder:{config.reranker.model}"
    return f"bi-encoder-cosine:{config.embedder.model} (fallback: no reranker.model configured)"
