"""What the disk request cache's namespaces hold, without a model: each thing that changes a pool's
responses changes its namespace (the real stack's rerun is tests/jobs/test_request_cache.py)."""

import json
import time

import pytest

from jobs import request_cache
from strategies.registry import AnswerConfig


@pytest.fixture
def indexes(monkeypatch, tmp_path):
    """Index folders whose manifests name different embedders, and one of each kind of shard (no shard files:
    the manifest is all the namespaces read)."""
    manifests = {str(tmp_path / "a"): ("emb-a", "Flat"), str(tmp_path / "b"): ("emb-b", "Flat"),
                 str(tmp_path / "ivf"): ("emb-a", "IVF64,Flat"), str(tmp_path / "hnsw"): ("emb-a", "HNSW32,Flat"),
                 str(tmp_path / "old"): ("emb-a", None)}
    monkeypatch.setattr(request_cache, "manifest_sha256", lambda path: f"sha-{path}" if path in manifests else None)
    monkeypatch.setattr(request_cache, "read_manifest", lambda path: {
        "embedder": manifests[path][0],
        "shards": [{"dir": "shard_00000", "factory": manifests[path][1]} if manifests[path][1] else {"dir": "shard_00000"}]})
    return tmp_path


def test_the_fallback_ranker_is_keyed_by_the_embedder_the_index_was_built_with(indexes):
    """The encoder pool loads the index's embedder: two indexes of other embedders shared one ranker key."""
    one = request_cache.namespaces(AnswerConfig(index={"path": str(indexes / "a")}, embedder={"model": "default"}))
    two = request_cache.namespaces(AnswerConfig(index={"path": str(indexes / "b")}, embedder={"model": "default"}))
    assert one["ranker"] != two["ranker"]


def test_a_self_knowledge_model_is_a_new_revision_when_its_embedder_is_retrained(tmp_path):
    embedder, know = tmp_path / "emb", tmp_path / "know"
    embedder.mkdir()
    know.mkdir()
    (embedder / "model.safetensors").write_bytes(b"weights")
    (know / "know.json").write_text(json.dumps({"embedder": str(embedder), "coef": [1.0], "intercept": 0.0}))
    before = request_cache.namespaces(AnswerConfig(know={"model": str(know)}))["know"]
    time.sleep(0.01)
    (embedder / "model.safetensors").write_bytes(b"retrained")
    assert request_cache.namespaces(AnswerConfig(know={"model": str(know)}))["know"] != before


def test_a_stages_new_cache_version_serves_none_of_its_older_entries_and_keeps_the_others(monkeypatch):
    before = request_cache.namespaces(AnswerConfig())
    monkeypatch.setattr(request_cache, "CACHE_VERSIONS", {"generator": 2})
    after = request_cache.namespaces(AnswerConfig())
    assert after["generator"] != before["generator"] and after["ranker"] == before["ranker"]


def test_answers_a_local_replica_computed_before_it_tokenized_special_token_strings_as_text_are_not_served(monkeypatch):
    """A passage holding "<|im_end|>" ended its turn before actors/chat_tokens.py; the disk cache served those
    answers to runs after the mend. A local model's namespaces name how messages are tokenized; an endpoint's,
    whose server tokenizes as before, do not."""
    now = request_cache.namespaces(AnswerConfig())
    monkeypatch.setattr(request_cache, "MESSAGES_AS_TEXT", "before")
    before = request_cache.namespaces(AnswerConfig())
    assert all(now[s] != before[s] for s in ("generator", "judge", "generator/Judge")) and now["ranker"] == before["ranker"]
    endpoint = AnswerConfig(generator={"model": "m", "endpoint": {"base_url": "http://127.0.0.1:1/v1"}})
    assert "messages" not in request_cache.llm_namespace(endpoint.generator, endpoint)


def test_a_tokenizer_or_template_named_in_engine_kwargs_is_keyed_by_its_files(tmp_path, monkeypatch):
    """A chat template edited in the tokenizer folder given as engine_kwargs.tokenizer: the rerun served the old
    template's answers from disk (keyed by the folder's name); a relative path was keyed by its letters."""
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "chat_template.jinja").write_text("{{ messages }}")
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages }}")

    def keys(**kwargs):
        return request_cache.namespaces(AnswerConfig(generator={"engine_kwargs": kwargs}))["generator"]

    before = keys(tokenizer=str(tokenizer), chat_template=str(template))
    assert keys(tokenizer=str(tokenizer), chat_template=str(template)) == before
    time.sleep(0.01)
    (tokenizer / "chat_template.jinja").write_text("Reply in French. {{ messages }}")
    edited = keys(tokenizer=str(tokenizer), chat_template=str(template))
    assert edited != before
    time.sleep(0.01)
    template.write_text("Reply in one word. {{ messages }}")
    assert keys(tokenizer=str(tokenizer), chat_template=str(template)) != edited
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    here = keys(tokenizer="tok")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert keys(tokenizer="tok") != here  # "tok" names no folder from here: another tokenizer (a hub name)
    assert keys(quantization="fp8") == keys(quantization="fp8")  # settings that are not paths as they are


def test_a_search_setting_keys_the_retriever_only_on_an_index_whose_shards_read_it(indexes):
    """nprobe on a Flat index (FAISS reads it only on IVF shards) recomputed every retrieval a cached run had."""
    def key(index, **settings):
        return request_cache.namespaces(AnswerConfig(index={"path": str(indexes / index), **settings}))["retriever"]

    assert key("a", nprobe=8) == key("a", nprobe=64) and key("a", hnsw_ef_search=16) == key("a", hnsw_ef_search=256)
    assert key("ivf", nprobe=8) != key("ivf", nprobe=64) and key("ivf", hnsw_ef_search=16) == key("ivf", hnsw_ef_search=256)
    assert key("hnsw", hnsw_ef_search=16) != key("hnsw", hnsw_ef_search=256) and key("hnsw", nprobe=8) == key("hnsw", nprobe=64)
    # a manifest that does not say what its shards are: both, as before
    assert key("old", nprobe=8) != key("old", nprobe=64) and key("old", hnsw_ef_search=16) != key("old", hnsw_ef_search=256)


def test_an_engine_argument_that_only_changes_speed_leaves_the_generators_namespace(tmp_path):
    """max_num_seqs set in engine_kwargs to fill a GPU recomputed every answer the disk cache held."""
    def key(**kwargs):
        return request_cache.namespaces(AnswerConfig(generator={"engine_kwargs": kwargs}))

    plain = key()
    for speed in ({"max_num_seqs": 64}, {"enable_prefix_caching": False}, {"max_num_batched_tokens": 8192, "block_size": 32}):
        assert key(**speed) == plain, speed
    assert key(max_num_seqs=64, quantization="fp8")["generator"] == key(quantization="fp8")["generator"] != plain["generator"]
    assert key(kv_cache_dtype="fp8")["generator"] != plain["generator"]
    # where the weights are is not a speed setting: a newer revision downloaded there answers otherwise
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    before = key(download_dir=str(downloads))["generator"]
    (downloads / "model.safetensors").write_bytes(b"another revision")
    assert key(download_dir=str(downloads))["generator"] != before


def test_another_sampling_seed_keys_its_llms_namespaces_and_no_other_stages():
    """At temperature > 0 another seed samples other answers: they are not served for the first seed's."""
    seeded = {seed: request_cache.namespaces(AnswerConfig(generator={"seed": seed})) for seed in (0, 7)}
    changed = {stage for stage in seeded[0] if seeded[0][stage] != seeded[7][stage]}
    assert changed == {"generator", "judge", "generator/Judge"}  # the judge is the generator's model unless set
    judged = {seed: request_cache.namespaces(AnswerConfig(judge={"seed": seed})) for seed in (0, 7)}
    assert {stage for stage in judged[0] if judged[0][stage] != judged[7][stage]} == {"judge"}
