"""The encoder replica on the offline MiniLM: queries and passages each in the model's own way."""

import json
import shutil

import numpy as np
import pytest

from actors.encoder import Encoder
from jobs.models import resolve
from schemas.records import Rank

pytestmark = pytest.mark.model


def test_a_model_with_a_query_prompt_gets_it_for_queries_and_minilm_encodes_both_alike(tmp_path):
    """Queries were encoded as passages: a model whose config names a "query" prompt (e5's "query: ") lost
    it, and its recall, unsaid."""
    texts = ["who wrote dune", "Dune is a novel by Frank Herbert."]
    plain = Encoder(resolve("all-minilm-l6-v2"), device="cpu")
    assert np.allclose(plain.encode(texts, "query"), plain.encode(texts), atol=1e-6)
    assert np.allclose(plain.encode(texts, "document"), plain.encode(texts), atol=1e-6)

    prompted = tmp_path / "prompted"
    shutil.copytree(resolve("all-minilm-l6-v2"), prompted)
    settings = prompted / "config_sentence_transformers.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "prompts": {"query": "query: ", "document": ""}}))
    model = Encoder(str(prompted), device="cpu")
    assert np.allclose(model.encode(texts[:1], "query"), plain.encode(["query: who wrote dune"]), atol=1e-6)
    assert np.allclose(model.encode(texts[1:], "document"), plain.encode(texts[1:]), atol=1e-6)
    # the ranker stage's fallback ranks with the same roles: the query prompted, the passages not
    ranking = model.rank([Rank("who wrote dune", tuple(texts[1:]) + ("Paris is in France.",), 2), Rank("q", (), 1)])
    assert ranking[0].indices == [0, 1] and ranking[1].indices == []
    expected = float(plain.encode(texts[1:]) @ plain.encode(["query: who wrote dune"])[0])
    assert ranking[0].scores[0] == pytest.approx(expected, abs=1e-5)
