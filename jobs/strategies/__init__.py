"""Strategies by name. Each is a pure state machine (see base.py)."""

from jobs.strategies.base import StrategySettings
from jobs.strategies.calibration_probe import CalibrationProbe
from jobs.strategies.direct import Direct
from jobs.strategies.least_to_most import LeastToMost
from jobs.strategies.migres import MIGRES
from jobs.strategies.rag import RetrieveThenRead
from jobs.strategies.raisf import RAISF
from jobs.strategies.raisf_labels import RaisfLabels
from jobs.strategies.self_reasoning import SelfReasoning
from jobs.strategies.think_act import ThinkThenAct

STRATEGIES = {cls.name: cls for cls in (Direct, RetrieveThenRead, RAISF, LeastToMost, SelfReasoning, ThinkThenAct, MIGRES,
                                  RaisfLabels, CalibrationProbe)}


def make_strategy(name: str, config):
    """Build strategy ``name`` from an AnswerConfig (each reads its own section)."""
    forms = config.answer_form
    if name == RAISF.name:
        return RAISF(config.raisf, forms)
    if name == RaisfLabels.name:
        return RaisfLabels(config.raisf, forms, config.label.collect)
    if name == LeastToMost.name:
        return LeastToMost(config.least_to_most, forms)
    if name == SelfReasoning.name:
        return SelfReasoning(config.self_reasoning, forms)
    if name == ThinkThenAct.name:
        return ThinkThenAct(config.think_act, forms)
    if name == CalibrationProbe.name:
        return CalibrationProbe(config.raisf, config.think_act, config.migres, forms)
    if name == MIGRES.name:
        return MIGRES(config.migres, nli=config.nli.model is not None, forms=forms)
    return STRATEGIES[name](StrategySettings(k=config.retrieval.k, forms=forms))
