"""One registry of strategies: the CLI, config validation, ``compare`` and the answer job read it.

Built-in strategies are listed here; anyone else's register through the ``ragsift.strategies``
entry point group (a package declares ``[project.entry-points."ragsift.strategies"] mine =
"my_package.module:MyStrategy"`` and ``ragsift answer --strategy mine`` runs it). A strategy class
declares what the registry needs (strategies/base.py ``Routine``): its name, its config section,
its stages, whether ``compare`` runs it by default, cross-section checks and retrieval needs.

``AnswerConfig`` is the run config with one section per registered strategy that has one, so a
new strategy's settings validate, layer and fail fast like every other section.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from pydantic import Field, create_model, field_validator, model_validator

from schemas.config import RunConfig
from schemas.errors import UserError
from strategies.calibration_probe import CalibrationProbe
from strategies.direct import Direct
from strategies.least_to_most import LeastToMost
from strategies.migres import MIGRES
from strategies.rag import RetrieveThenRead
from strategies.raisf import RAISF
from strategies.raisf_labels import RaisfLabels
from strategies.self_reasoning import SelfReasoning
from strategies.think_act import ThinkThenAct

ENTRY_POINTS = "ragsift.strategies"
BUILT_IN = (Direct, RetrieveThenRead, RAISF, LeastToMost, SelfReasoning, ThinkThenAct, MIGRES, RaisfLabels,
            CalibrationProbe)


# plugins whose entry point did not load: name -> why (said where a run names an unknown strategy)
NOT_LOADED: dict[str, str] = {}


def _discover() -> dict[str, type]:
    found = {cls.name: cls for cls in BUILT_IN}
    for entry in entry_points(group=ENTRY_POINTS):
        try:
            cls = entry.load()
        except Exception as err:  # noqa: BLE001 - one broken plugin failed every command, built-in strategies too
            NOT_LOADED[entry.name] = f"{entry.value}: {type(err).__name__}: {err}"
            continue
        if cls.name in found and found[cls.name] is not cls:
            raise ValueError(f"strategy {cls.name!r} from entry point {entry.value} is already registered")
        found[cls.name] = cls
    return found


STRATEGIES: dict[str, type] = _discover()
# compare's default: every strategy that answers (label and probe strategies write other rows)
ANSWERING = tuple(name for name, cls in STRATEGIES.items() if cls.answers)


def _known(cls, value: list[str]) -> list[str]:
    unknown = [s for s in value if s not in STRATEGIES]
    if unknown or not value:
        broken = "; ".join(f"{name} ({why})" for name, why in NOT_LOADED.items())
        raise UserError(f"unknown strategy {unknown}; choose from {sorted(STRATEGIES)}"
                        + (f"; strategy plugins that did not load: {broken}" if broken else ""))
    repeated = sorted({s for s in value if value.count(s) > 1})
    if repeated:  # each would answer every question into the same part files: each id twice
        raise UserError(f"strategy {repeated} named more than once")
    return value


def _checked(config):
    for name in config.strategies:
        STRATEGIES[name].check(config)
    return config


AnswerConfig = create_model(
    "AnswerConfig", __base__=RunConfig, __doc__="The run config: RunConfig plus one section per strategy.",
    __validators__={"_known_strategies": field_validator("strategies")(classmethod(_known)),
                    "_strategy_checks": model_validator(mode="after")(_checked)},
    **{cls.name: (cls.Config, Field(default_factory=cls.Config)) for cls in STRATEGIES.values() if cls.Config})


def make_strategy(name: str, config):
    """Strategy ``name`` built from an AnswerConfig (each reads its own section)."""
    return STRATEGIES[name].from_run(config)


def retrieval_methods(config) -> set[str]:
    """Every retrieval method the configured strategies ask for (BM25 shards load only when needed)."""
    methods = {config.retrieval.method}
    for name in config.strategies:
        methods |= STRATEGIES[name].retrieval_methods(config)
    return methods
