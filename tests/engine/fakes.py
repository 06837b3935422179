"""Scripted stand-ins for the stage actors (tests only): instant, deterministic, and breakable."""

import os
import time

from schemas.records import Generation, Passage


class FakeGenerator:
    """Echoes the last user message. In a batch, 'POISON' raises, 'KILLME' kills the actor's process,
    'HANG' never returns."""

    def generate(self, batch):
        texts = [r.messages[-1][1] for r in batch]
        if any("KILLME" in t for t in texts):
            os._exit(1)
        if any("HANG" in t for t in texts):
            time.sleep(3600)
        if any("POISON" in t for t in texts):
            raise RuntimeError("replica crashed")
        return [Generation("echo:" + r.messages[-1][1].splitlines()[0], 3, 2) for r in batch]


class ShortGenerator(FakeGenerator):
    """Leaves the last request of a batch holding 'SHORT' unanswered (a replica that breaks the contract)."""

    def generate(self, batch):
        results = super().generate(batch)
        return results[:-1] if any("SHORT" in r.messages[-1][1] for r in batch) else results


class CountingGenerator(FakeGenerator):
    """Says how many requests it computed."""

    calls = 0

    def generate(self, batch):
        self.calls += len(batch)
        return super().generate(batch)

    def count(self):
        return self.calls


class PrefixCachedGenerator(FakeGenerator):
    """Says 2 of each request's 3 prompt tokens were found in its prefix cache, as vLLM does."""

    def generate(self, batch):
        return [Generation(g.text, g.prompt_tokens, g.completion_tokens, cached_tokens=2) for g in super().generate(batch)]


class FakeEncoder:
    def encode(self, texts, role=None):
        return texts


class FakeShard:
    def __init__(self, name):
        self.name = name

    def search(self, queries, k):
        return [[Passage(f"{self.name}-{q}-{i}", "t", "x", float(i + (self.name == "b"))) for i in range(k)]
                for q in queries]


class SlowGenerator(FakeGenerator):
    def __init__(self, delay: float = 0.5):
        self.delay = delay

    def generate(self, batch):
        time.sleep(self.delay)
        return super().generate(batch)


class SlowStartingGenerator(SlowGenerator):
    """Takes seconds to start, as a vLLM replica does: a restart leaves it unavailable for a while."""

    def __init__(self):
        time.sleep(4)
        super().__init__()


class SlowShard(FakeShard):
    def search(self, queries, k):
        time.sleep(0.2)
        return super().search(queries, k)


class FlakyGenerator(SlowGenerator):
    """Fails its first batch (a replica's transient fault), then works."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def generate(self, batch):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("transient fault")
        return super().generate(batch)


class BreaksAfterGenerator(FakeGenerator):
    """Answers its first 40 requests, then raises on every call (a replica gone bad mid-run)."""

    def __init__(self):
        self.answered = 0

    def generate(self, batch):
        if self.answered >= 40:
            raise RuntimeError("device lost")
        self.answered += len(batch)
        return super().generate(batch)


class BadReplicaGenerator(FakeGenerator):
    """A replica made ``bad`` raises on every call at once (its device lost); the others answer, in 0.3 s."""

    def __init__(self, bad: bool = False):
        self.bad = bad

    def generate(self, batch):
        if self.bad:
            raise RuntimeError("device lost")
        time.sleep(0.3)
        return super().generate(batch)


class BrokenGenerator:
    def __init__(self):
        raise OSError("model weights not found")

    def generate(self, batch):
        return []


class DeepErrorGenerator(FakeGenerator):
    """'REJECT' raises from deep in a call, as a library does (vLLM refusing a schema in xgrammar)."""

    def generate(self, batch):
        def deep(n):
            if n == 0:
                raise RuntimeError('Unsupported type "nonsense".\n  See the docs.')
            return deep(n - 1)

        if any("REJECT" in r.messages[-1][1] for r in batch):
            deep(30)
        return super().generate(batch)


class HangsOnceGenerator(FakeGenerator):
    """'HANG' hangs in the first copy of the actor only: the copy Ray restarts (a marker file says so) answers."""

    def __init__(self, marker: str):
        self.marker = marker

    def generate(self, batch):
        if any("HANG" in r.messages[-1][1] for r in batch) and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(3600)
        return [Generation("echo:" + r.messages[-1][1].splitlines()[0], 3, 2) for r in batch]


class UnevenGenerator(FakeGenerator):
    """A request saying SLOW takes 2 s, others 0.05 s: one long sequence in a batch of short ones."""

    def generate(self, batch):
        time.sleep(2.0 if any("SLOW" in r.messages[-1][1] for r in batch) else 0.05)
        return super().generate(batch)


class StreamingFake:
    """The streaming kind of a fake (actors/streaming_generator.py's contract): every request runs on
    its own (``fake``'s behaviour, one request at a time, in threads) and is streamed back as soon as it
    is done; a request that raises ends the call, as an engine failure does."""

    fake = FakeGenerator
    capacity = 100_000

    def __init__(self, *args):
        self.inner = self.fake(*args)

    def kv_capacity(self):
        return self.capacity

    async def stream(self, batch):
        import asyncio

        loop = asyncio.get_running_loop()

        async def one(i, request):
            return i, (await loop.run_in_executor(None, self.inner.generate, [request]))[0]

        for done in asyncio.as_completed([one(i, r) for i, r in enumerate(batch)]):
            yield [await done]


class FirstComeFirstServed(StreamingFake):
    """Serves its calls one after another, a request every 0.6 s, as vLLM's scheduler does when the
    sequences of an earlier call fill the batch: a later call waits for its first result while the
    replica streams the earlier one's."""

    async def stream(self, batch):
        import asyncio

        if not hasattr(self, "turn"):
            self.turn = asyncio.Lock()
        async with self.turn:
            for i, request in enumerate(batch):
                await asyncio.sleep(0.6)
                yield [(i, self.inner.generate([request])[0])]


def streaming(fake: type) -> type:
    return type(f"Streaming{fake.__name__}", (StreamingFake,), {"fake": fake})
