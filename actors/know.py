"""Self-knowledge replica (RA-ISF's M_know as ``ragsift train know`` writes it): the embedder the
classifier was trained on, and a logistic regression over its question vectors. Questions in,
P(the generator answers correctly closed-book) out, as yes / no judgments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from schemas.errors import UserError
from schemas.records import Classify, Judgment

WEIGHTS = "know.json"


class KnowClassifier:
    def __init__(self, model_dir: str, embedder: str, batch_size: int = 64, device: str | None = None):
        """``embedder``: the resolved path of the embedder named in ``know.json`` (checked equal by name)."""
        import torch
        from sentence_transformers import SentenceTransformer

        weights = json.loads((Path(model_dir) / WEIGHTS).read_text())
        self.coef = np.asarray(weights["coef"], dtype=np.float32)
        self.intercept = float(weights["intercept"])
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = SentenceTransformer(embedder, device=device)
        self.batch_size = batch_size

    def classify(self, requests: list[Classify]) -> list[Judgment]:
        if not requests:
            return []
        vectors = self.model.encode([r.text for r in requests], batch_size=self.batch_size,
                                    normalize_embeddings=True, show_progress_bar=False)
        p = 1.0 / (1.0 + np.exp(-(np.asarray(vectors) @ self.coef + self.intercept)))
        return [Judgment("yes" if x >= 0.5 else "no", {"yes": float(x), "no": float(1 - x)}) for x in p]


def embedder_of(model_dir: str) -> str:
    """The embedder a trained classifier's vectors come from (an alias, path or hub name)."""
    try:
        return json.loads((Path(model_dir) / WEIGHTS).read_text())["embedder"]
    except (ValueError, KeyError, TypeError) as err:  # cut short, emptied, or written by hand
        raise UserError(f"know.model {model_dir}: its {WEIGHTS} does not read ({type(err).__name__}: {err}): train "
                        "it again (`ragsift train know`)") from None
    except FileNotFoundError:
        relevance = (Path(model_dir) / "relevance_logit.json").is_file() or (Path(model_dir) / "config.json").is_file()
        raise UserError(f"know.model {model_dir}: no {WEIGHTS} there: not a self-knowledge classifier from `ragsift train "
                        "know`" + ("; it looks like a transformers model (M_rel belongs in reranker.model)"
                                   if relevance else "")) from None
