"""Strategies by name. Each is a pure state machine (see base.py)."""

from jobs.strategies.direct import Direct
from jobs.strategies.rag import RetrieveThenRead

STRATEGIES = {cls.name: cls for cls in (Direct, RetrieveThenRead)}
