"""CrossEncoder reranker actor (a tiny random-weight model built here: no reranker weights exist
offline) and the run metadata naming what the ranker stage really is."""

import numpy as np
import pytest

from actors.reranker import CrossEncoderRanker
from jobs.identity import ranker_name
from schemas.records import Rank
from strategies.registry import AnswerConfig


def tiny_bert(path, num_labels: int) -> str:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from jobs.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("all-minilm-l6-v2"))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, num_labels=num_labels)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("xenc"), 1)


@pytest.mark.model
def test_a_cross_encoder_with_several_outputs_is_refused_as_a_reranker(tmp_path):
    # its N x 3 logits, flattened, were read as one score per text: rankings of the wrong texts
    with pytest.raises(ValueError, match="3 outputs"):
        CrossEncoderRanker(tiny_bert(tmp_path, 3), device="cpu")


@pytest.mark.model
def test_a_bi_encoder_relevance_fit_that_falls_with_the_cosine_is_refused(tmp_path):
    import json
    import shutil

    from actors.reranker import LOGIT, BiEncoderRanker
    from jobs.models import resolve

    model = tmp_path / "m_rel"
    shutil.copytree(resolve("all-minilm-l6-v2"), model)
    (model / LOGIT).write_text(json.dumps({"scale": -3.0, "bias": 1.0}))
    with pytest.raises(ValueError, match="scale -3.0 <= 0"):
        BiEncoderRanker(str(model), device="cpu")


@pytest.mark.model
def test_cross_encoder_ranks_each_request_by_its_predict_scores(tiny_cross_encoder):
    import torch
    from sentence_transformers import CrossEncoder

    ranker = CrossEncoderRanker(tiny_cross_encoder, batch_size=4, device="cpu")
    requests = [Rank("capital of France", ("Paris is in France.", "Bananas are yellow.", "Rome."), 2),
                Rank("who wrote Hamlet", ("Shakespeare wrote plays.",), 1), Rank("empty", (), 3)]
    out = ranker.rank(requests)
    # logits: RA-ISF applies its own sigmoid, MIGRES's delta is on the raw scale
    expected = CrossEncoder(tiny_cross_encoder, device="cpu").predict(
        [(requests[0].query, t) for t in requests[0].texts], activation_fn=torch.nn.Identity())
    assert out[0].indices == list(np.argsort(-expected, kind="stable")[:2])
    np.testing.assert_allclose(out[0].scores, np.sort(expected)[::-1][:2], rtol=1e-4)
    assert out[1].indices == [0] and out[2].indices == []


def test_ranker_fallback_is_named_in_run_metadata():
    assert ranker_name(AnswerConfig()).startswith("bi-encoder-cosine:all-minilm-l6-v2 (fallback")
    configured = AnswerConfig.model_validate({"reranker": {"model": "BAAI/bge-reranker-base"}})
    assert ranker_name(configured) == "cross-encoder:BAAI/bge-reranker-base"


def model_folder(path, architectures: list[str], card: dict | None = None) -> str:
    """A model folder as far as the checks read it: its config.json (and card.json)."""
    import json

    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": architectures}))
    if card:
        (path / "card.json").write_text(json.dumps(card))
    return str(path)


def test_a_folder_without_a_trained_classification_head_is_refused_as_a_reranker_before_its_pool_is_planned(tmp_path):
    """An embedder, or a bi-encoder M_rel without its relevance_logit.json, was served as a cross-encoder
    with a newly initialised, random head, silently, and the metadata called it a cross-encoder."""
    from actors.reranker import ranker_class
    from jobs.models import resolve
    from jobs.pools import pool_plan
    from schemas.errors import UserError

    embedder = model_folder(tmp_path / "plain", ["BertModel"])
    no_logit = model_folder(tmp_path / "m_rel", ["BertModel"], {"model": "relevance (M_rel) bi-encoder",
                                                                "architecture": "bi-encoder"})
    for folder, why in ((embedder, "no trained classification head"), (no_logit, "relevance_logit.json .* is missing"),
                        (resolve("all-minilm-l6-v2"), "no trained classification head")):
        with pytest.raises(UserError, match=f"reranker.model {folder}: .*{why}"):
            pool_plan(AnswerConfig(reranker={"model": folder}), {"ranker"})
        with pytest.raises(UserError, match=why):
            CrossEncoderRanker(folder, device="cpu")  # a replica started some other way
    (tmp_path / "m_know").mkdir()
    (tmp_path / "m_know" / "know.json").write_text("{}")
    with pytest.raises(UserError, match="belongs in know.model"):
        ranker_class(str(tmp_path / "m_know"))
    trained = model_folder(tmp_path / "ce", ["BertForSequenceClassification"], {"architecture": "cross-encoder"})
    assert ranker_class(trained) is CrossEncoderRanker and ranker_class("BAAI/bge-reranker-base") is CrossEncoderRanker


def test_the_fallback_ranker_is_named_by_the_model_that_ranks_the_indexs_embedder_not_embedder_model(tmp_path):
    """The ranker stage's cosine runs on the encoder pool, which loads the index's embedder; metrics.json and
    the calibration record named `embedder.model`, which the run never loaded."""
    import json

    from jobs.calibrate import config_values
    from jobs.index import MANIFEST

    (tmp_path / MANIFEST).write_text(json.dumps({"embedder": "/models/index-embedder", "shards": []}))
    config = AnswerConfig(index={"path": str(tmp_path)}, embedder={"model": "/models/unused"})
    fallback = "bi-encoder-cosine:/models/index-embedder (fallback: no reranker.model configured)"
    assert ranker_name(config) == fallback
    assert config_values(config, {}, None, 0, questions="calib.parquet")["calibration"]["ranker"] == fallback
