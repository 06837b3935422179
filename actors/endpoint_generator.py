"""Generator replica, endpoint kind: a client of an OpenAI-compatible server (a `vllm serve`, a hosted
API, a teacher model) in place of a local vLLM engine.

It speaks the streaming kind's protocol (``stream``, ``generate``, ``kv_capacity``, ``engine_stats``),
so the engine feeds it as it feeds an AsyncLLM: requests go out as strategies ask them, up to
``max_concurrency`` at once, and each result comes back when its own response does. Retries with
backoff on 429 / 5xx are the openai client's; a request the server refuses (400: too long, a bad
schema) is that request's error result, never a failed call that would take its neighbours along.

The server applies the chat template and tokenizes the prompt, not ragsift: a special token's string in a
question or passage (``<|im_end|>``) is sent as it is, and a server that reads such strings as control
tokens (a ``vllm serve`` does) lets that text end its turn. Local replicas tokenize it as text
(actors/chat_tokens.py); the chat completions API has no way to ask for that.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections import Counter, deque

from actors.generator import JUDGE_LOGPROBS, choice_probs
from actors.streaming_generator import StreamingReplica
from schemas.records import Generate, Generation, Judge, Judgment, as_choice, failed

# statuses the openai client retries itself; one still failing after its retries fails the call
RETRIED = {408, 409, 429}
# the endpoint's settings, not a request, are wrong (a key, the served model's name): every request
# would be refused alike, so the call fails and the engine stops the stage rather than write error rows
SETTINGS = {401, 403, 404}
# a replica never has more requests in flight than its pool has connections (``slots``), so a healthy pool
# hands one out at once; waiting this long means cancelled requests leaked the pool's connections
# (httpcore#1093: it stays full, every request then timed out, until the watchdog restarted the replica)
POOL_TIMEOUT_S = 10.0


class EndpointError(RuntimeError):
    """A failed endpoint call, as text: the openai client's errors hold their httpx response and do not
    pickle, so Ray handed the driver an UnserializableException in their place (a RayTaskError no more:
    a wrong key never stopped the stage, and every row's error lost the "401" in a cut-off traceback)."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code

    def __reduce__(self):
        return type(self), (str(self), self.status_code)

    @property
    def stops_the_stage(self) -> bool:
        """A refused key, model name or URL: every request would fail alike, however often retried."""
        return self.status_code in SETTINGS

    @classmethod
    def of(cls, err: BaseException) -> EndpointError:
        return cls(f"{type(err).__module__}.{type(err).__name__}: {err}"[:1000], getattr(err, "status_code", None))


class EndpointGenerator(StreamingReplica):
    def __init__(self, llm: dict, sampling: dict, chunk_s: float = 0.01):
        ep = llm["endpoint"]
        self.base_url, self.model, self.seed = ep["base_url"], llm["model"], llm["seed"]
        self.max_model_len, self.sampling = llm["max_model_len"], sampling
        self.max_concurrency, self.vllm_extensions = ep["max_concurrency"], ep["vllm_extensions"]
        self.statuses: Counter[str] = Counter()  # every HTTP response, retries included
        self.latency_s: deque[float] = deque(maxlen=10_000)
        self.endpoint, self.client, self.new_clients = ep, self.connect(ep), 0
        self.closing: set[asyncio.Task] = set()  # replaced clients being closed
        self.slots = asyncio.Semaphore(ep["max_concurrency"])
        self.pace = Pace(ep["requests_per_second"])
        self.chunk_s = chunk_s
        self.ids = itertools.count()

    def connect(self, ep: dict):
        """An openai client with a pool of its own."""
        import httpx
        from openai import AsyncOpenAI

        async def count(response):
            # a response counts once its body came: a connection dropped after a 200's headers counted as a 200
            try:
                await response.aread()
            except httpx.TransportError:
                self.statuses["connection error"] += 1
                raise  # as the client's own read would: retried as a lost connection
            self.statuses[str(response.status_code)] += 1

        key = os.environ.get(ep["api_key_env"]) if ep["api_key_env"] else None
        timeout = httpx.Timeout(ep["timeout_s"], pool=min(ep["timeout_s"], POOL_TIMEOUT_S))
        return AsyncOpenAI(
            base_url=ep["base_url"], api_key=key or "EMPTY", max_retries=ep["max_retries"], timeout=timeout,
            default_headers={k: os.path.expandvars(v) for k, v in ep["headers"].items()},
            http_client=httpx.AsyncClient(event_hooks={"response": [count]},
                                          limits=httpx.Limits(max_connections=ep["max_concurrency"])))

    def kv_capacity(self) -> int:
        """The tokens the driver may keep in flight here is twice this: a full-length request for every
        concurrent slot (the server's own KV cache is not ours to know; the semaphore is the real limit)."""
        return self.max_concurrency * self.max_model_len

    def engine_stats(self) -> dict:
        lat = sorted(self.latency_s)
        pct = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)) if lat else (lambda q: None)
        return {"endpoint": self.base_url, "http_status": dict(sorted(self.statuses.items())),
                "latency_s": {"p50": pct(0.5), "p90": pct(0.9), "max": lat[-1] if lat else None},
                "new_clients": self.new_clients}

    async def reset_prefix_cache(self) -> None:
        """Nothing to forget here: the server's prefix cache is the server's."""

    async def _one(self, index: int, req: Generate | Judge, done: asyncio.Queue) -> None:
        import httpx
        import openai

        client = None
        try:
            async with self.slots:
                await self.pace.wait()
                started, client = time.perf_counter(), self.client
                response = await client.chat.completions.create(**self.body(req))
                self.latency_s.append(time.perf_counter() - started)
            await done.put((index, self.result(req, response)))
        except asyncio.CancelledError:
            raise
        except openai.APIStatusError as err:
            if err.status_code >= 500 or err.status_code in RETRIED | SETTINGS:
                await done.put((index, EndpointError.of(err)))  # the server's trouble, not this request's: the call fails
            else:
                failure = f"endpoint refused the request ({err.status_code}): {err.message[:300]}"
                await done.put((index, failed(req, failure)))
        except Exception as err:  # noqa: BLE001 - lost connection, timeout: the call fails and the engine retries
            if isinstance(err.__cause__, httpx.PoolTimeout) and client is self.client:
                # the leaked pool never mends: later requests get a new one; the old one's requests in flight end
                # within timeout_s, and then its sockets, the leaked ones too, are closed
                self.client, self.new_clients = self.connect(self.endpoint), self.new_clients + 1
                asyncio.get_running_loop().call_later(self.endpoint["timeout_s"], self._close_later, client)
            await done.put((index, EndpointError.of(err)))

    def _close_later(self, client) -> None:
        self.closing.add(task := asyncio.ensure_future(client.close()))  # held until done: a task may be collected
        task.add_done_callback(self.closing.discard)

    def body(self, req: Generate | Judge) -> dict:
        """The chat completion request: the batch kind's sampling, in the OpenAI API's words."""
        body = dict(model=self.model, messages=req.as_chat(), seed=self.seed)
        if isinstance(req, Judge):
            body.update(temperature=0.0, max_tokens=req.max_tokens,
                        logprobs=True, top_logprobs=JUDGE_LOGPROBS)
            if self.vllm_extensions:
                body["extra_body"] = {"structured_outputs": {"choice": list(req.choices)}}
            return body
        body.update(temperature=self.sampling["temperature"], top_p=self.sampling["top_p"],
                    max_tokens=req.budget(self.sampling["max_tokens"]))
        if req.json_schema:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": json.loads(req.json_schema)}}
        return body

    @classmethod
    def result(cls, req: Generate | Judge, response) -> Generation | Judgment:
        try:
            return cls._result(req, response)
        # a 200 of another shape (or a log-prob no model gives, > 0: exp() overflows): this request's error
        except (IndexError, AttributeError, TypeError, ValueError, OverflowError) as err:
            return failed(req, f"the endpoint's response has another shape ({type(err).__name__}: {err})")

    @staticmethod
    def _result(req: Generate | Judge, response) -> Generation | Judgment:
        choice = response.choices[0]
        text = choice.message.content or ""
        usage = response.usage
        if choice.message.content is None or choice.finish_reason == "content_filter":
            # no text is not an answer (a content filter, a refusal): an error row, never cached as an answer
            return failed(req, f"the endpoint returned no content (finish_reason {choice.finish_reason!r})")
        n_prompt = (usage.prompt_tokens or 0) if usage else 0
        n_completion = (usage.completion_tokens or 0) if usage else 0
        details = getattr(usage, "prompt_tokens_details", None)
        cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
        if isinstance(req, Judge):
            content = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
            top = [(t.token, t.logprob) for t in content[0].top_logprobs or []] if content else []
            probs = choice_probs(top, req.choices)
            # without guided choice (vllm_extensions: false, or a server that ignores it) the text may be
            # "Yes." or no choice at all: the label is a choice, or the judgment is an error, never a "no"
            label = as_choice(text, req.choices) or (max(probs, key=probs.get) if probs else None)
            if label is None:
                return Judgment("", error=f"the endpoint answered {text.strip()[:100]!r}, none of {list(req.choices)}, "
                                          "with no log-probs of them")
            return Judgment(label, probs, n_prompt, n_completion, cached_tokens=cached)
        return Generation(text, n_prompt, n_completion, cached_tokens=cached, finish_reason=choice.finish_reason)


class Pace:
    """At most ``per_second`` request starts a second (None: no limit), spaced evenly."""

    def __init__(self, per_second: float | None):
        self.interval = 1.0 / per_second if per_second else 0.0
        self.next_start = 0.0
        self.lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self.lock:
            now = time.monotonic()
            start = max(now, self.next_start)
            self.next_start = start + self.interval
        await asyncio.sleep(start - now)
