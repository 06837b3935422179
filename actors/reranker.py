"""Reranker replica: one sentence-transformers ``CrossEncoder`` (or a trained bi-encoder M_rel);
(query, texts) requests in, rankings out.

Used by the ``ranker`` stage when ``reranker.model`` is set; without one the stage ranks with the
embedder (bi-encoder cosine, ``Encoder.rank``) and the run metadata says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from actors.encoder import Encoder
from actors.judge_folders import check_reranker_folder
from schemas.records import Rank, Ranking

LOGIT = "relevance_logit.json"  # written by `ragsift train relevance` beside a bi-encoder's weights


class CrossEncoderRanker:
    def __init__(self, model: str, batch_size: int = 32, max_length: int = 512, device: str | None = None):
        import torch
        from sentence_transformers import CrossEncoder

        check_reranker_folder(model)  # also planned so (ranker_class); a replica started otherwise checks here
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = CrossEncoder(model, max_length=max_length, device=device)
        if self.model.num_labels != 1:  # its scores would interleave, and rank() would read them as one text each
            raise ValueError(f"reranker.model {model} has {self.model.num_labels} outputs; a reranker scores a pair "
                             "with one relevance logit (an NLI cross-encoder belongs in nli.model)")
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


class BiEncoderRanker(Encoder):
    """A bi-encoder M_rel (``ragsift train relevance``, its default architecture): the cosine of query and
    text through the logistic fit written beside the weights (``relevance_logit.json``), so its scores
    are logits of relevant, as a cross-encoder's are."""

    def __init__(self, model: str, batch_size: int = 32, max_length: int = 512, device: str | None = None):
        super().__init__(model, batch_size, device)
        self.model.max_seq_length = min(max_length, self.model.max_seq_length or max_length)
        fit = json.loads((Path(model) / LOGIT).read_text())
        if fit["scale"] <= 0:  # rank() keeps the top by cosine: a falling fit would keep the least relevant
            raise ValueError(f"{model}/{LOGIT}: scale {fit['scale']} <= 0, so a higher cosine would mean less "
                             "relevant; this model did not learn relevance: retrain it")
        self.scale, self.bias = fit["scale"], fit["bias"]

    def rank(self, requests: list[Rank]) -> list[Ranking]:
        return [Ranking(r.indices, [self.scale * s + self.bias for s in r.scores]) for r in super().rank(requests)]


def ranker_class(model: str) -> type:
    """A directory written by ``ragsift train relevance --architecture bi-encoder`` is served as a
    bi-encoder; a CrossEncoder directory or hub name as a cross-encoder; a folder with no trained
    classification head (an embedder, a bi-encoder missing its logit) is refused, naming why."""
    if (Path(model) / LOGIT).is_file():
        return BiEncoderRanker
    check_reranker_folder(model)
    return CrossEncoderRanker
