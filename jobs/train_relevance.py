"""``ragsift train relevance``: M_rel fine-tuned from MiniLM, as a bi-encoder (its cosine turned into a
logit of relevant) or a cross-encoder, scored on held-out questions against the untrained cosine."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from actors.reranker import LOGIT
from jobs.relevance_pairs import PAIRS, collect_pairs, write_pairs
from jobs.train_data import auc, check_output, held_out, staged, write_card
from schemas.errors import UserError
from schemas.training import RelevanceTraining

PROBE_EXAMPLES = 512  # training examples whose loss is measured before and after training


def train_relevance(settings: RelevanceTraining, log) -> dict:
    import torch

    check_output(settings.output)
    pairs, source = collect_pairs(settings, log)
    if settings.mine_only:
        log(f"wrote {write_pairs(pairs, source, settings.output)}: train from it with --pairs (on a GPU, say)")
        return source
    train = [p for p in pairs if not held_out(p["id"], settings.held_out)]
    test = [p for p in pairs if held_out(p["id"], settings.held_out)]
    log(f"{len(train)} pairs to train, {len(test)} held out")
    if len({p["label"] > 0.5 for p in train}) < 2:  # a cross-encoder's loss is 0 on one class: its head stays random
        raise UserError(f"the {len(train)} training pairs are not of both classes: relevance needs relevant and "
                        "irrelevant pairs; nothing was written")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # every core: OMP_NUM_THREADS=1, right for FAISS beside Ray actors, would leave training on one
    torch.set_num_threads(settings.threads or os.cpu_count() or 1)
    bi = settings.architecture == "bi-encoder"
    # the trainer's working folder, outside the model folder it replaces (a killed training left it there, empty)
    work = Path(tempfile.mkdtemp(prefix="ragsift-train-"))
    try:
        return _train(settings, pairs, source, train, test, bi, device, work, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _train(settings: RelevanceTraining, pairs: list[dict], source: dict, train: list[dict], test: list[dict], bi: bool,
           device: str, work: Path, log) -> dict:
    model, trainer = (bi_encoder_trainer if bi else cross_encoder_trainer)(train, settings, device, work)
    examples = len(trainer.train_dataset)
    # the loss a full pass gives the same training examples before and after: a logged loss is one
    # small batch's, which in-batch negatives and batch order move more than an epoch of training does
    probe = trainer.train_dataset.select(range(min(PROBE_EXAMPLES, len(trainer.train_dataset))))
    # the Trainer prints its log dicts to stdout, which every job keeps for its results: they go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        loss_before = round(trainer.evaluate(probe)["eval_loss"], 4)
        started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - started
        loss_after = round(trainer.evaluate(probe)["eval_loss"], 4)
    losses = [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]
    started = time.perf_counter()
    scores = relevance_scores(model, test, bi)
    predict_s = time.perf_counter() - started
    # an AUC needs both classes held out (a small --limit can hold out positives only): without, none
    # is reported, where sklearn's error came before save_pretrained and the trained model was lost
    two_classes = len({p["label"] for p in test}) == 2
    metrics = {"held_out_auc": round(auc([p["label"] for p in test], scores), 4) if two_classes else None,
               "held_out_auc_base_cosine": base_cosine_auc(settings.base, test) if two_classes else None,
               **({} if two_classes else {"held_out_auc_missing": f"the held-out part ({len(test)} pairs) does not "
                                                                  "hold both relevant and irrelevant pairs"}),
               "held_out_pairs": len(test), "train_loss_first": losses[0] if losses else None,
               "train_loss_last": losses[-1] if losses else None, "train_loss_logged": losses,
               "train_loss_before": loss_before, "train_loss_after": loss_after, "loss_probe_examples": len(probe),
               "train_examples": examples, "train_examples_per_s": round(examples * settings.epochs / train_s, 1),
               "predict_pairs_per_s": round(len(test) / predict_s, 1) if test else None,
               "mine_s": source.get("mine_s"), "train_s": round(train_s, 1), "device": device}
    fit = None
    if bi:  # cosine -> a logit of relevant, fitted on the held-out pairs (their AUC is unchanged by it)
        fitted, fitted_scores = (test, scores) if two_classes else (train, relevance_scores(model, train, bi))
        fit = logit_fit(fitted_scores, fitted)
        if fit["scale"] <= 0:  # the reranker refuses such a model; say so now, not at answer time
            raise UserError(f"the trained bi-encoder's cosine falls as relevance rises (fitted scale {fit['scale']:.3g}): "
                            "it did not learn relevance; nothing was written")
    card = {"model": f"relevance (M_rel) {settings.architecture}", "architecture": settings.architecture, "base": settings.base,
            **{k: source[k] for k in ("questions", "index", "excluded", "excluded_questions", "questions_used",
                                      "questions_with_gold_in_index", "datasets", "mining", "excluded_when_training",
                                      "pairs_excluded") if k in source},
            "pairs_file": settings.pairs, "pairs": len(pairs), "positives": int(sum(p["label"] for p in pairs)),
            "held_out_share": settings.held_out,
            "settings": settings.model_dump(include={"epochs", "batch_size", "learning_rate", "max_length", "seed",
                                                     "bf16"}),
            "metrics": metrics,
            "input": ("(question, passage) -> cosine of their vectors -> logit of relevant (scale * cosine + bias, "
                      f"{LOGIT})") if bi else "(question, 'title: text' or 'text') -> logit of relevant"}
    # the folder appears whole or not at all: weights without their logit are no model (refused as a reranker);
    # the old folder goes with what it held besides the pairs it may have been mined into and read from (the
    # trainer's _checkpoints)
    with staged(settings.output, keep=(PAIRS,)) as folder:
        model.save_pretrained(str(folder))
        if fit:
            (folder / LOGIT).write_text(json.dumps(fit))
        write_card(str(folder), card)
    checked = (f"held-out AUC {metrics['held_out_auc']} (the base model's cosine: {metrics['held_out_auc_base_cosine']})"
               if two_classes else f"no held-out AUC: {metrics['held_out_auc_missing']}")
    log(f"wrote {settings.output}: {checked}, loss {loss_before} -> {loss_after} "
        f"(a pass over {len(probe)} training examples), {metrics['train_examples_per_s']} examples/s training")
    return card


def bi_encoder_trainer(train: list[dict], settings: RelevanceTraining, device: str, work: Path):
    """The trainer (not yet run) of MiniLM fine-tuned as a bi-encoder: MultipleNegativesRankingLoss on
    (question, gold passage, one of its hard negatives) triplets, the other passages of the batch as
    further negatives. It starts from the cosine it is measured against and improves at once, where a
    cross-encoder's random head needs far more steps than a CPU gives it (BENCHMARKS.md, "Does a relevance judge learn")."""
    import random
    from collections import defaultdict

    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from jobs.models import resolve

    model = SentenceTransformer(resolve(settings.base), device=device)
    model.max_seq_length = settings.max_length
    rng = random.Random(settings.seed)
    negatives = defaultdict(list)
    for p in train:
        if not p["label"]:
            negatives[p["id"]].append(p["passage"])
    data = {"anchor": [], "positive": [], "negative": []}
    for p in train:
        if p["label"] and negatives[p["id"]]:
            data["anchor"].append(p["question"])
            data["positive"].append(p["passage"])
            data["negative"].append(rng.choice(negatives[p["id"]]))
    if not data["anchor"]:
        raise UserError("no training question has both a gold passage and a negative to learn from")
    training = SentenceTransformerTrainingArguments(
        output_dir=str(work), num_train_epochs=settings.epochs, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, warmup_steps=warmup(len(data["anchor"]), settings), seed=settings.seed,
        save_strategy="no", report_to="none", logging_steps=max(1, len(data["anchor"]) // settings.batch_size // 20),
        use_cpu=device == "cpu", bf16=settings.bf16, per_device_eval_batch_size=settings.batch_size,
        batch_sampler=BatchSamplers.NO_DUPLICATES)  # a question's own gold is never an in-batch "negative"
    trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=Dataset.from_dict(data),
                                         loss=MultipleNegativesRankingLoss(model))
    return model, trainer


def warmup(examples: int, settings: RelevanceTraining) -> int:
    """A tenth of the optimizer steps warm the learning rate up, none under ten: a share of 0.1 of one step
    was that step, taken at learning rate 0, and the model written was the base model, unchanged."""
    return int(0.1 * math.ceil(examples / settings.batch_size) * settings.epochs)


def cross_encoder_trainer(train: list[dict], settings: RelevanceTraining, device: str, work: Path):
    """The trainer (not yet run) of a CrossEncoder from the base model (a random head),
    BinaryCrossEntropyLoss with positives weighted up to the negatives; for GPUs, where it can have the
    steps it needs."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    from jobs.models import resolve

    model = CrossEncoder(resolve(settings.base), num_labels=1, max_length=settings.max_length, device=device)
    columns = {"question": [p["question"] for p in train], "passage": [p["passage"] for p in train],
               "label": [p["label"] for p in train]}
    training = CrossEncoderTrainingArguments(
        output_dir=str(work), num_train_epochs=settings.epochs, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, warmup_steps=warmup(len(train), settings), seed=settings.seed,
        save_strategy="no", report_to="none", logging_steps=max(1, len(train) // settings.batch_size // 20),
        dataloader_drop_last=False, use_cpu=device == "cpu", bf16=settings.bf16, per_device_eval_batch_size=settings.batch_size)
    # positives are a minority: weigh them as the negatives per positive, so the loss is balanced
    ratio = (len(train) - sum(columns["label"])) / max(1.0, sum(columns["label"]))
    loss = BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(ratio))
    trainer = CrossEncoderTrainer(model=model, args=training, train_dataset=Dataset.from_dict(columns), loss=loss)
    return model, trainer


def relevance_scores(model, pairs: list[dict], bi: bool) -> list[float]:
    """A trained M_rel's score per (question, passage): the cross-encoder's logit, or the bi-encoder's cosine."""
    if not pairs:
        return []
    if not bi:
        return list(map(float, model.predict([(p["question"], p["passage"]) for p in pairs], batch_size=64,
                                             show_progress_bar=False)))
    # as the ranker stage scores them (actors/encoder.py): the question as a query, the passage as a document
    q = model.encode_query([p["question"] for p in pairs], normalize_embeddings=True, batch_size=64,
                           show_progress_bar=False)
    d = model.encode_document([p["passage"] for p in pairs], normalize_embeddings=True, batch_size=64,
                              show_progress_bar=False)
    return (q * d).sum(axis=1).astype(float).tolist()


def logit_fit(scores: list[float], pairs: list[dict]) -> dict:
    """Logistic regression of relevant on the cosine: P(relevant) = sigmoid(scale * cosine + bias)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    fit = LogisticRegression(C=100.0).fit(np.asarray(scores).reshape(-1, 1), [p["label"] > 0.5 for p in pairs])
    return {"scale": float(fit.coef_[0][0]), "bias": float(fit.intercept_[0]), "fitted_on_pairs": len(pairs)}


def base_cosine_auc(base: str, pairs: list[dict]) -> float:
    """The bar a trained M_rel must clear: the untrained base model's cosine of question and passage
    (as the ranker's fallback scores them) on the same held-out pairs."""
    from sentence_transformers import SentenceTransformer

    from jobs.models import resolve

    model = SentenceTransformer(resolve(base), device="cpu")
    return round(auc([p["label"] for p in pairs], relevance_scores(model, pairs, bi=True)), 4)
