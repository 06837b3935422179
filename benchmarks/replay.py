"""Run a strategy over items in lockstep on one in-process generator, with retrieval replayed.

For choosing a strategy's prompts or answer step on a calibration slice without a full engine run:
every item's requests of one round go to the generator as one batch (``Generate`` / ``Judge``), and
``Retrieve`` is answered by ``retrieve(item, request)`` (e.g. the passages an earlier run retrieved),
so every variant reads the same evidence. No spawning, no other stages.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.steps import Ask, Done, Item
from schemas.records import Generate, Judge, Retrieval, Retrieve


def run(strategy, items: list[Item], generator, retrieve: Callable[[Item, Retrieve], Retrieval]) -> list[Done]:
    """The ``Done`` of every item, in order."""
    steps = [strategy.start(item) for item in items]
    while True:
        open_ = [i for i, s in enumerate(steps) if isinstance(s, Ask)]
        if not open_:
            return steps
        llm = [(i, j, r) for i in open_ for j, r in enumerate(steps[i].requests) if isinstance(r, Generate | Judge)]
        answers = iter(generator.generate([r for _, _, r in llm]))
        responses = {i: [None] * len(steps[i].requests) for i in open_}
        for i, j, _ in llm:
            responses[i][j] = next(answers)
        for i in open_:
            for j, r in enumerate(steps[i].requests):
                if isinstance(r, Retrieve):
                    responses[i][j] = retrieve(items[i], r)
                elif responses[i][j] is None:
                    raise TypeError(f"replay answers Generate, Judge and Retrieve only, not {type(r).__name__}")
            steps[i] = strategy.resume(items[i], responses[i])
        for s in steps:
            if not isinstance(s, Ask | Done):
                raise TypeError(f"replay does not run {type(s).__name__} (sub-questions)")
