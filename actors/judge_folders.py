"""What a local folder must hold to be served as a cross-encoder judge (``reranker.model``, ``nli.model``).

sentence-transformers loads any BERT folder as a ``CrossEncoder``: one without a trained classification
head (an embedder, a bi-encoder M_rel missing its ``relevance_logit.json``) gets a newly initialised,
random head and scores noise without a word. Such folders are refused here, naming the folder and why,
before a pool is planned (jobs/pools.py) and again as a replica starts. A hub name is not checked: what
it is cannot be read without fetching it.
"""

from __future__ import annotations

import json
from pathlib import Path

from schemas.errors import UserError

CARD = "card.json"  # written by `ragsift train` beside every model it trains
KNOW_WEIGHTS = "know.json"  # a self-knowledge classifier's (actors/know.py), which has no config.json
HEAD = "ForSequenceClassification"  # transformers' classes that carry a classification head


def card_of(folder: Path) -> dict:
    try:
        card = json.loads((folder / CARD).read_text())
    except (OSError, ValueError):
        return {}
    return card if isinstance(card, dict) else {}


def missing_head(folder: Path) -> str | None:
    """Why ``folder`` holds no trained classification head a CrossEncoder would load; None when it does
    (or says nothing either way: a config.json without ``architectures``)."""
    if (folder / KNOW_WEIGHTS).is_file():
        return "it is a self-knowledge classifier (know.json, from `ragsift train know`): it belongs in know.model"
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return "it holds no readable config.json: not a Hugging Face model folder"
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if architectures and not any(str(a).endswith(HEAD) for a in architectures):
        return (f"its config.json names no trained classification head (architectures: {', '.join(architectures)}), "
                "so a cross-encoder would score with a newly initialised, random one; an embedder is not a judge")
    return None


def check_reranker_folder(model: str) -> None:
    """Refuse a folder ``reranker.model`` would serve as a cross-encoder it is not (the bi-encoder case,
    with its relevance_logit.json, never comes here)."""
    folder = Path(model)
    if not folder.is_dir():
        return
    if card_of(folder).get("architecture") == "bi-encoder":
        raise UserError(f"reranker.model {model}: its card.json says `ragsift train relevance` wrote a bi-encoder, but "
                        "relevance_logit.json (the fit of its cosine to a logit) is missing: copy the whole folder, or "
                        "train it again")
    reason = missing_head(folder)
    if reason:
        hint = "" if (folder / KNOW_WEIGHTS).is_file() else " (a bi-encoder M_rel carries relevance_logit.json)"
        raise UserError(f"reranker.model {model}: {reason}{hint}")


def check_nli_folder(model: str) -> None:
    """Refuse a folder ``nli.model`` would read as entailment that is no NLI cross-encoder."""
    folder = Path(model)
    if not folder.is_dir():
        return
    if str(card_of(folder).get("model", "")).startswith("relevance"):
        raise UserError(f"nli.model {model}: its card.json says `ragsift train relevance` wrote it: a relevance judge "
                        "(M_rel), not an entailment model; it belongs in reranker.model")
    reason = missing_head(folder)
    if reason:
        raise UserError(f"nli.model {model}: {reason}; an NLI model is a cross-encoder trained for entailment")
