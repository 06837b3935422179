"""A synchronous, in-process driver for pure strategies, answering requests with a script.

Used only in tests of strategy control flow: ``respond(request, item)`` plays the model and retriever.
"""

from strategies.base import Ask, Done, Item, Spawn


def drive(strategy, question, respond, depth=0, log=None, kind=None):
    """Run one item to Done; returns (Done, item). ``log`` collects (depth, request) in order."""
    log = [] if log is None else log
    item = Item(question, depth=depth, kind=kind)
    step = strategy.start(item)
    while not isinstance(step, Done):
        if isinstance(step, Spawn):
            children = [drive(strategy, q, respond, depth + 1, log)[0] for q in step.questions]
            step = strategy.resume(item, children)
        else:
            assert isinstance(step, Ask) and step.requests
            log.extend((depth, r) for r in step.requests)
            step = strategy.resume(item, [respond(r, item) for r in step.requests])
    return step, item
