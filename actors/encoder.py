"""Encoder replica: one SentenceTransformer; a batch of texts in, unit-norm float32 vectors out."""

from __future__ import annotations

import numpy as np

from schemas.records import Rank, Ranking


class Encoder:
    def __init__(self, model: str, batch_size: int = 64, device: str | None = None, threads: int | None = None):
        import torch
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = SentenceTransformer(model, device=device)
        self.batch_size = batch_size

    def dims(self) -> int:
        return self.model.get_embedding_dimension()

    def encode(self, texts: list[str], role: str | None = None) -> np.ndarray:
        """``role`` "query" or "document": the model's own prompt or route for it, where its config names one
        (e5's "query: ", a query / document Router); encoded alike, such a model's queries were read as
        passages and its recall fell unsaid. A model without them (MiniLM) encodes both as before."""
        encode = {"query": self.model.encode_query, "document": self.model.encode_document}.get(role, self.model.encode)
        return encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        ).astype(np.float32, copy=False)

    def longer_than_read(self, texts: list[str]) -> list[bool]:
        """Which texts are longer than the model reads (its max_seq_length in tokens): encode embeds only
        their start, and says nothing of it."""
        limit = self.model.max_seq_length
        if limit is None:  # a model without a limit (sentence-transformers allows it) reads every text whole
            return [False] * len(texts)
        # cut one past the limit: that says longer, and a passage of megabytes is not tokenized whole (memory)
        lengths = self.model.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=limit + 1,
                                       verbose=False)["input_ids"]
        return [len(ids) > limit for ids in lengths]

    def rank(self, requests: list[Rank]) -> list[Ranking]:
        """Bi-encoder ranking: cosine of each text to its query, one ``encode`` call for the batch's queries and
        one for its texts."""
        queries = self.encode([r.query for r in requests], "query")
        texts = [t for r in requests for t in r.texts]
        vectors = self.encode(texts, "document") if texts else np.zeros((0, queries.shape[1]), np.float32)
        offset, out = 0, []
        for q, r in zip(queries, requests):
            scores = vectors[offset: offset + len(r.texts)] @ q
            offset += len(r.texts)
            best = np.argsort(-scores, kind="stable")[: r.top]
            out.append(Ranking([int(i) for i in best], [float(scores[i]) for i in best]))
        return out
