"""NLI replica: one sentence-transformers ``CrossEncoder`` trained for natural language inference;
(premise, hypothesis) requests in, P(entailment) out. Used by the ``nli`` stage when ``nli.model`` is set."""

from __future__ import annotations

import numpy as np

from actors.judge_folders import check_nli_folder
from schemas.records import Entail, Entailment


def entailment_column(id2label: dict) -> int | None:
    """Which output is 'entailment' (model configs name it differently: ENTAILMENT, entailment, ...);
    None for a single-output model, whose sigmoid score is the probability."""
    if len(id2label) <= 1:
        return None
    for i, label in id2label.items():
        if str(label).lower().startswith("entail"):
            return int(i)
    raise ValueError(f"NLI model labels {dict(id2label)} have no 'entailment': not an NLI cross-encoder?")


class NLICrossEncoder:
    def __init__(self, model: str, batch_size: int = 32, max_length: int = 512, device: str | None = None):
        import torch
        from sentence_transformers import CrossEncoder

        check_nli_folder(model)  # also where the pool is planned; a replica started otherwise checks here
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = CrossEncoder(model, max_length=max_length, device=device)
        self.column = entailment_column(self.model.model.config.id2label)
        self.batch_size = batch_size

    def entail(self, requests: list[Entail]) -> list[Entailment]:
        if not requests:
            return []
        pairs = [(r.premise, r.hypothesis) for r in requests]
        if self.column is None:
            import torch

            probs = np.asarray(self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                                  activation_fn=torch.nn.Sigmoid())).reshape(-1)
        else:
            probs = np.asarray(self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                                  apply_softmax=True))[:, self.column]
        return [Entailment(float(p)) for p in probs]
