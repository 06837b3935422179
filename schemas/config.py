"""Typed, layered configuration: defaults < YAML file < ``--set dotted.key=value`` overrides.

One model per concern. Unknown keys and bad values fail at load time with the dotted field name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from schemas.errors import UserError

DEFAULT_GENERATOR = "qwen2.5-coder-0.5b-instruct"  # offline aliases (jobs/models.py prepares them)
DEFAULT_EMBEDDER = "all-minilm-l6-v2"


SPEED = {"changes_answers": False}  # json_schema_extra of a field that changes how fast a run goes, not what it answers
PLACEMENT = ("Ray custom resources each replica asks for, e.g. {llm_node: 1}: the pool then runs only on nodes "
             "started with them (`ray start --resources '{\"llm_node\": 8}'`); a local Ray that ragsift starts "
             "is given what the run's pools ask for")


class Section(BaseModel):
    """A config section. A field marked ``json_schema_extra=SPEED`` (or a whole section with
    ``changes_answers = False``) is a speed or resource setting: a resumed run may change it; every
    other field decides the answers and is part of a run's identity (jobs/answer.py)."""

    # no float field takes infinity or NaN (a limit that is none is None): a .inf cooldown or weight is a typo
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    changes_answers: ClassVar[bool] = True

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value, info):
        # pydantic takes true as 1 and false as 0: `--set retrieval.k=true` ran with k = 1
        if isinstance(value, bool) and _numbers_only(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"a number, not {str(value).lower()}")
        # pydantic takes no text such as "1e3" for an int (a quoted YAML value, a Session's Python value), where
        # 1.0 and 1 are one value
        if (isinstance(value, str) and _EXPONENT.fullmatch(value.strip())
                and _numbers_only(cls.model_fields[info.field_name].annotation)):
            return float(value)
        return value

    @field_validator("*")
    @classmethod
    def _whole_gpus_past_one(cls, value, info):
        # Ray refuses more than one GPU that is not a whole number only when it creates the actor, after the
        # pools started before it had loaded their models
        if info.field_name.startswith("num_gpus") and value > 1 and not float(value).is_integer():
            raise ValueError(f"{value:g} GPUs: a fraction shares one device; more than one must be a whole number")
        return value


def home_expanded(value):
    """A local path with a leading ``~`` expanded (a URI, ``hf:NAME`` and None as they are): pyarrow expands
    it when it opens questions or an output, and ragsift's own paths (the index, the cache, config.yaml's
    record) did not, so ``output: ~/runs`` was written under $HOME and recorded under the working directory."""
    if isinstance(value, str) and value.startswith("~") and "://" not in value:
        return os.path.expanduser(value)
    return value


_EXPONENT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+")


def _numbers_only(annotation) -> bool:
    """An int / float field (or one that may be None): where a boolean is no value."""
    if isinstance(annotation, str):  # postponed annotations: "int", "float | None"
        return set(annotation.replace(" ", "").split("|")) - {"None"} <= {"int", "float"}
    args = [a for a in get_args(annotation) if a is not type(None)] if get_args(annotation) else [annotation]
    return bool(args) and all(a in (int, float) for a in args)


class EndpointConfig(Section):
    """An OpenAI-compatible server (a `vllm serve`, a hosted API, a teacher model) that a generator or judge
    pool sends its requests to instead of running vLLM in its replicas (actors/endpoint_generator.py)."""

    base_url: str = Field(description="e.g. http://127.0.0.1:8000/v1 (the server's OpenAI API root)")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="environment variable holding the API key "
                                    "(read where the replica runs); unset or None = no key ('EMPTY')")
    headers: dict[str, str] = Field(default_factory=dict, json_schema_extra=SPEED,
                                    description="extra HTTP headers; $VARS in a value are read from the replica's environment")
    max_concurrency: int = Field(32, json_schema_extra=SPEED, ge=1, description="requests in flight per replica")
    requests_per_second: float | None = Field(None, json_schema_extra=SPEED, gt=0,
                                              description="request starts per second per replica; None = no limit")
    max_retries: int = Field(5, json_schema_extra=SPEED, ge=0, description="retries with exponential backoff on "
                             "429, 408, 409, 5xx and lost connections (the openai client's); a request still failing "
                             "fails its call, which the engine retries and at last turns into an error row")
    timeout_s: float = Field(600, json_schema_extra=SPEED, gt=0, allow_inf_nan=False, description="one HTTP request's timeout")
    vllm_extensions: bool = Field(True, description="judgments use vLLM's `structured_outputs: {choice}`; False for "
                                  "servers without it: a judgment is then free text, read as the choice it names, else scored by "
                                  "its first token's top log-probs, else an error")


class PlacementGroupConfig(Section):
    """How a replica that spans several devices (tensor_parallel_size x pipeline_parallel_size > 1) is
    placed: one Ray placement group per replica, a bundle per vLLM worker, as Ray Data LLM does. The
    replica's actor and vLLM's Ray workers all run inside it (vLLM's `ray` executor backend)."""

    changes_answers: ClassVar[bool] = False
    bundle_per_worker: dict[str, float] = Field(
        default_factory=lambda: {"GPU": 1, "CPU": 1},
        description="what each vLLM worker reserves (at most 1 GPU: a worker is one device; a fraction shares "
                    "one); add a custom resource to pin workers to labelled nodes")
    strategy: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "PACK", description="PACK: on as few nodes as fit (tensor parallel inside a node, pipeline stages spill "
        "to the next); STRICT_PACK: one node or nothing (NVLink-bound tensor parallel); *SPREAD: one worker a node")

    @field_validator("bundle_per_worker")
    @classmethod
    def _one_device_a_worker(cls, value):
        # vLLM refuses a worker bundle of more than one GPU, inside the replica after its placement group was made
        if value.get("GPU", 0) > 1:
            raise ValueError(f"a vLLM worker runs on one device: GPU {value['GPU']:g} in a bundle (at most 1)")
        return value


# vLLM's engine arguments (0.32's EngineArgs) that decide how a replica schedules, batches, caches and places its
# work, not what it answers: like the typed speed fields of LLMConfig, they move an answer at most in its last
# digits, as a batch's composition already does between two runs with the same values. In `engine_kwargs` a
# resumed run may change them, and the request cache serves what runs with other values computed. Those a typed
# field sets (gpu_memory_utilization, enforce_eager, tensor_parallel_size...) are refused there (ENGINE_ARGS_OF_FIELDS).
ENGINE_SPEED_ARGS = frozenset({
    "max_num_seqs", "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_active_seqs",
    "max_num_queued_reqs", "max_num_queued_tokens", "long_prefill_token_threshold", "enable_chunked_prefill",
    "scheduling_policy", "async_scheduling", "stream_interval", "enable_prefix_caching", "prefix_caching_hash_algo",
    "block_size", "kv_cache_memory_bytes", "num_gpu_blocks_override", "cpu_offload_gb",
    "max_cudagraph_capture_size", "cudagraph_capture_sizes", "disable_custom_all_reduce", "disable_log_stats",
    "max_parallel_loading_workers", "use_tqdm_on_load"})
# vLLM's engine arguments that a replica is given from LLMConfig's field of the same name (actors/generator.py's
# engine_arguments): in engine_kwargs as well, vLLM would be given the argument twice, which it refuses
ENGINE_ARGS_OF_FIELDS = ("model", "dtype", "max_model_len", "enforce_eager", "tensor_parallel_size",
                         "pipeline_parallel_size", "gpu_memory_utilization", "seed")


def answer_engine_kwargs(engine_kwargs: dict) -> dict:
    """``engine_kwargs`` without the arguments that only change how fast a replica goes (``ENGINE_SPEED_ARGS``)."""
    return {key: value for key, value in engine_kwargs.items() if key not in ENGINE_SPEED_ARGS}


class LLMConfig(Section):
    """One pool of vLLM replicas (the generator, or a judge of its own), or of clients of an OpenAI-compatible endpoint."""

    model: str = Field(DEFAULT_GENERATOR, description="offline alias, local HF dir, or hub name; with `endpoint`, "
                       "the model name the server serves")
    endpoint: EndpointConfig | None = Field(None, description="send this pool's requests to an OpenAI-compatible "
                                            "server; the vLLM engine fields below then do not apply (the server's own "
                                            "settings do), except max_model_len, seed and the pool's size")
    # vLLM's own choices (its ModelDType): another value failed inside the replica, after Ray and the actors started
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="weights and activations: 'auto' = bfloat16 where the hardware computes it "
        "natively (a GPU, or a CPU with AVX512-BF16 / AMX), else float32 (vLLM's CPU kernels emulate "
        "bf16 on AVX2-only CPUs: 4-6x slower); or another vLLM dtype. Changes answers in the last digits")
    max_model_len: int = Field(2048, ge=256, description="context window; a local replica cuts a request's max_tokens "
                               "to what its prompt leaves, and a prompt that leaves nothing is an error row (an "
                               "endpoint's server, which counts the tokens, refuses a request past its own window: "
                               "an error row naming its reason)")
    enforce_eager: bool | None = Field(None, json_schema_extra=SPEED, description="skip CUDA-graph capture and "
                                       "torch.compile; None = on CPU replicas (faster start, CPU-safe), not on GPU ones "
                                       "(CUDA graphs decode faster)")
    tensor_parallel_size: int = Field(1, json_schema_extra=SPEED, ge=1, description="GPUs one layer is split over "
                                      "(inside a node); with pipeline_parallel_size > 1 too, a placement group holds them")
    pipeline_parallel_size: int = Field(1, json_schema_extra=SPEED, ge=1, description="stages the layers are cut "
                                        "into; stages may sit on different nodes")
    placement_group: PlacementGroupConfig = Field(
        default_factory=PlacementGroupConfig, description="used when tensor_parallel_size x pipeline_parallel_size > 1")
    gpu_memory_utilization: float = Field(0.9, json_schema_extra=SPEED, gt=0, le=1, description="share of each GPU "
                                          "vLLM preallocates for weights and KV cache (GPU replicas)")
    cpu_kvcache_gib: int = Field(4, json_schema_extra=SPEED, ge=1,
                                 description="VLLM_CPU_KVCACHE_SPACE on CPU builds: KV cache GiB (Qwen-0.5B: ~87k tokens a GiB)")
    cpu_threads_bind: str = Field(
        "all", json_schema_extra=SPEED, description="CPU builds: VLLM_CPU_OMP_THREADS_BIND. 'all' = every core this process may "
                           "use, its container's cpuset (1.9x "
                           "faster than vLLM's default on an otherwise idle 2-core box), 'auto' = vLLM's "
                           "default (one core left for other work), 'nobind', or a list like '0-7' / '0,2,4' "
                           "('|' between the lists of several ranks)",
        # anything else passed here and failed the replicas at start, in vLLM's words, naming no field
        pattern=r"^(all|auto|nobind|\d+(-\d+)?(,\d+(-\d+)?)*(\|\d+(-\d+)?(,\d+(-\d+)?)*)*)$")
    engine_in_process: bool = Field(
        True, json_schema_extra=SPEED,
        description="batch replicas: run vLLM's engine core inside the actor process (VLLM_ENABLE_V1_MULTIPROCESSING=0), "
                          "so it dies with the actor; False = vLLM's separate engine process (overlaps "
                          "scheduling with execution on GPUs, but outlives a SIGKILLed actor when no raylet reaps it). "
                          "Async replicas always run it in a process of its own (vLLM has no in-process AsyncLLM)")
    serving: Literal["async", "batch"] = Field(
        "async", json_schema_extra=SPEED,
        description="async = vLLM's AsyncLLM: requests go in as strategies ask them and each result comes back when "
                    "its sequence ends (continuous batching; vLLM runs its engine core in a process of its own); "
                    "batch = one LLM.generate per micro-batch, which returns when its longest sequence ends. "
                    "Same prompts and sampling either way (vLLM's CPU kernels are not batch-invariant, so a near-tie "
                    "between tokens can differ, as between two batch sizes)")
    seed: int = Field(0, description="vLLM's sampling seed (an endpoint's `seed`): at temperature > 0 another seed "
                      "draws other samples (and keys other request-cache entries)")
    replicas: int = Field(1, json_schema_extra=SPEED, ge=1, description="actors of this pool, each a whole engine; "
                          "requests go to the least loaded")
    num_gpus: float = Field(0, json_schema_extra=SPEED, ge=0, description="GPUs of a one-device replica (1 on GPU); "
                            "a replica over several devices takes them from its placement group's bundles instead")
    num_cpus: float = Field(1, json_schema_extra=SPEED, ge=0, description="Ray CPUs each replica reserves")
    resources: dict[str, float] = Field(default_factory=dict, json_schema_extra=SPEED, description=PLACEMENT)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="more of vLLM's engine arguments "
                                          "(vllm.LLM's; AsyncEngineArgs' under serving: async); unused with `endpoint`. "
                                          "Those of ENGINE_SPEED_ARGS (max_num_seqs, enable_prefix_caching...) are speed "
                                          "settings: a resumed run may change them. Not those this pool's own fields set "
                                          "(gpu_memory_utilization, seed...) nor distributed_executor_backend")

    @field_validator("engine_kwargs")
    @classmethod
    def _no_argument_given_twice(cls, value, info):
        for key in value:
            if key in ENGINE_ARGS_OF_FIELDS:
                raise ValueError(f"{key} is this pool's own field: set it beside engine_kwargs, not in it")
            if key == "distributed_executor_backend":
                raise ValueError(f"{key}: ragsift sets it itself (uni on one device, ray over a replica's placement group)")
            if key == "disable_log_stats" and info.data.get("serving") == "async":
                raise ValueError(f"{key}: ragsift sets it itself under serving: async")
        return value

    @property
    def world_size(self) -> int:
        """vLLM workers a replica runs: one per device it spans."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def on_gpu(self) -> bool:
        """Whether a replica runs on GPUs, by its placement (what it reserves from Ray), not by what the
        driver or the replica's process happens to see."""
        if self.world_size > 1:
            return self.placement_group.bundle_per_worker.get("GPU", 0) > 0
        return self.num_gpus > 0

    @model_validator(mode="after")
    def _one_way_to_hold_gpus(self):
        # a multi-device replica's GPUs are its placement group's bundles; an actor holding them as well
        # would ask Ray for twice the GPUs and wait forever for the second half
        if self.world_size > 1 and self.num_gpus:
            raise ValueError(f"num_gpus: with tensor_parallel_size x pipeline_parallel_size = {self.world_size} the "
                             "replica's GPUs are its placement group's bundles (placement_group.bundle_per_worker); "
                             "leave num_gpus at 0")
        return self


class SamplingConfig(Section):
    """Defaults for vllm.SamplingParams; greedy so runs are reproducible."""

    temperature: float = Field(0.0, ge=0, allow_inf_nan=False,
                               description="of every generation (judgments are always greedy); 0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="nucleus sampling; 1 = off")
    max_tokens: int = Field(48, ge=1, description="completion budget of a generation whose step names none (a short "
                            "answer); structured steps (trajectories, sub-question lists) set their own")


class EmbedderConfig(Section):
    model: str = Field(DEFAULT_EMBEDDER, description="sentence-transformers model (offline alias, folder or hub "
                       "name) that `ragsift index` encodes passages with; a run encodes queries with its index's")
    batch_size: int = Field(64, json_schema_extra=SPEED, ge=1, description="texts per encode call")
    device: str | None = Field(None, json_schema_extra=SPEED, description="None = the GPU when num_gpus > 0 (cuda when "
                               "available), else cpu")
    replicas: int = Field(1, json_schema_extra=SPEED, ge=1, description="encoder actors (query encoding; in "
                          "`ragsift index`, passage encoding)")
    num_cpus: float = Field(0.5, json_schema_extra=SPEED, ge=0, description="Ray CPUs each replica reserves")
    num_gpus: float = Field(0, json_schema_extra=SPEED, ge=0, description="GPUs each replica reserves (> 0: it "
                            "encodes there)")
    resources: dict[str, float] = Field(default_factory=dict, json_schema_extra=SPEED, description=PLACEMENT)
    threads: int | None = Field(
        None, json_schema_extra=SPEED, ge=1, description="torch threads per encoder replica in `ragsift index`; "
        "None = the cores of its machine shared among the replicas (OMP_NUM_THREADS=1, right beside vLLM in "
        "an answer run, would encode on one core). Set it when replicas spread over several machines")


class IndexConfig(Section):
    """How ``ragsift index`` builds shards (FAISS ``index_factory`` types) and how searches probe them."""

    search_time: ClassVar[tuple[str, ...]] = ("nprobe", "hnsw_ef_search")  # the rest is how the index is built
    path: str = Field(".ragsift/index", json_schema_extra=SPEED,  # a location: a run's identity holds its manifest's digest
                      description="directory holding manifest.json and shard-*/; a local folder or a shared file "
                                  "system's mount, which each retriever replica opens as files: it reads its shard's FAISS index "
                                  "and passages into memory (its BM25 index is memory-mapped)")

    @field_validator("path")
    @classmethod
    def _a_folder(cls, value):
        # an s3:// folder failed in a traceback that printed its credentials (building) or asked to build
        # the index that was there (answering); the value is not repeated here: it may hold a secret
        if "://" in value:
            raise ValueError("an index is a local folder or a shared file system's mount (e.g. /shared/idx), "
                             "not a URI: copy it from object storage to where the retriever replicas run")
        return home_expanded(value)
    shards: int = Field(2, json_schema_extra=SPEED, ge=1, description="shards the corpus is cut into (in corpus "
                        "order), each searched by its own actor; results merge to the same top k")
    index_type: Literal["flat", "ivf_flat", "ivf_pq", "hnsw"] = Field(
        "flat", description="flat = exact inner product; ivf_* = inverted lists (trained); hnsw = graph")
    nlist: int | None = Field(None, ge=1, description="IVF lists per shard; None = 4*sqrt(shard rows)")
    nprobe: int = Field(16, ge=1, description="IVF lists visited per query (search time, not build)")
    pq_m: int = Field(16, ge=1, description="IVF-PQ sub-quantizers (must divide the embedding dims)")
    pq_bits: int = Field(8, ge=1, le=16, description="IVF-PQ bits per sub-quantizer code")
    hnsw_m: int = Field(32, ge=4, description="HNSW neighbours per node")
    hnsw_ef_search: int = Field(128, ge=1, description="HNSW candidate list at search time")
    train_sample: int = Field(100_000, ge=1000, description="vectors per shard the IVF quantizer is trained on")
    bm25: bool = Field(True, description="also build a BM25 index per shard (bm25s)")
    bm25_k1: float = Field(0.9, gt=0, description="BM25 k1 (0.9: Pyserini's default, used by MIGRES)")
    bm25_b: float = Field(0.4, ge=0, le=1, description="BM25 b (0.4: Pyserini's default)")
    encode_batch_rows: int = Field(512, json_schema_extra=SPEED, ge=1, description="corpus rows read and encoded per batch")
    chunk_words: int | None = Field(
        None, ge=8, description="split each passage of more than this many words into passages of this many words "
                                "(ids <id>#<n>, the title kept; jobs/chunks.py); None = index passages as they are")
    chunk_overlap: int = Field(0, ge=0, description="words each split passage repeats from the one before it")

    @model_validator(mode="after")
    def _overlap_inside_the_window(self):
        if self.chunk_words is None and self.chunk_overlap:
            raise ValueError(f"index.chunk_overlap ({self.chunk_overlap}) without index.chunk_words: nothing is split")
        if self.chunk_words is not None and self.chunk_overlap >= self.chunk_words:
            raise ValueError(f"index.chunk_overlap ({self.chunk_overlap}) must be less than index.chunk_words "
                             f"({self.chunk_words}): each split passage must move on")
        return self


def built_with_index(key: str) -> bool:
    """Whether the dotted answer config field ``key`` is how ``ragsift index`` builds an index (``index.*`` but
    its location and search settings, and ``embedder.model``): a run searches its index as the manifest says
    it was built, and encodes queries with the index's embedder."""
    section, _, field = key.partition(".")
    return key == "embedder.model" or (section == "index" and field.split(".")[0] not in ("", "path",
                                                                                          *IndexConfig.search_time))


class RetrievalConfig(Section):
    """How a ``Retrieve`` request is served: dense (FAISS), BM25, or both fused by reciprocal rank."""

    k: int = Field(5, ge=1, le=1000, description="passages a retrieval returns (where the strategy asks for no other k)")
    method: Literal["dense", "bm25", "hybrid"] = Field("dense", description="default for requests that name none")
    rrf_k: int = Field(60, ge=1, description="reciprocal rank fusion constant: score = sum w / (rrf_k + rank)")
    dense_weight: float = Field(1.0, ge=0, description="hybrid: weight of the dense ranking")
    bm25_weight: float = Field(1.0, ge=0, description="hybrid: weight of the BM25 ranking")
    fusion_candidates: int = Field(50, ge=1, description="hybrid: hits taken from each ranking before fusion "
                                   "(k when k is larger)")
    num_cpus_per_shard: float = Field(0.25, json_schema_extra=SPEED, ge=0, description="CPUs each shard actor "
                                      "(its FAISS index, passages and BM25 index) reserves")
    num_gpus_per_shard: float = Field(0, json_schema_extra=SPEED, ge=0, description="GPUs each shard actor reserves; "
                                      "> 0 searches its FAISS index on its GPU (faiss-gpu, the `.[gpu]` extra; Flat "
                                      "and IVF shards, IVF-PQ at 8 bits a code with 1-96 sub-quantizers of at most 32 "
                                      "dims: FAISS has no GPU HNSW; others are refused at start). At 0 the index "
                                      "stays on the CPU even where FAISS sees GPUs: copied onto them unreserved, it "
                                      "would sit beside vLLM's preallocated memory unseen by Ray")
    shard_resources: dict[str, float] = Field(default_factory=dict, json_schema_extra=SPEED,
                                              description="Ray custom resources each shard actor asks for (placement, "
                                              "as a pool's `resources`)")


class CrossEncoderPool(Section):
    """A pool of sentence-transformers CrossEncoder actors."""

    batch_size: int = Field(32, json_schema_extra=SPEED, ge=1, description="pairs per forward pass")
    max_length: int = Field(512, ge=16, description="tokens of a (query, text) pair; longer pairs are truncated")
    device: str | None = Field(None, json_schema_extra=SPEED, description="torch device; None = cuda when num_gpus "
                               "> 0, else cpu")
    replicas: int = Field(1, json_schema_extra=SPEED, ge=1, description="actors of this pool")
    num_cpus: float = Field(0.5, json_schema_extra=SPEED, ge=0, description="Ray CPUs each replica reserves")
    num_gpus: float = Field(0, json_schema_extra=SPEED, ge=0, description="GPUs each replica reserves")
    resources: dict[str, float] = Field(default_factory=dict, json_schema_extra=SPEED, description=PLACEMENT)


class RerankerConfig(CrossEncoderPool):
    """The ``ranker`` stage: a CrossEncoder, or an M_rel from ``ragsift train relevance``, when ``model`` is
    set; else the embedder's cosine (the labelled fallback)."""

    model: str | None = Field(None, description="CrossEncoder name or path, or a `ragsift train relevance` "
                              "directory (a bi-encoder, its cosine through the fitted logit); None = the "
                              "embedder's cosine (fallback)")


class NLIConfig(CrossEncoderPool):
    """The ``nli`` stage: an NLI CrossEncoder (e.g. cross-encoder/nli-deberta-v3-base) that MIGRES's leaf
    module verifies extracted statements with; None = the judge model's P("yes") to an entailment prompt."""

    model: str | None = Field(None, description="NLI CrossEncoder name or path (an 'entailment' label in its config)")


class KnowConfig(Section):
    """The ``know`` stage: RA-ISF's trained self-knowledge classifier (``ragsift train know``), used when
    ``raisf.judges: trained``."""

    model: str | None = Field(None, description="directory written by `ragsift train know`")
    batch_size: int = Field(64, json_schema_extra=SPEED, ge=1, description="questions per encode call")
    device: str | None = Field(None, json_schema_extra=SPEED, description="torch device of its encoder; None = "
                               "cuda when num_gpus > 0, else cpu")
    replicas: int = Field(1, json_schema_extra=SPEED, ge=1, description="actors of this pool")
    num_cpus: float = Field(0.5, json_schema_extra=SPEED, ge=0, description="Ray CPUs each replica reserves")
    num_gpus: float = Field(0, json_schema_extra=SPEED, ge=0, description="GPUs each replica reserves")
    resources: dict[str, float] = Field(default_factory=dict, json_schema_extra=SPEED, description=PLACEMENT)


class StageBatching(Section):
    """Micro-batching policy of one stage pool."""

    max_batch: int = Field(64, ge=1, description="requests per call to a replica")
    max_wait_s: float = Field(0.05, ge=0, description="how long the oldest queued request waits for a fuller batch "
                              "(a batch also goes as soon as no other is running)")
    max_inflight_per_replica: int = Field(2, ge=1, description="batches queued at one replica")
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                                    description="a batch running longer fails and its replica is restarted; None = no limit")


class LLMBatching(StageBatching):
    max_batch: int = Field(256, ge=1, description="requests per call to a replica (async replicas: per streaming call)")
    timeout_s: float | None = Field(1800, gt=0, allow_inf_nan=False,
                                    description="a batch running longer fails (async replicas: this long without a "
                                    "result from its replica) and its replica is restarted; None = no limit")
    max_tokens_in_flight: int | None = Field(None, ge=1, description="async replicas: estimated prompt + completion "
                                             "tokens in flight per replica; None = twice the replica's KV cache")


class RetrieverBatching(StageBatching):
    """Batching of the retriever, nli and know stages (and the ranker's)."""

    max_batch: int = Field(128, ge=1, description="requests per call to a replica")
    timeout_s: float | None = Field(600, gt=0, allow_inf_nan=False, description="a batch running longer fails and its replica is "
                                    "restarted; None = no limit")


class RankerBatching(RetrieverBatching):
    max_texts: int | None = Field(
        1024, ge=1, description="texts (passages, sentences) scored per call, summed over its requests; a request "
        "longer than this goes alone; None = no limit. 128 MIGRES ranks of 50 passages each (6,400 encodes) ran past "
        "the 600 s timeout on a shared CPU core, so the replica was killed and the batch retried whole")


class EngineConfig(Section):
    window: int = Field(512, json_schema_extra=SPEED, ge=1, description="root questions in flight at once (backpressure)")
    generator: LLMBatching = Field(json_schema_extra=SPEED, default_factory=LLMBatching)
    judge: LLMBatching = Field(json_schema_extra=SPEED, default_factory=LLMBatching)
    retriever: RetrieverBatching = Field(json_schema_extra=SPEED, default_factory=RetrieverBatching)
    ranker: RankerBatching = Field(json_schema_extra=SPEED, default_factory=RankerBatching)
    nli: RetrieverBatching = Field(json_schema_extra=SPEED, default_factory=RetrieverBatching)
    know: RetrieverBatching = Field(json_schema_extra=SPEED, default_factory=RetrieverBatching)
    cache_size: int = Field(100_000, json_schema_extra=SPEED, ge=0, description="completed requests remembered for dedup")
    cache_mb: int = Field(1024, json_schema_extra=SPEED, ge=0, description="MiB those requests and their responses may "
                          "take in memory (reckoned from their texts), in the driver and in each engine actor; the "
                          "least recently used go first once this or cache_size is reached. 1024 holds 100,000 "
                          "direct / rag requests (1.5-6 KB each at k=5) but ~19,000 retrievals of 50 passages (~55 KB "
                          "each): at 100,000 of those a process held ~4.4 GB")
    max_nodes_per_root: int = Field(256, ge=1, description="question nodes per root tree, a guard against runaway "
                                    "strategies; sub-questions past it are not run (their parent gets them back as "
                                    "failed, metrics.json counts trees_capped). Must hold a whole RA-ISF tree")
    max_depth: int = Field(8, ge=0, description="hard depth cap for any strategy's sub-questions")
    # how the engine rides out failures decides which rows are error rows, never an answer: a resumed run may change them
    max_attempts: int = Field(3, json_schema_extra=SPEED, ge=1,
                              description="tries of a request on its own (after its batch failed twice and was split to "
                              "isolate it) before it becomes an error row")
    failure_cooldown_s: float = Field(2.0, json_schema_extra=SPEED, ge=0,
                                      description="a replica that failed gets no batch for this long")
    fail_fast_after: int = Field(64, json_schema_extra=SPEED, ge=0,
                                 description="failures in a row, none of a stage's calls answering in "
                                 "between, after which the stage is tested: requests retried alone that raised "
                                 "(any retried call while nothing has answered in this run). An error every request "
                                 "hits (a schema the server rejects) would otherwise isolate each request at a "
                                 "cooldown per failure, hours over a large input. Nothing answered in this run: the "
                                 "run stops (committed parts kept, resumable); else a request the stage answered is "
                                 "asked again, on each replica in turn, and the run stops only if it fails on every "
                                 "one with nothing answering meanwhile. 0 = never")
    replica_max_restarts: int = Field(-1, json_schema_extra=SPEED, ge=-1,
                                      description="Ray restarts of a dead replica (-1 = always)")
    actors: int = Field(1, json_schema_extra=SPEED, ge=1, description="engines driving the pools: 1 = in the job's "
                        "own process; n > 1 = n engine actors, each over every n-th question, for more requests/s "
                        "than one process drives (about 5,000: BENCHMARKS.md); the job's process then writes and reports")
    actor_cpus: float = Field(1, json_schema_extra=SPEED, ge=0, description="CPUs each engine actor asks Ray for")
    actor_resources: dict[str, float] = Field(default_factory=dict, json_schema_extra=SPEED, description=PLACEMENT)


class InputConfig(Section):
    """How questions are read (row policy: jobs/questions.py)."""

    read_batch_rows: int = Field(1024, json_schema_extra=SPEED, ge=1, description="questions read from the input "
                                 "at a time (the driver's memory for questions not yet answered)")
    max_question_chars: int = Field(4096, ge=1, description="longer questions become error rows")
    columns: dict[str, str] = Field(default_factory=dict, description="rename the input's columns, ours -> yours, "
                                    "e.g. {question: query, answers: golds}; ids are row numbers without an id column")
    split: str | None = Field(None, description="the split of a saved datasets.DatasetDict or of hf:NAME to answer "
                                                "(a file, which has none, refuses it)")


class OutputConfig(Section):
    """How answers are committed: one Parquet part per input shard and strategy (jobs/output.py)."""

    shard_rows: int = Field(10_000, ge=1, description="input rows per part: the unit of commit and resume")
    row_group_rows: int = Field(1024, json_schema_extra=SPEED, ge=1, description="rows per Parquet row group of "
                                "a part (what a reader reads at once)")
    max_error_share: float | None = Field(
        None, json_schema_extra=SPEED, ge=0, le=1,
        description="a finished run whose error rows are more than this share of its output's rows ends with "
                    "exit status 3 (everything committed, as without it); None = only a run whose every row is an "
                    "error row does")


AnswerForm = Literal["short", "yes_no", "yes_no_reasoned", "verdict"]
FORMS_BY_KIND: dict[str, str] = {"yes-no": "yes_no", "claim": "verdict"}


class AnswerFormConfig(Section):
    """The form of a final answer, per question. Every strategy's final step (closed-book, from
    passages, synthesised from sub-answers, fallbacks) answers in it. Changes answers.

    short = a brief free-text answer; yes_no = guided choice of yes / no; yes_no_reasoned = up to
    three sentences of reasoning, then yes / no (one JSON generation of at most 1,840 tokens; no default
    uses it: on our tuning slices it did not beat the choice for the 0.5B or 1.5B model through the
    strategies, results/README.md "Yes/no with reasoning first"); verdict = guided choice among
    ``verdicts``. A root question's form comes from its dataset, else its kind, else yes_no
    when its kind is in ``detect_yes_no`` and it is phrased as a yes/no question, else short.
    """

    by_kind: dict[str, AnswerForm] = Field(
        default_factory=lambda: dict(FORMS_BY_KIND),
        description="the input's `kind` -> form (a missing kind is a short-answer question); merged over the "
                    "defaults, so `--set answer_form.by_kind.yes-no=yes_no_reasoned` keeps claims' verdicts "
                    "(map a kind to 'short' to drop its form)")
    by_dataset: dict[str, AnswerForm] = Field(
        default_factory=dict, description="the input's `dataset` -> form; wins over by_kind")
    detect_yes_no: list[str] = Field(
        default_factory=lambda: ["multi-hop", "sub-question"],
        description="kinds (and 'sub-question') whose questions phrased as yes/no questions ('Are both ...?', "
                    "'Did ...?', without ' or ') are answered yes / no. On DEV outside the 200 sample the rule "
                    "picks HotpotQA / 2Wiki questions with yes/no gold at 271/272 precision; SQuAD's "
                    "'Were the centers profitable' has span gold, so single-hop is not in the default")
    verdicts: list[str] = Field(
        default_factory=lambda: ["SUPPORTS", "REFUTES"],
        description="the choices of a verdict (FEVER's labels); add 'NOT ENOUGH INFO' for three-way claims")
    verdict_cut: float | None = Field(
        None, ge=0, le=1,
        description="with two verdicts, a claim is answered with the first where the model's probability of it "
                    "(over the two) is at least this, else with the second (1: always the second, as every ragsift "
                    "cut); None = the likelier. Where a claim's verdict is a guided choice: not Self-Reasoning's "
                    "trajectory answer nor MIGRES's main-module answer (answer_step: main), which are text. A "
                    "model's verdict probabilities can rank claims and still favour one label for all of them: "
                    "Qwen2.5-Coder-0.5B answered REFUTES to 200 of 200 DEV FEVER claims at AUC 0.69 "
                    "(results/README.md, 'Claims'). `ragsift calibrate` chooses it on a slice with claims")

    @model_validator(mode="after")
    def _cut_between_two(self):
        # with three labels the cut would silently do nothing, and still keep a run from resuming
        if self.verdict_cut is not None and len(self.verdicts) != 2:
            raise ValueError(f"verdict_cut decides between two verdicts; these are {len(self.verdicts)}: {self.verdicts}")
        # the probabilities are the model's first token's: labels that begin alike share it, 0.5 each for every
        # claim (a tokenizer's first token of a word is rarely under 3 characters)
        shared = os.path.commonprefix([v.lower() for v in self.verdicts]) if self.verdict_cut is not None else ""
        if len(shared) >= 3 or (shared and len({v.split()[0].lower() for v in self.verdicts}) < 2):
            raise ValueError(f"verdict_cut reads each verdict's probability from its first token, which {self.verdicts} "
                             f"may share (both begin {shared!r}): name them so that they begin differently")
        return self

    @field_validator("verdicts")
    @classmethod
    def _distinct_labels(cls, value):
        # an empty list passed here and failed after Ray and vLLM had started (a choice among nothing)
        if not value or any(not v.strip() for v in value):
            raise ValueError("at least one label, none empty")
        if len({v.strip().upper() for v in value}) < len(value):
            raise ValueError(f"labels repeat (case aside): {value}")
        return value

    @field_validator("by_kind", mode="before")
    @classmethod
    def _over_the_defaults(cls, value):
        return {**FORMS_BY_KIND, **value} if isinstance(value, dict) else value


class LabelConfig(Section):
    """``ragsift label``: training data for judge models (RA-ISF Appendix A, Self-Reasoning's quality control)."""

    match: Literal["exact", "contains"] = Field(
        "exact", json_schema_extra=SPEED,
        description="closed-book answer vs gold for know/unknown, and a trajectory's answer for keeping it: "
        "'exact' (normalised EM: RA-ISF's a_g = a_i) or 'contains' (a gold answer inside the prediction)")
    collect: list[Literal["self_knowledge", "relevance", "decomposition"]] = Field(
        default_factory=lambda: ["self_knowledge", "relevance", "decomposition"],
        description="which RA-ISF labels to collect: self-knowledge alone needs only the closed-book answer "
                    "(one short generation a question); relevance adds a retrieval and a judgment per passage, "
                    "decomposition a structured generation. Changes what is asked, so it is part of the run")
    citation_filter: bool = Field(False, json_schema_extra=SPEED,
                                  description="also drop trajectories whose citation precision / recall "
                                  "against gold passages is under the thresholds (the paper's long-form filter)")
    citation_precision_min: float = Field(0.8, json_schema_extra=SPEED, ge=0, le=1, description="delta_p")
    citation_recall_min: float = Field(0.8, json_schema_extra=SPEED, ge=0, le=1, description="delta_r")
    license: str = Field("other", json_schema_extra=SPEED,
                         description="the licence the published label dataset's card declares (a hub licence id)")
    source_licenses: str = Field(
        "not stated: check the licences of the question and passage sources before publishing",
        json_schema_extra=SPEED, description="the licences of the inputs, as the dataset card should state them")


class CalibrationRecord(Section):
    """Where a config's thresholds came from: written by ``ragsift calibrate``, carried into every run's
    metadata. Informational; None when nothing was calibrated. The thresholds themselves are in their
    sections: a run resumed with the same values under another record (the slice moved, calibrated again
    into another folder) answers alike, so the record is no part of a run's identity."""

    changes_answers = False

    questions: str = Field(description="the calibration slice (never the questions a table reports on)")
    questions_sha256: str | None = Field(description="of the slice's file as given (None: a `datasets` folder or "
                                               "hf: name, not one file)")
    converted_sha256: str | None = Field(None, description="of the Parquet copy the probe answered, where ragsift "
                                                           "converted the slice (JSON Lines, CSV, a renamed column)")
    split: str | None = Field(None, description="the split read, where the slice is a `datasets` folder or hf: "
                                                "dataset of several (its input.split)")
    n: int = Field(ge=0, description="probe rows")
    generator: str = Field(description="the generator model the slice was probed with")
    judge: str | None = Field(None, description="the judge model, where not the generator")
    ranker: str = Field(description="the reranker's model, or the embedder's cosine fallback")
    know: str | None = Field(None, description="the self-knowledge model (know.model) RA-ISF's know threshold was "
                                               "chosen on, or \"judge: P('yes')\"; None: a record written before")
    chosen: dict[str, int | float | str] = Field(default_factory=dict, description="dotted field -> the value chosen")


class CacheConfig(Section):
    """The request cache on disk (engine/cache.py): every model, retrieval, ranking and entailment response
    a run computes, kept in SQLite and reused by any later run whose pools would compute the same (a
    rerun, a resumed run, a sweep, a Session). Keyed on what decides a response: the model and its files'
    revision, sampling, dtype, seed and context length; the index manifest and retrieval settings; and
    the request itself. Not keyed on: a hub name's revision (pin one by a local path) and an endpoint's
    weights (the server's; a changed server under the same name needs --no-cache or another path)."""

    changes_answers = False
    enabled: bool = Field(default_factory=lambda: os.environ.get("RAGSIFT_NO_CACHE", "").strip().lower()
                          in ("", "0", "false", "no", "off"),
                          description="False (or --no-cache, or RAGSIFT_NO_CACHE=1) = this run neither reads nor "
                          "writes the disk cache (it still shares identical requests within itself)")
    path: str | None = Field(None, description="the local SQLite file (not a URI); None = $RAGSIFT_HOME/cache/requests.sqlite "
                             "(~/.cache/ragsift). On a cluster it is on the driver's machine")
    max_mb: int | None = Field(4096, ge=1, description="a run that opens the file holding more responses than "
                               "this, or takes it past this as it writes (checked at every write), deletes the oldest "
                               "written until they take 80% of it (the file keeps its size and reuses the space; delete "
                               "the file to give it back); None = never")

    @field_validator("path")
    @classmethod
    def _a_local_file(cls, value):
        # SQLite writes only local files (a URI would name a local folder "s3:"); the value is not repeated: it may
        # hold a secret
        if value and "://" in value:
            raise ValueError("the request cache is a local SQLite file (SQLite cannot write to object storage), not a URI")
        return home_expanded(value)


class RayConfig(Section):
    changes_answers = False
    address: str | None = Field(None, description="cluster to join; None = RAY_ADDRESS or a local one")
    num_cpus: int | None = Field(None, description="CPUs of a local Ray (None = os.cpu_count()), raised to what "
                                                 "the actor pools request")
    # ge=75: Ray refuses less than 75 MiB, with a traceback after the output was claimed
    object_store_mb: int = Field(512, ge=75, description="object store of a local Ray, MiB")
    include_dashboard: bool = Field(False, description="start a local Ray's dashboard")
    dashboard_host: str = Field("127.0.0.1", description="address a local Ray's dashboard binds to (0.0.0.0 to "
                                "reach it from other machines)")
    log_to_driver: bool = Field(False, description="print the actors' own logs (vLLM's, Ray's workers') in the "
                                "job's output; they are in Ray's session logs either way")


class RunConfig(Section):
    """Everything a run is configured by except the strategies' own sections: the registry
    (strategies/registry.py) adds one section per strategy and calls this ``AnswerConfig``."""

    questions: str | None = Field(None, json_schema_extra=SPEED, description="the questions (--questions)")
    output: str | None = Field(None, json_schema_extra=SPEED, description="the output folder or URI (--output)")
    strategies: list[str] = Field(default_factory=lambda: ["rag"], json_schema_extra=SPEED,
                                  description="the strategies answering each question (--strategy)")
    limit: int | None = Field(None, json_schema_extra=SPEED, ge=1, description="the first N questions only (--limit)")
    input: InputConfig = Field(default_factory=InputConfig)
    commit: OutputConfig = Field(default_factory=OutputConfig)
    generator: LLMConfig = Field(default_factory=LLMConfig)
    judge: LLMConfig | None = Field(None, description="a separate judge pool; None = judge on the generator")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    reranker: RerankerConfig = Field(default_factory=RerankerConfig)
    nli: NLIConfig = Field(default_factory=NLIConfig)
    know: KnowConfig = Field(default_factory=KnowConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    answer_form: AnswerFormConfig = Field(default_factory=AnswerFormConfig)
    calibration: CalibrationRecord | None = Field(None, description="written by `ragsift calibrate`")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("questions", "output")
    @classmethod
    def _home(cls, value):
        return home_expanded(value)


def speed_setting(model: type[BaseModel], key: str) -> bool:
    """Whether the dotted config field ``key`` only changes how fast a run goes (marked ``SPEED``, or
    inside a section or field so marked); keys inside a dict field belong to that field."""
    for part in key.split("."):
        info = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if info is None:
            return False
        if (info.json_schema_extra or {}).get("changes_answers") is False:
            return True
        section = section_of(info.annotation)
        if section is not None and not section.changes_answers:
            return True
        model = section
    return False


def device_of(section: Any) -> str | None:
    """Where a model actor of ``section`` (embedder, reranker, know, nli) runs: its ``device``, else the
    CPU when its pool reserves no GPU (None: the actor's choice, cuda when available). Ray does not hide
    the GPUs from an actor that reserved none: "cuda when available" put these models on the GPU beside
    vLLM's preallocated memory, unseen by the scheduler."""
    return section.device or (None if section.num_gpus else "cpu")


class ConfigError(UserError):
    """A setting that is not valid, named by its field."""


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core schema for booleans, integers and floats: `no`, `on`, `y` stay
    strings (a license, a split, a dataset named so), `010` is ten (not octal eight), `1:30` and `1:30.5` are
    strings (not sexagesimal ninety), `1e3` is a float; only true / false are booleans."""


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text[:2] in ("0o", "0x") else int(text)


# and no timestamps (YAML 1.2 has none): `--set input.split=2024-01-01` was a date, refused as "not a valid string"
Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                           "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                   list("-+0123456789"))
Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _core_int)
# a whole number without a dot or exponent is the int above; SafeLoader's float constructor reads the rest
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


class Yaml12Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting every string that YAML 1.1 or this loader's 1.2 would read as something
    else: a config ragsift writes (config.yaml, calibrated.yaml) loads back to the same values. The 1.1
    dumper wrote '08' and '0o17' bare, which Yaml12Loader read as integers."""


Yaml12Dumper.yaml_implicit_resolvers = {first: list(resolvers)
                                        for first, resolvers in yaml.SafeDumper.yaml_implicit_resolvers.items()}
for _first, _resolvers in Yaml12Loader.yaml_implicit_resolvers.items():
    Yaml12Dumper.yaml_implicit_resolvers.setdefault(_first, []).extend(_resolvers)


def dump_yaml(values: dict) -> str:
    """``values`` as YAML that ``load_config`` reads back as they are."""
    return yaml.dump(values, Dumper=Yaml12Dumper, sort_keys=False)


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    """A mapping whose keys are each written once: YAML keeps the last of two, dropping a setting unsaid."""
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: construct_mapping merges it
            continue
        key = loader.construct_object(key_node)
        try:
            repeated = key in seen
        except TypeError:  # a list or mapping as a key: no config field is named so
            raise yaml.constructor.ConstructorError(None, None, f"a key that is not a name: {key!r}",
                                                    key_node.start_mark) from None
        if repeated:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


Yaml12Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader subclass


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def as_override(field: str, value: Any) -> str:
    """``field=value`` for a value that is text as it stands (a path, a model name): quoted, so that YAML
    reads neither ``idx #2`` as ``idx`` plus a comment nor ``2024`` / ``~`` / ``*idx`` as a number, null or alias."""
    return f"{field}={json.dumps(value, ensure_ascii=False) if isinstance(value, str) else value}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as YAML so numbers/bools/lists work). A key holding a dot
    or ``=`` (a dataset named ``my.qa`` in ``answer_form.by_dataset``) is double-quoted:
    ``answer_form.by_dataset."my.qa"=yes_no``."""
    keys, raw = _override_keys(text)
    try:
        return keys, load_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: its value is not valid YAML ({_one_line(err)})") from None


def _override_keys(text: str) -> tuple[list[str], str]:
    """The dotted key of ``key=value`` as its parts (a quoted part as it stands), and the value's text."""
    keys, i = [], 0
    while True:
        while text[i:i + 1].isspace():
            i += 1
        if text.startswith('"', i):
            end = text.find('"', i + 1)
            if end < 0:
                raise ConfigError(f"override {text!r}: a quoted key has no closing \"")
            keys.append(text[i + 1:end])
            i = end + 1
            while text[i:i + 1].isspace():
                i += 1
        else:
            end = min((j for j in (text.find(".", i), text.find("=", i)) if j >= 0), default=len(text))
            keys.append(text[i:end].strip())
            if not keys[-1] and end < len(text):  # "=0", "a..b=1": the field would be "" (pydantic's "Extra inputs")
                raise ConfigError(f"override {text!r}: an empty name in its dotted key (e.g. retrieval.k=5)")
            i = end
        if i >= len(text):
            raise ConfigError(f"override {text!r} must look like dotted.key=value")
        if text[i] == "=":
            return keys, text[i + 1:]
        if text[i] != ".":
            raise ConfigError(f"override {text!r}: a quoted key is followed by . or =")
        i += 1


def load_config(cls: type[BaseModel], file: str | Path | list | None = None, overrides: list[str] = (),
                **values: Any):
    """Build ``cls`` from defaults, YAML files (each over the one before, field by field), dotted
    overrides, then explicit keyword values."""
    data: dict[str, Any] = {}
    for path in (Path(f).expanduser() for f in ([file] if isinstance(file, (str, Path)) else file or [])):
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = load_yaml(path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise ConfigError(f"config file {path} is not valid YAML: {_one_line(err)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        _layer(data, loaded, cls)
    for text in overrides:
        keys, value = parse_override(text)
        _check_mapping_key(cls, keys, text)
        node = data
        for k in keys[:-1]:
            if node.get(k) is None:  # absent, or null as a run's own config.yaml writes an unset section
                node[k] = {}
            node = node[k]
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    for key, value in values.items():
        if value is not None:
            data[key] = value
    return validated(cls, data)


def _check_mapping_key(cls: type[BaseModel], keys: list[str], text: str) -> None:
    """A key walks sections, then one name into a mapping of plain values (``generator.resources``,
    ``answer_form.by_dataset``): the rest of ``answer_form.by_dataset.my.qa`` is the name ``my.qa``, not
    the name ``my`` holding ``qa``, which the mapping cannot hold."""
    model = cls
    for i, key in enumerate(keys[:-1]):
        field = model.model_fields.get(key)
        if field is None:  # not a field: validation names it
            return
        model = section_of(field.annotation)
        if model is None:
            if len(keys) - i > 2 and _maps_to_plain_values(field.annotation):
                dotted, name = ".".join(keys[:i + 1]), ".".join(keys[i + 1:])
                raise ConfigError(f"override {text!r}: {dotted} maps names to values, and its names are not split at "
                                  f"dots: quote the name, --set '{dotted}.\"{name}\"=VALUE'")
            return


def _maps_to_plain_values(annotation) -> bool:
    """``dict[str, float]``, ``dict[str, AnswerForm]``, not ``dict[str, Any]`` (vLLM's engine_kwargs nest)."""
    if get_origin(annotation) is not dict:
        return False
    value = get_args(annotation)[1]
    return value is not Any and get_origin(value) is not dict


def _layer(data: dict, over: dict, cls: type[BaseModel]) -> None:
    """``over`` onto ``data``: a config section merged field by field, any other value (a mapping such
    as ``resources`` or ``input.columns`` too) replaced, as ``--set`` replaces it."""
    for key, value in over.items():
        field = cls.model_fields.get(key)
        section = section_of(field.annotation) if field else None
        if section and isinstance(value, dict) and isinstance(data.get(key), dict):
            _layer(data[key], value, section)
        else:
            data[key] = value


def section_of(annotation) -> type[Section] | None:
    """The config section class a field holds (``LLMConfig | None`` included), or None."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def validated(cls: type[BaseModel], data: dict) -> BaseModel:
    """``cls`` from ``data``, every validator run (``model_copy(update=...)`` runs none); a bad value is
    a ConfigError naming its field."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}{_quote_hint(e)}" for e in err.errors()
        )
        raise ConfigError(f"invalid {cls.__name__}: {problems}") from None


def _quote_hint(error: dict) -> str:
    # YAML reads TRUE / False as booleans: `--set 'answer_form.verdicts=[TRUE, FALSE]'` said only that each
    # "should be a valid string"
    if error["type"] == "string_type" and isinstance(error.get("input"), bool):
        return f" (YAML reads {str(error['input']).lower()} as a boolean: quote the text)"
    return ""
