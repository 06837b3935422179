"""Typed structured outputs: a pydantic model is the contract of a structured step.

The JSON schema that guides decoding is derived from the model with its fields in declaration
order: under guided decoding the model writes the fields in that order, so the order is part of
the method (Self-Reasoning's relevance before evidence before answer). The output is parsed back
into the same model.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import BaseModel, ValidationError

from strategies.parsing import parse_json_object


def schema_of(model: type[BaseModel]) -> str:
    """The model's JSON schema as a string (hashable, for request deduplication), fields in order."""
    return json.dumps(model.model_json_schema())


def parse_as(model: type[BaseModel], text: str, bound: Callable[[dict], dict] | None = None) -> BaseModel | None:
    """``text`` as an instance of ``model`` (also inside a code fence or surrounding prose), or None;
    ``bound`` brings the object within the schema's bounds first, where a server may not enforce them."""
    obj = parse_json_object(text)
    if obj is None:
        return None
    try:
        return model.model_validate(bound(obj) if bound else obj)
    except ValidationError:
        return None
