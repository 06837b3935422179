"""How a streaming replica groups its finished results into chunks (actors/streaming_generator.py), without a
model: README "results that finish within 10 ms travel together"."""

import asyncio
from types import SimpleNamespace

import pytest

from actors import streaming_generator
from actors.streaming_generator import StreamingReplica, finished_chunks


class Arrivals(asyncio.Queue):
    """The queue of finished results, each put on it at its time on a clock that runs only while
    finished_chunks waits: in its sleep, and in a get on an empty queue (to the next arrival)."""

    def __init__(self, arrivals: list[tuple[float, str]]):
        super().__init__()
        self.now, self.arrivals = 0.0, sorted(arrivals)
        self.advance(0.0)

    def advance(self, to: float) -> None:
        self.now = to
        while self.arrivals and self.arrivals[0][0] <= self.now:
            self.put_nowait(self.arrivals.pop(0)[1])

    async def get(self):
        if self.empty() and self.arrivals:
            self.advance(self.arrivals[0][0])
        return await super().get()

    async def sleep(self, seconds: float) -> None:
        self.advance(self.now + seconds)


def chunks(arrivals: list[tuple[float, str]], monkeypatch) -> list[list[str]]:
    done = Arrivals(arrivals)
    monkeypatch.setattr(streaming_generator, "asyncio", SimpleNamespace(sleep=done.sleep))

    async def collect():
        return [chunk async for chunk in finished_chunks(done, len(arrivals), StreamingReplica.chunk_s)]

    return asyncio.run(collect())


def test_results_queued_at_once_travel_as_one_chunk():
    async def collect():
        done = asyncio.Queue()
        for result in ("a", "b", "c"):
            done.put_nowait(result)
        return [chunk async for chunk in finished_chunks(done, 3, StreamingReplica.chunk_s)]

    assert asyncio.run(collect()) == [["a", "b", "c"]]


@pytest.mark.parametrize("arrivals, expected", [
    ([(0.0, "a"), (0.0, "b"), (0.0, "c")], [["a", "b", "c"]]),
    ([(0.0, "a"), (0.005, "b")], [["a", "b"]]),  # within 10 ms of the first: together
    ([(0.0, "a"), (0.05, "b")], [["a"], ["b"]]),  # 50 ms apart: each as it finished
    ([(0.0, "a"), (0.009, "b"), (0.015, "c"), (0.02, "d")], [["a", "b"], ["c", "d"]]),  # 10 ms from each chunk's first
])
def test_results_that_finish_within_10_ms_of_a_chunks_first_travel_with_it_and_later_ones_in_the_next(
        arrivals, expected, monkeypatch):
    assert chunks(arrivals, monkeypatch) == expected
