"""Reranker replica: one sentence-transformers ``CrossEncoder``; (query, texts) requests in, rankings out.

Used by the ``ranker`` stage when ``reranker.model`` is set; without one the stage ranks with the
embedder (bi-encoder cosine, ``Encoder.rank``) and the run metadata says so.
"""

from __future__ import annotations

import numpy as np

from schemas.records import Rank, Ranking


class CrossEncoderRanker:
    def __init__(self, model: str, batch_size: int = 32, max_length: int = 512, device: str | None = None):
        import torch
        from sentence_transformers import CrossEncoder


        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = CrossEncoder(model, max_length=max_length, device=device)
        self.batch_size = batch_size

    def rank(self, requests: list[Rank]) -> list[Ranking]:
        """All (query, text) pairs of the batch in one ``predict`` call; raw scores (logits), best first."""
        import torch

        pairs = [(r.query, t) for r in requests for t in r.texts]
        # logits, whatever the model's default activation (a one-output CrossEncoder applies a sigmoid)
        scores = np.asarray(self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                               activation_fn=torch.nn.Identity())
                            if pairs else [], dtype=np.float32).reshape(-1)
        out, offset = [], 0
        for r in requests:
            mine = scores[offset: offset + len(r.texts)]
            offset += len(r.texts)
            best = np.argsort(-mine, kind="stable")[: r.top]
            out.append(Ranking([int(i) for i in best], [float(mine[i]) for i in best]))
        return out
