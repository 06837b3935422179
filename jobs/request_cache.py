"""A run's request cache (engine/cache.py) and the namespace of each pool: everything besides the
request itself that decides what the pool answers, so a cached response is reused only where the pool
would compute the same one."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from actors.generator import resolve_dtype
from actors.know import WEIGHTS as KNOW_WEIGHTS
from actors.know import embedder_of
from engine.cache import RequestCache
from jobs.index import manifest_sha256, read_manifest
from jobs.models import encoder_roles, model_files, ragsift_home, resolve
from schemas.config import LLMConfig, RetrievalConfig, answer_engine_kwargs, speed_setting
from strategies.registry import AnswerConfig


def open_cache(config: AnswerConfig, disk: bool = True) -> RequestCache:
    """The request cache of runs on pools built from ``config``: memory only with ``disk=False`` (pools
    that are not ``config``'s, e.g. a test's stubs, must not write into it) or ``cache.enabled=False``."""
    memory_bytes = config.engine.cache_mb * 2**20
    if not (disk and config.cache.enabled):
        return RequestCache(config.engine.cache_size, memory_bytes=memory_bytes)
    path = config.cache.path or ragsift_home() / "cache" / "requests.sqlite"
    max_bytes = config.cache.max_mb * 2**20 if config.cache.max_mb is not None else None
    cache = RequestCache(config.engine.cache_size, path, namespaces(config), max_bytes, memory_bytes)
    if max_bytes is not None:
        cache.prune(max_bytes)
    return cache


# Per stage, bumped when ragsift changes how its pool computes a response for the same request and
# settings (an actor's output, a stage's merge or fusion), so entries of the older computation are not
# served; 1 adds nothing to the key (entries from before versions existed stay valid). retriever 2:
# hybrid retrieval takes k from each ranking when k > fusion_candidates (0d982af). judge and
# generator/Judge 2: a judgment's budget spells its whole choice, and a first token that begins several
# choices is shared among them (a label was cut, "AMBIGUO"; the mass went to the first choice listed).
# retriever 3: dense hits of equal score come in corpus order, whatever the search's depth or the shards.
CACHE_VERSIONS = {"retriever": 3, "judge": 2, "generator/Judge": 2}
# A local replica tokenizes a special token's string in a message as text (actors/chat_tokens.py); before, a
# passage holding "<|im_end|>" ended its turn. Only such prompts changed, but the key cannot tell them apart,
# so every local model's entries are computed anew; an endpoint's server tokenizes as before.
MESSAGES_AS_TEXT = "special-token strings as text"


def namespaces(config: AnswerConfig) -> dict[str, str]:
    """A digest per request stage of what decides its pool's responses."""
    generator = llm_namespace(config.generator, config)
    index = manifest_sha256(config.index.path) if config.index.path else None
    manifest = read_manifest(config.index.path) if index else None
    # the cosine fallback ranks with the encoder pool's model: the index's embedder where the run
    # retrieves (jobs/pools.py), not embedder.model
    encoder = manifest["embedder"] if manifest else config.embedder.model
    parts = {
        "generator": generator,
        # a judgment is greedy over its choices in every replica kind: sampling does not decide it
        "judge": llm_namespace(config.judge or config.generator, config, sampling=False),
        "ranker": {"model": revision(config.reranker.model), "max_length": config.reranker.max_length}
        if config.reranker.model else {"model": "cosine:" + revision(encoder),
                                       # its query and texts encoded each in its role since 15b5021
                                       **({"roles": True} if _roles(encoder) else {})},
        "nli": {"model": revision(config.nli.model), "max_length": config.nli.max_length},
        "know": {"model": revision(config.know.model), "embedder": know_embedder(config.know.model)},
    }
    if index:
        # a Retrieve names its own k; the rest of retrieval (its speed and placement settings aside) and
        # the index's search settings decide its passages
        retrieval = {key: value for key, value in config.retrieval.model_dump().items()
                     if key != "k" and not speed_setting(RetrievalConfig, key)}
        parts["retriever"] = {"index": index, "embedder": revision(manifest["embedder"]), "retrieval": retrieval,
                              **search_settings(config, manifest)}
    # a judgment on the generator (a yes / no or verdict answer) is greedy over its choices too
    parts["generator/Judge"] = llm_namespace(config.generator, config, sampling=False)
    return {stage: digest({**part, "cache_version": CACHE_VERSIONS[stage]} if CACHE_VERSIONS.get(stage, 1) > 1 else part)
            for stage, part in parts.items()}


def _roles(encoder: str) -> bool:
    try:
        return encoder_roles(resolve(encoder))
    except FileNotFoundError:  # an offline model not prepared here: its pools would say so
        return False


def search_settings(config: AnswerConfig, manifest: dict) -> dict:
    """The index's search settings its shards read (actors/retriever.py): nprobe only an IVF shard's, efSearch
    only an HNSW one's (a Flat index's hits are the same at every nprobe); both where a shard's kind is not
    recorded."""
    factories = [shard.get("factory") for shard in manifest["shards"]]
    unknown = not all(isinstance(f, str) for f in factories)
    return {**({"nprobe": config.index.nprobe} if unknown or any(f.startswith("IVF") for f in factories) else {}),
            **({"hnsw_ef_search": config.index.hnsw_ef_search}
               if unknown or any(f.startswith("HNSW") for f in factories) else {})}


def know_embedder(model: str | None) -> str | None:
    """The revision of the embedder a trained self-knowledge classifier's vectors come from: it lives
    outside the classifier's folder, and retrained in place it changes the classifier's answers."""
    path = Path(resolve(model)) if model else None
    return revision(embedder_of(str(path))) if path and (path / KNOW_WEIGHTS).is_file() else None


def llm_namespace(llm: LLMConfig, config: AnswerConfig, sampling: bool = True) -> dict:
    where = ({"endpoint": llm.endpoint.base_url, "vllm_extensions": llm.endpoint.vllm_extensions, "model": llm.model}
             if llm.endpoint else {"model": revision(llm.model, llm.engine_kwargs.get("revision")),
                                   "dtype": resolve_dtype(llm.dtype, gpu=llm.on_gpu),
                                   "engine_kwargs": by_content(answer_engine_kwargs(llm.engine_kwargs)),
                                   "messages": MESSAGES_AS_TEXT})
    return {**where, "max_model_len": llm.max_model_len, "seed": llm.seed,
            **({"sampling": config.sampling.model_dump()} if sampling else {})}


def by_content(value):
    """``engine_kwargs`` with each local path in it (a tokenizer, a chat template, an adapter) as its files'
    revision: those files decide the prompt and the answer, and keyed by their name a template edited in
    place served the answers of the old one."""
    if isinstance(value, dict):
        return {key: by_content(item) for key, item in value.items()}
    if isinstance(value, list):
        return [by_content(item) for item in value]
    if not (isinstance(value, str) and value and os.path.exists(path := os.path.expanduser(value))):
        return value
    if os.path.isdir(path):
        return revision(os.path.abspath(path))
    stat = os.stat(path)
    return f"{os.path.abspath(path)}@{digest([stat.st_size, stat.st_mtime_ns])}"


def revision(model: str | None, hub_revision: str | None = None, hub: bool = True) -> str:
    """A model and the revision of its files: for a local directory, every file's name, size and
    modification time (a retrained model in the same place is a new revision; hashing gigabytes of
    weights at every start is not worth it); for one file (a GGUF), its size and time; for a hub name
    (``hub``), the commit its local cache resolves ``hub_revision`` (the default branch) to: keyed by the
    name alone, a model updated on the hub answered from the old one's responses. A hub model not in this
    machine's cache (downloaded by the replicas elsewhere, or not yet) is its name; without ``hub``, always."""
    if not model:
        return "none"
    path = Path(resolve(model))
    if path.is_file():
        stat = path.stat()
        return f"{model}@{digest([stat.st_size, stat.st_mtime_ns])}"
    if path.is_dir():
        return f"{model}@{digest(files_of(path))}"
    snapshot = hub_snapshot(model, hub_revision) if hub else None
    return f"{model}@{snapshot.name}" if snapshot else model  # the commit: its files arrive one by one


def files_of(path: Path) -> list:
    return [(f, (s := (path / f).stat()).st_size, s.st_mtime_ns) for f in model_files(str(path))]


def hub_snapshot(name: str, hub_revision: str | None) -> Path | None:
    """The folder of the Hugging Face cache's snapshot of ``name`` at ``hub_revision``, None where it has none."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json", revision=hub_revision)
    except ValueError:  # not a repository id (huggingface_hub's validation error is a ValueError)
        return None
    return Path(found).parent if isinstance(found, str) else None


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:32]
