"""Strategies by name. Each is a pure state machine (see base.py)."""

from jobs.strategies.base import StrategySettings
from jobs.strategies.direct import Direct
from jobs.strategies.rag import RetrieveThenRead
from jobs.strategies.raisf import RAISF

STRATEGIES = {cls.name: cls for cls in (Direct, RetrieveThenRead, RAISF)}


def make_strategy(name: str, config):
    """Build strategy ``name`` from an AnswerConfig."""
    if name == RAISF.name:
        return RAISF(config.raisf)
    return STRATEGIES[name](StrategySettings(k=config.retrieval.k))
