"""``ragsift train``: real training on tiny data (a few hundred labels), then the models served through
ragsift's actor pools: RA-ISF's trained judges, end to end with the real generator."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from jobs.train_data import auc, held_out
from tests.conftest import IN_BATCH, REPO, SAMPLE_CORPUS, SAMPLE_QUESTIONS

pytestmark = [pytest.mark.model, pytest.mark.timeout(1200)]


def ragsift(*args):
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 0, f"ragsift {args[0]} failed:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An index of the sample's gold passages plus 600 others; M_rel from 180 sample questions, M_know from
    synthetic labels (questions of two datasets 'known'), both written by the CLI."""
    tmp = tmp_path_factory.mktemp("train")
    questions = pq.read_table(SAMPLE_QUESTIONS)
    gold = {g for ids in questions["gold_passage_ids"].to_pylist() for g in ids}
    corpus = pq.read_table(SAMPLE_CORPUS)
    is_gold = pc.is_in(corpus["id"], pa.array(sorted(gold)))
    pq.write_table(pa.concat_tables([corpus.filter(is_gold), corpus.filter(pc.invert(is_gold)).slice(0, 600)]),
                   tmp / "c.parquet")
    ragsift("index", "--corpus", tmp / "c.parquet", "--index-dir", tmp / "idx", "--shards", 1)
    # the last 20 sample questions are never trained on: they are the end-to-end run's questions
    pq.write_table(questions.slice(180, 20), tmp / "held.parquet")
    # 64 tokens (question + passage head): the tests check that training learns, not how well, and on a CPU
    # half the sequence length takes under 60% of the time (115 -> 68 s for this command)
    relevance = ragsift("train", "relevance", "--questions", SAMPLE_QUESTIONS, "--index-dir", tmp / "idx",
            "--output", tmp / "m_rel", "--exclude", tmp / "held.parquet", "--held-out", "0.25",
            "--negatives", "1", "--random-negatives", "2",
            "--batch-size", "16", "--epochs", "1", "--max-length", "64", "--learning-rate", "1e-4")
    (tmp / "relevance.stdout").write_text(relevance.stdout)
    rows = questions.slice(0, 180).to_pylist()
    labels = pa.table({"id": [r["id"] for r in rows], "question": [r["question"] for r in rows],
                       "closed_book_answer": [""] * len(rows), "gold_answers": [r["answers"] for r in rows],
                       "label": ["know" if r["dataset"] in ("strategyqa", "nq") else "unknown" for r in rows]})
    (tmp / "lab" / "labels").mkdir(parents=True)
    pq.write_table(labels, tmp / "lab" / "labels" / "self_knowledge.parquet")
    ragsift("train", "know", "--labels", tmp / "lab", "--output", tmp / "m_know", "--held-out", "0.25")
    return tmp, rows


def test_relevance_training_lowers_the_loss_and_separates_held_out_pairs(trained):
    tmp, _ = trained
    card = json.loads((tmp / "m_rel" / "card.json").read_text())
    m = card["metrics"]
    assert card["excluded_questions"] == 20 and card["questions_used"] == 180 and card["positives"] > 100
    assert m["train_loss_after"] < m["train_loss_before"] and m["loss_probe_examples"] > 50
    assert m["held_out_pairs"] > 50 and m["held_out_auc"] > 0.6
    assert m["held_out_auc_base_cosine"] > 0.5  # the untrained bar the card reports beside it
    assert m["train_examples_per_s"] > 0 and (tmp / "m_rel" / "README.md").exists()


def test_training_keeps_the_trainers_log_lines_off_standard_output(trained):
    """Hugging Face's Trainer printed its log dicts ({'loss': ...}, {'train_runtime': ...}) to stdout, which
    every other job keeps for its results."""
    tmp, _ = trained
    out = (tmp / "relevance.stdout").read_text()
    assert "'loss'" not in out and "train_runtime" not in out and "eval_loss" not in out


def test_the_default_relevance_model_is_a_bi_encoder_with_a_fitted_logit_and_a_cross_encoder_can_be_asked_for(trained):
    from actors.reranker import BiEncoderRanker, CrossEncoderRanker, ranker_class

    tmp, _ = trained
    card = json.loads((tmp / "m_rel" / "card.json").read_text())
    fit = json.loads((tmp / "m_rel" / "relevance_logit.json").read_text())
    assert card["architecture"] == "bi-encoder" and fit["scale"] > 0  # a higher cosine is likelier relevant
    assert ranker_class(str(tmp / "m_rel")) is BiEncoderRanker
    # mined where the index is, trained elsewhere (a GPU machine) from the pairs file alone
    ragsift("train", "relevance", "--questions", SAMPLE_QUESTIONS, "--index-dir", tmp / "idx",
            "--output", tmp / "mined", "--mine-only", "--limit", "40", "--negatives", "1")
    assert sorted(p.name for p in (tmp / "mined").iterdir()) == ["pairs.parquet"]  # mined, nothing trained
    ragsift("train", "relevance", "--pairs", tmp / "mined" / "pairs.parquet", "--output", tmp / "m_rel_ce",
            "--architecture", "cross-encoder", "--held-out", "0.25", "--batch-size", "16", "--max-length", "64")
    ce = json.loads((tmp / "m_rel_ce" / "card.json").read_text())
    assert ce["architecture"] == "cross-encoder" and ce["metrics"]["train_loss_first"] is not None
    # the card names the questions and index the pairs came from, not only the pairs file
    assert ce["questions_used"] == 40 and ce["index"] == str(tmp / "idx") and ce["mining"]["negatives"] == 1
    # a question excluded at training time is dropped from mined pairs too
    first = pq.read_table(tmp / "mined" / "pairs.parquet")["id"][0].as_py()
    (tmp / "drop.txt").write_text(first + "\n")
    ragsift("train", "relevance", "--pairs", tmp / "mined" / "pairs.parquet", "--output", tmp / "m_rel_ce2",
            "--architecture", "cross-encoder", "--exclude", tmp / "drop.txt", "--epochs", "0.1", "--max-length", "64")
    again = json.loads((tmp / "m_rel_ce2" / "card.json").read_text())
    assert again["pairs_excluded"] >= 1 and again["pairs"] == ce["pairs"] - again["pairs_excluded"]
    assert ranker_class(str(tmp / "m_rel_ce")) is CrossEncoderRanker


def test_self_knowledge_training_separates_held_out_questions(trained):
    tmp, _ = trained
    card = json.loads((tmp / "m_know" / "card.json").read_text())
    assert card["examples"] == 180 and card["metrics"]["held_out_auc"] > 0.6


def test_the_trained_models_serve_through_the_actor_pools(trained, ray_session):
    """The served scores separate held-out positives from negatives: M_rel on the ranker stage (CrossEncoder
    actors), M_know on the know stage."""
    from actors.know import KnowClassifier, embedder_of
    from actors.reranker import ranker_class
    from engine.loop import Engine
    from engine.stages import KnowStage, RankerStage
    from jobs.models import resolve
    from schemas.config import EngineConfig, StageBatching
    from schemas.records import Classify, Question, Rank, shown_text

    tmp, rows = trained
    ray = ray_session
    ranker = ray.remote(ranker_class(str(tmp / "m_rel"))).options(num_cpus=0).remote(str(tmp / "m_rel"))
    know = ray.remote(KnowClassifier).options(num_cpus=0).remote(str(tmp / "m_know"),
                                                                 resolve(embedder_of(str(tmp / "m_know"))))
    stages = {"ranker": RankerStage([ranker], StageBatching()), "know": KnowStage([know], StageBatching())}
    corpus = {r["id"]: r for r in pq.read_table(tmp / "c.parquet").to_pylist()}
    test = [r for r in rows if held_out(r["id"], 0.25)]

    class Probe:  # a strategy that asks both pools about its question
        name, stages = "probe", frozenset({"ranker", "know"})

        def start(self, item):
            from strategies.base import Ask
            row = next(r for r in test if r["question"] == item.question)
            gold = [corpus[g] for g in row["gold_passage_ids"] if g in corpus][:1]
            other = [p for p in corpus.values() if p["id"] not in row["gold_passage_ids"]][len(item.question) % 500]
            item.state["texts"] = [shown_text(p["title"], p["text"]) for p in gold + [other]]
            return Ask([Rank(item.question, tuple(item.state["texts"]), 2), Classify(item.question)])

        def resume(self, item, responses):
            from strategies.base import Done
            ranking, judgment = responses
            scores = dict(zip(ranking.indices, ranking.scores))
            return Done(json.dumps({"gold": scores[0], "other": scores[1], "know": judgment.probs["yes"]}), "probe")

    out = []
    Engine(stages, {"probe": Probe()}, EngineConfig(), out.append).run(
        [Question(r["id"], r["question"]) for r in test], ["probe"])
    got = [json.loads(r["answer"]) for r in out]
    labels = [1] * len(got) + [0] * len(got)
    assert auc(labels, [g["gold"] for g in got] + [g["other"] for g in got]) > 0.6
    known = {r["question"]: r["dataset"] in ("strategyqa", "nq") for r in test}
    assert auc([known[r["question"]] for r in out], [g["know"] for g in got]) > 0.6


def test_raisf_answers_with_the_trained_judges(trained):
    tmp, _ = trained
    ragsift("answer", "--questions", tmp / "held.parquet", "--index-dir", tmp / "idx", "--output", tmp / "out",
            "--strategy", "raisf", "--generator", "smollm2-135m-instruct", "--limit", "4",
            "--set", IN_BATCH,
            "--set", "raisf.judges=trained", "--set", f"know.model={tmp / 'm_know'}",
            "--set", f"reranker.model={tmp / 'm_rel'}", "--set", "raisf.d_th=1", "--set", "raisf.max_subquestions=2")
    rows = pq.read_table(tmp / "out" / "raisf").to_pylist()
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    for row in rows:
        trace = json.loads(row["trace"])
        assert trace[0]["step"] == "self_knowledge" and 0 <= trace[0]["p_yes"] <= 1
        relevance = [t for t in trace if t.get("step") == "relevance"]
        assert all(len(t["p_yes"]) == 5 for t in relevance)
    metrics = json.loads((tmp / "out" / "metrics.json").read_text())
    assert metrics["judges"]["self_knowledge"].startswith("trained classifier:")
    assert metrics["stages"]["know"]["calls"] >= 1 and metrics["stages"]["ranker"]["calls"] >= 1
