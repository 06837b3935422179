"""Generator replica: one ``vllm.LLM``; a batch of chat requests in, a batch of generations out."""

from __future__ import annotations

import os

from schemas.records import Generate, Generation


class Generator:
    def __init__(self, llm: dict, sampling: dict):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(llm["cpu_kvcache_gib"]))
        from vllm import LLM, SamplingParams

        from jobs.models import resolve

        self.max_model_len = llm["max_model_len"]
        self.llm = LLM(
            model=resolve(llm["model"]),
            dtype=llm["dtype"],
            max_model_len=self.max_model_len,
            enforce_eager=llm["enforce_eager"],
            tensor_parallel_size=llm["tensor_parallel_size"],
            gpu_memory_utilization=llm["gpu_memory_utilization"],
            seed=llm["seed"],
            **llm["engine_kwargs"],
        )
        self.tokenizer = self.llm.get_tokenizer()
        self._params = SamplingParams
        self.sampling = sampling

    def generate(self, requests: list[Generate]) -> list[Generation]:
        """Template and tokenize here so overlong prompts become error results, not a failed batch."""
        from vllm.inputs import TokensPrompt

        results: list[Generation | None] = [None] * len(requests)
        prompts, params, slots = [], [], []
        for i, req in enumerate(requests):
            max_tokens = req.max_tokens or self.sampling["max_tokens"]
            ids = self.tokenizer.apply_chat_template(
                req.as_chat(), tokenize=True, add_generation_prompt=True
            )
            if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
                ids = ids["input_ids"]
            if len(ids) + max_tokens > self.max_model_len:
                results[i] = Generation(
                    "", len(ids), 0,
                    error=f"prompt of {len(ids)} tokens + {max_tokens} exceeds max_model_len {self.max_model_len}",
                )
                continue
            prompts.append(TokensPrompt(prompt_token_ids=list(ids)))
            params.append(self._params(**{**self.sampling, "max_tokens": max_tokens}))
            slots.append(i)
        if prompts:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            for slot, out in zip(slots, outputs):
                completion = out.outputs[0]
                results[slot] = Generation(
                    completion.text, len(out.prompt_token_ids), len(completion.token_ids)
                )
        return results
