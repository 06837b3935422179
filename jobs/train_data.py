"""What a judge model is trained on and how it is reported: questions kept out (the reported slices),
a stable held-out split by question, the held-out AUC, and the model card written beside the weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from jobs.storage import read_table


def excluded_ids(sources: list[str]) -> set[str]:
    """Ids from id-list files (one per line) or question Parquet files (their ``id`` column)."""
    ids: set[str] = set()
    for source in sources:
        if source.endswith(".parquet"):
            ids |= set(read_table(source, ["id"])["id"].to_pylist())
        else:
            ids |= {line.strip() for line in Path(source).read_text().splitlines() if line.strip()}
    return ids


def held_out(qid: str, share: float) -> bool:
    """A stable split by question (never by pair, so no question is on both sides); salted, so that
    it is independent of the plain id hash the DEV slices are ordered by."""
    return int(hashlib.sha256(f"held-out:{qid}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def auc(labels: list[float], scores: list[float]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def write_card(output: str, card: dict) -> None:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.json").write_text(json.dumps(card, indent=2))
    lines = [f"# {card['model']}", "", "Trained by `ragsift train`.", "", "```json", json.dumps(card, indent=2), "```"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
