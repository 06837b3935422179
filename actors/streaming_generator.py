"""Generator replica, streaming kind: one ``vllm.AsyncLLM`` (continuous batching).

Requests go into the engine as soon as they arrive, and each result comes back as soon as its own
sequence finishes, not when the longest one of its batch does. ``stream`` is a Ray streaming method:
the driver gets chunks of ``(index, result)`` while the rest of the call still runs.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from actors.generator import Prompts, configure, engine_arguments
from schemas.records import Generate, Generation, Judge, Judgment


class StreamingReplica:
    """What both streaming kinds share: ``stream`` runs ``_one`` for every request of a call at once and
    yields results as they finish; ``_one`` puts ``(index, result or exception)`` on the queue."""

    chunk_s = 0.01

    async def stream(self, requests: list[Generate | Judge]):
        """Yield lists of ``(index in requests, result)`` as results finish. Results that finish
        within ``chunk_s`` of each other travel together, so a busy replica sends few large chunks."""
        done: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self._one(i, req, done)) for i, req in enumerate(requests)]
        try:
            async for chunk in finished_chunks(done, len(requests), self.chunk_s):
                failed = [r for _, r in chunk if isinstance(r, BaseException)]
                if failed:
                    raise failed[0]
                yield chunk
        finally:
            for task in tasks:
                task.cancel()  # the driver gave up on this call (or it failed): free the replica's slots

    async def generate(self, requests: list[Generate | Judge]) -> list[Generation | Judgment]:
        """The batch kind's call, for callers that want every result at once (benchmarks, warm-up)."""
        results: list = [None] * len(requests)
        async for chunk in self.stream(requests):
            for i, result in chunk:
                results[i] = result
        return results

    async def _one(self, index: int, req: Generate | Judge, done: asyncio.Queue) -> None:
        raise NotImplementedError


class StreamingGenerator(StreamingReplica):
    def __init__(self, llm: dict, sampling: dict, chunk_s: float = 0.01):
        configure(llm)
        # AsyncLLM always runs vLLM's engine core in a process of its own (vLLM has no in-process async
        # engine); Ray kills a dead worker's child processes, and _engine_died ends this actor with it.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from actors.engine_stats import EngineStats

        self.stats = EngineStats()  # vLLM's own step statistics (KV usage, preemptions, TTFT), no log lines
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_arguments(llm), disable_log_stats=True),
                                                stat_loggers=[lambda config, index: self.stats])
        self.prompts = Prompts(self.engine.get_tokenizer(), llm["max_model_len"], sampling)
        self.prompts.check_template()
        self.chunk_s = chunk_s
        self.ids = itertools.count()

    def kv_capacity(self) -> int:
        """Tokens the KV cache holds: the driver keeps about this much work in flight per replica."""
        cache = self.engine.vllm_config.cache_config
        return int(cache.num_gpu_blocks or 0) * int(cache.block_size)

    def engine_stats(self) -> dict:
        """vLLM's statistics of this replica since it started (metrics.json, per LLM stage)."""
        return self.stats.summary()

    def shutdown(self) -> None:
        """End vLLM's engine core process and wait for it (killed with this actor instead, it outlived the
        job by up to half a minute under load, holding its memory while the next job loaded a model)."""
        self.engine.shutdown()

    async def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (benchmarks compare runs from the same cold state)."""
        await self.engine.reset_prefix_cache()

    async def _one(self, index: int, req: Generate | Judge, done: asyncio.Queue) -> None:
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            prepared = self.prompts.prepare(req)
            if isinstance(prepared, (Generation, Judgment)):
                await done.put((index, prepared))
                return
            prompt, params = prepared
            params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it ends
            final = None
            async for final in self.engine.generate(prompt, params, request_id=str(next(self.ids))):
                pass
            await done.put((index, self.prompts.result(req, final)))
        except asyncio.CancelledError:
            raise
        except EngineDeadError:
            _engine_died()
        except Exception as err:  # noqa: BLE001 - the call fails; the driver retries it, isolating the cause
            await done.put((index, err))


async def finished_chunks(done: asyncio.Queue, n: int, chunk_s: float):
    """Yield the ``n`` results put on ``done`` as lists; results that finish within ``chunk_s`` of
    each other travel together, so a busy replica sends few large chunks."""
    while n:
        chunk = [await done.get()]
        await asyncio.sleep(chunk_s)
        while not done.empty():
            chunk.append(done.get_nowait())
        n -= len(chunk)
        yield chunk


def _engine_died() -> None:
    """vLLM's engine core is gone and an AsyncLLM never recovers: end the process so that Ray
    restarts the replica (the driver retries its calls elsewhere meanwhile)."""
    os._exit(1)
