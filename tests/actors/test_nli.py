"""NLI cross-encoder actor on tiny random-weight models built here (no NLI weights exist offline)."""

import numpy as np
import pytest

from actors.nli import NLICrossEncoder, entailment_column
from schemas.records import Entail


def tiny_model(path, num_labels, id2label=None):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from jobs.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("all-minilm-l6-v2"))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=num_labels, **({"id2label": id2label} if id2label else {}))
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_entailment_column_is_found_by_name():
    assert entailment_column({0: "contradiction", 1: "entailment", 2: "neutral"}) == 1
    assert entailment_column({0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"}) == 0
    assert entailment_column({0: "LABEL_0"}) is None
    with pytest.raises(ValueError, match="have no 'entailment'"):
        entailment_column({0: "LABEL_0", 1: "LABEL_1"})


@pytest.mark.model
def test_three_way_nli_gives_the_softmax_probability_of_entailment(tmp_path):
    from sentence_transformers import CrossEncoder

    path = tiny_model(tmp_path / "nli", 3, {0: "contradiction", 1: "entailment", 2: "neutral"})
    nli = NLICrossEncoder(path, batch_size=2, device="cpu")
    requests = [Entail("Paris is the capital of France.", "France's capital is Paris."),
                Entail("Bananas are yellow.", "The sky is green."), Entail("a", "b")]
    out = nli.entail(requests)
    expected = CrossEncoder(path, device="cpu").predict([(r.premise, r.hypothesis) for r in requests], apply_softmax=True)
    np.testing.assert_allclose([e.p_entail for e in out], expected[:, 1], rtol=1e-4)
    assert nli.entail([]) == []


@pytest.mark.model
def test_single_output_models_are_read_as_a_sigmoid_probability(tmp_path):
    import torch
    from sentence_transformers import CrossEncoder

    path = tiny_model(tmp_path / "one", 1)
    nli = NLICrossEncoder(path, device="cpu")
    requests = [Entail("premise", "hypothesis"), Entail("Paris is in France.", "The sky is green.")]
    out = nli.entail(requests)
    logits = CrossEncoder(path, device="cpu").predict([(r.premise, r.hypothesis) for r in requests],
                                                      activation_fn=torch.nn.Identity())
    np.testing.assert_allclose([e.p_entail for e in out], 1 / (1 + np.exp(-np.asarray(logits))), rtol=1e-4)


def test_run_metadata_names_what_verified_entailment():
    from jobs.identity import entailment_name
    from strategies.registry import AnswerConfig

    assert entailment_name(AnswerConfig(strategies=["rag"])) is None
    assert entailment_name(AnswerConfig(strategies=["migres"])).startswith("judge")
    assert entailment_name(AnswerConfig(strategies=["migres"], nli={"model": "cross-encoder/nli-deberta-v3-base"})) == \
        "nli-cross-encoder:cross-encoder/nli-deberta-v3-base"


@pytest.mark.model
@pytest.mark.ray
def test_the_engine_routes_entail_requests_to_nli_actors(ray_session, tmp_path):
    from engine.loop import Engine
    from engine.stages import NLIStage
    from schemas.config import EngineConfig, StageBatching
    from schemas.records import Question
    from strategies.base import Ask, Done

    class Verify:
        name, stages = "verify", frozenset({"nli"})

        def start(self, item):
            return Ask([Entail("Paris is in France.", item.question)])

        def resume(self, item, responses):
            return Done(f"{responses[0].p_entail:.6f}", "nli", error=responses[0].error)

    path = tiny_model(tmp_path / "nli", 3, {0: "entailment", 1: "neutral", 2: "contradiction"})
    actor = ray_session.remote(NLICrossEncoder).options(num_cpus=0).remote(path, 8, 128, "cpu")
    rows = []
    Engine({"nli": NLIStage([actor], StageBatching(max_batch=4))}, {"verify": Verify()}, EngineConfig(), rows.append).run(
        [Question(f"q{i}", f"Hypothesis {i}.") for i in range(6)], ["verify"])
    direct = NLICrossEncoder(path, device="cpu").entail([Entail("Paris is in France.", f"Hypothesis {i}.") for i in range(6)])
    by_id = {r["id"]: float(r["answer"]) for r in rows}
    assert [by_id[f"q{i}"] for i in range(6)] == pytest.approx([e.p_entail for e in direct], abs=1e-5)
    assert all(r["error"] is None for r in rows)


def test_a_relevance_model_or_a_folder_without_a_trained_head_is_refused_as_nli_before_its_pool_is_planned(tmp_path):
    """A bi-encoder M_rel (random head) and a cross-encoder M_rel (`ragsift train relevance`'s, a
    relevance logit) were read as P(entailment): meaningless verification of MIGRES's statements."""
    import json

    from jobs.pools import pool_plan
    from schemas.errors import UserError
    from strategies.registry import AnswerConfig

    def folder(name, architectures, card=None):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": architectures}))
        if card:
            (tmp_path / name / "card.json").write_text(json.dumps(card))
        return str(tmp_path / name)

    bi = folder("m_rel", ["BertModel"], {"model": "relevance (M_rel) bi-encoder", "architecture": "bi-encoder"})
    (tmp_path / "m_rel" / "relevance_logit.json").write_text('{"scale": 5.0, "bias": -2.0}')
    ce = folder("m_rel_ce", ["BertForSequenceClassification"], {"model": "relevance (M_rel) cross-encoder",
                                                                "architecture": "cross-encoder"})
    for model, why in ((bi, "`ragsift train relevance` wrote it"), (ce, "`ragsift train relevance` wrote it"),
                       (folder("plain", ["BertModel"]), "no trained classification head")):
        with pytest.raises(UserError, match=f"nli.model {model}: .*{why}"):
            pool_plan(AnswerConfig(strategies=["migres"], nli={"model": model}), {"nli"})
        with pytest.raises(UserError, match=why):
            NLICrossEncoder(model, device="cpu")  # a replica started some other way
    one = folder("one", ["BertForSequenceClassification"])  # a single-output NLI model of one's own: served
    assert pool_plan(AnswerConfig(strategies=["migres"], nli={"model": one}), {"nli"})["nli"].actor is NLICrossEncoder
