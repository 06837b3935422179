"""Encoder replica: one SentenceTransformer; a batch of texts in, unit-norm float32 vectors out."""

from __future__ import annotations

import numpy as np


class Encoder:
    def __init__(self, model: str, batch_size: int = 64, device: str | None = None):
        import torch
        from sentence_transformers import SentenceTransformer

        from jobs.models import resolve

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = SentenceTransformer(resolve(model), device=device)
        self.batch_size = batch_size

    def dims(self) -> int:
        return self.model.get_embedding_dimension()

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        ).astype(np.float32, copy=False)
