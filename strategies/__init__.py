"""Strategies by name. Each is a pure state machine (see base.py)."""

from strategies.base import StrategySettings
from strategies.calibration_probe import CalibrationProbe
from strategies.direct import Direct
from strategies.least_to_most import LeastToMost
from strategies.migres import MIGRES
from strategies.rag import RetrieveThenRead
from strategies.raisf import RAISF
from strategies.raisf_labels import RaisfLabels
from strategies.self_reasoning import SelfReasoning
from strategies.think_act import ThinkThenAct

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
