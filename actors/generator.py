"""Generator replica, batch kind: one ``vllm.LLM``. A batch of chat requests in (free text,
JSON-constrained text, or judgments among fixed choices), one ``LLM.generate`` call, a batch of
results out. The streaming kind (actors/streaming_generator.py) shares ``Prompts``."""

from __future__ import annotations

import functools
import math
import os
import re

from actors.chat_tokens import chat_token_ids, special_tokens
from schemas.records import Generate, Generation, Judge, Judgment, failed

JUDGE_LOGPROBS = 20  # top-k first-token log-probs from which P(choice) is estimated


def configure(llm: dict) -> None:
    """Environment vLLM reads when an engine starts (both replica kinds)."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(llm["cpu_kvcache_gib"])
    bind = llm["cpu_threads_bind"]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(usable_cpus()) if bind == "all" else bind
    bundle_gpus = llm["placement_group"]["bundle_per_worker"].get("GPU", 0)
    if world_size(llm) > 1 and 0 < bundle_gpus < 1:
        # vLLM's Ray workers each ask for VLLM_RAY_PER_WORKER_GPUS (1) inside their bundle: more than a
        # fractional bundle holds, so they never started (Ray Serve LLM sets it from its bundles too)
        os.environ["VLLM_RAY_PER_WORKER_GPUS"] = str(bundle_gpus)
    if world_size(llm) == 1 and not llm.get("on_gpu", True) and _in_ray_actor():
        refuse_unreserved_gpu()


def _in_ray_actor() -> bool:
    """Whether this process is a Ray actor, whose GPUs are what it reserved (a benchmark's in-process
    generator takes what its machine has)."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def refuse_unreserved_gpu() -> None:
    """A replica that reserved no GPU runs vLLM on the CPU install only: a GPU build of vLLM sees every GPU
    of its node (Ray 2.60 hides none from an actor that reserved none) and takes the first, beside the
    memory of whatever Ray gave that GPU to."""
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        raise RuntimeError("this replica reserved no GPU (its pool's num_gpus is 0) and this vLLM is a GPU build: it "
                           "would run on a GPU Ray did not give it. Set the pool's num_gpus (generator.num_gpus, "
                           "judge.num_gpus: 1 a replica), or install the CPU extra to run it on CPUs")


def engine_arguments(llm: dict) -> dict:
    """The engine arguments of a replica, the same for ``vllm.LLM`` and ``AsyncEngineArgs``."""
    return dict(
        model=llm["model"],
        dtype=resolve_dtype(llm["dtype"], gpu=llm.get("on_gpu")),
        max_model_len=llm["max_model_len"],
        enforce_eager=llm["enforce_eager"],
        tensor_parallel_size=llm["tensor_parallel_size"],
        pipeline_parallel_size=llm["pipeline_parallel_size"],
        # one device: vLLM's worker in-process ("uni"); several: vLLM's Ray workers, one per bundle of the
        # placement group this replica was scheduled into (jobs/pools.py), so they land where Ray reserved
        distributed_executor_backend="uni" if world_size(llm) == 1 else "ray",
        gpu_memory_utilization=llm["gpu_memory_utilization"],
        seed=llm["seed"],
        # compact JSON under guided decoding: vLLM reads this flag from the engine's config, not from a
        # request (a request's own disable_any_whitespace is ignored), and without it a small model spends
        # half its structured-output tokens on newlines and indentation (measured: 5,134 vs 2,653
        # completion tokens for 16 Self-Reasoning trajectories)
        **{"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
           **llm["engine_kwargs"]},
    )


def world_size(llm: dict) -> int:
    return llm["tensor_parallel_size"] * llm["pipeline_parallel_size"]


def resolve_dtype(dtype: str, cpu_flags: str | None = None, gpu: bool | None = None) -> str:
    """``auto``: the model's own dtype (bfloat16 for ours) on a GPU or a CPU that computes bf16 natively
    (AVX512-BF16, AMX), float32 on other CPUs. There vLLM's bf16 matmuls are emulated and cost about the
    same per step whatever the batch (measured on a 2-core AVX2 EPYC, Qwen2.5-0.5B: 8 short judgments
    13.5 s in bf16, 2.1 s in fp32; 32 RAG prompts 275 vs 1,046 tokens/s). ``gpu``: whether the model runs
    on a GPU, where another process than the replica's asks (None: this process's torch sees one)."""
    if dtype != "auto":
        return dtype
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    if gpu:
        return "auto"
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpu_flags = f.read()
        except OSError:  # not Linux: vLLM's CPU builds elsewhere (Apple silicon) compute bf16 natively
            return "bfloat16"
    return "bfloat16" if re.search(r"\b(avx512_bf16|amx_bf16)\b", cpu_flags) else "float32"


class Prompts:
    """Chat template, token budget and sampling parameters of a request, and its result from vLLM's
    output: what both replica kinds do around their one engine call."""

    def __init__(self, tokenizer, max_model_len: int, sampling: dict):
        self.tokenizer, self.max_model_len, self.sampling = tokenizer, max_model_len, sampling

    def check_template(self) -> None:
        """Raise, at the replica's start, for a tokenizer that cannot template a chat at all (a base model
        with no chat template): every request would be its own error row (``prepare``) and the run would
        end "done" with none answered, where a replica that cannot start stops its stage, saying why."""
        try:
            self.tokenizer.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                               tokenize=True, add_generation_prompt=True)
        except Exception as err:
            # the hint first: the engine cuts a cause's text, and transformers' own message is long
            raise ValueError("the model's tokenizer cannot template a chat, and ragsift sends chat messages: give an "
                             f"instruct / chat model ({type(err).__name__}: {err})") from err

    @functools.cached_property
    def special_token_pattern(self) -> re.Pattern | None:
        return special_tokens(self.tokenizer)

    def prepare(self, req: Generate | Judge):
        """(prompt, sampling params), or an error result for a prompt that leaves no room to answer or
        that cannot be templated or tokenized: prepared here, one request at a time, so that such a
        request is its own error result, not a failed call that takes the others of its batch along."""
        try:
            return self._prepare(req)
        except Exception as err:  # noqa: BLE001 - this request's error row; the others of the call are answered
            return failed(req, f"prompt not prepared: {type(err).__name__}: {err}"[:1000])

    def _prepare(self, req: Generate | Judge):
        from vllm.inputs import TokensPrompt

        if isinstance(req, Generate) and req.max_tokens is not None and req.max_tokens < 1:
            return failed(req, f"max_tokens {req.max_tokens}: at least 1 (None: the run's default)")
        sp = self.params(req)
        ids = chat_token_ids(self.tokenizer, req.as_chat(), self.special_token_pattern)
        budget = completion_budget(len(ids), sp.max_tokens, self.max_model_len, minimum=min_completion(req, sp))
        if isinstance(budget, str):
            return failed(req, budget, prompt_tokens=len(ids))
        sp.max_tokens = budget
        return TokensPrompt(prompt_token_ids=ids), sp

    def params(self, req: Generate | Judge):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        if isinstance(req, Judge):
            # guided decoding takes any tokens that spell a choice: the budget is the choice's bytes (with
            # its own token count, a model spelling "A", "M", "B", ... was cut at "AMBIGUO")
            return SamplingParams(temperature=0.0, max_tokens=req.max_tokens, logprobs=JUDGE_LOGPROBS,
                                  structured_outputs=StructuredOutputsParams(choice=list(req.choices)))
        structured = StructuredOutputsParams(json=req.json_schema) if req.json_schema else None
        return SamplingParams(**{**self.sampling, "max_tokens": req.budget(self.sampling["max_tokens"])},
                              structured_outputs=structured)

    def result(self, req: Generate | Judge, out) -> Generation | Judgment:
        """A request's result from its finished ``RequestOutput``."""
        completion = out.outputs[0]
        n_prompt, n_completion = len(out.prompt_token_ids), len(completion.token_ids)
        cached = out.num_cached_tokens or 0
        if isinstance(req, Judge):
            first = completion.logprobs[0] if completion.logprobs else {}
            top = [(lp.decoded_token, lp.logprob) for lp in first.values()]
            # a choice's own first token, by id, where a top token decodes to no text (a byte fragment of a
            # non-Latin choice); the choices are tokenized only then, not for every judgment
            blank = {i for i, lp in first.items() if not (lp.decoded_token or "").strip()}
            starts = {c: self.tokenizer.encode(c, add_special_tokens=False)[:1] for c in req.choices} if blank else {}
            fragments = [(c, first[ids[0]].logprob) for c, ids in starts.items() if ids and ids[0] in blank]
            return Judgment(completion.text.strip(), choice_probs(top, req.choices, fragments), n_prompt, n_completion,
                            cached_tokens=cached)
        return Generation(completion.text, n_prompt, n_completion, cached_tokens=cached,
                          finish_reason=completion.finish_reason)


class Generator:
    def __init__(self, llm: dict, sampling: dict):
        configure(llm)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if llm["engine_in_process"] else "1"
        if llm["engine_in_process"]:
            # the model then runs in this process, whose torch would take OMP_NUM_THREADS (often 1)
            os.environ["OMP_NUM_THREADS"] = str(bound_cores(llm["cpu_threads_bind"]))
        from vllm import LLM

        self.llm = LLM(**engine_arguments(llm))
        self.prompts = Prompts(self.llm.get_tokenizer(), llm["max_model_len"], sampling)
        self.prompts.check_template()

    def shutdown(self) -> None:
        """End vLLM's engine core process, where it runs in one (as StreamingGenerator.shutdown)."""
        if core := getattr(self.llm.llm_engine, "engine_core", None):
            core.shutdown()

    def generate(self, requests: list[Generate | Judge]) -> list[Generation | Judgment]:
        results: list = [None] * len(requests)
        prompts, params, slots = [], [], []
        for i, req in enumerate(requests):
            prepared = self.prompts.prepare(req)
            if isinstance(prepared, (Generation, Judgment)):
                results[i] = prepared
                continue
            prompts.append(prepared[0])
            params.append(prepared[1])
            slots.append(i)
        if prompts:
            for slot, out in zip(slots, self.llm.generate(prompts, params, use_tqdm=False)):
                results[slot] = self.prompts.result(requests[slot], out)
        return results

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (benchmarks compare runs from the same cold state)."""
        self.llm.reset_prefix_cache()


def min_completion(req: Generate | Judge, sp) -> int:
    """A judgment needs its whole choice; free text is worth generating with any room left."""
    return sp.max_tokens if isinstance(req, Judge) else 1


def completion_budget(prompt_tokens: int, max_tokens: int, max_model_len: int, minimum: int = 1) -> int | str:
    """Tokens to generate for a prompt: ``max_tokens`` cut to what the context window leaves (as vLLM
    caps a sequence at ``max_model_len``), or an error message when less than ``minimum`` is left."""
    room = max_model_len - prompt_tokens
    if room < minimum:
        return (f"prompt of {prompt_tokens} tokens leaves {max(room, 0)} of max_model_len {max_model_len} "
                f"to generate, needs {minimum}: raise the pool's max_model_len, read fewer passages (retrieval.k, "
                "or the strategy's own k: raisf.k, self_reasoning.k, ...), or index the corpus in shorter passages")
    return min(max_tokens, room)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on: a container's cpuset, not every CPU of the host (binding threads to
    the host's 0-63 in a container given 2 failed the replica at start, or ran 64 threads on 2 cores)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def cpu_list(cpus: list[int]) -> str:
    """``cpus`` as VLLM_CPU_OMP_THREADS_BIND writes them: [0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in runs)


def bound_cores(bind: str) -> int:
    """How many cores a VLLM_CPU_OMP_THREADS_BIND setting gives the model ('all', 'auto', 'nobind', '0-7,9')."""
    cores = len(usable_cpus())
    if bind in ("all", "nobind"):  # nobind: threads unpinned, as many as the cores it may use
        return cores
    if bind == "auto":  # vLLM's default leaves one core to the front end
        return max(1, cores - 1)
    count = 0
    for part in bind.replace("|", ",").split(","):
        lo, _, hi = part.partition("-")
        count += int(hi) - int(lo) + 1 if hi else 1
    return max(1, count)


def choice_probs(first_token: list[tuple[str | None, float]], choices: tuple[str, ...],
                 fragments: list[tuple[str, float]] = ()) -> dict[str, float] | None:
    """P(choice) from the first generated position's top log-probs ``(token text, log-prob)``,
    normalised over the choices.

    A token counts for a choice when its text (stripped, lower-cased) is a non-empty prefix of the
    choice; one that begins several choices ("yes" of yes / yesterday) cannot tell them apart, so its
    mass is shared among them evenly, whatever their order. ``fragments``: (choice, log-prob) of a
    choice's own first token that decodes to no text (a byte of a non-Latin character). Raw log-probs
    are taken before the guided-decoding mask, so they reflect the model.
    """
    mass = dict.fromkeys(choices, 0.0)
    for text, logprob in first_token:
        token = (text or "").strip().lower()
        begun = [c for c in choices if token and c.lower().startswith(token)]
        for choice in begun:
            mass[choice] += math.exp(logprob) / len(begun)
    for choice, logprob in fragments:
        mass[choice] += math.exp(logprob)
    total = sum(mass.values())
    return {c: m / total for c, m in mass.items()} if total > 0 else None
