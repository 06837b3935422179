"""``ragsift train know``: M_know, logistic regression on the embedder's question vectors from
``ragsift label``'s know / unknown labels."""

from __future__ import annotations

import json
import time
from pathlib import Path

from jobs.relevance_pairs import PAIRS
from jobs.storage import read_table
from jobs.train_data import auc, check_output, excluded_ids, held_out, staged, write_card
from schemas.errors import UserError
from schemas.training import KnowTraining


def labels_generator(labels: str) -> str | None:
    """The generator of the label run (its config.yaml), None where it does not say."""
    import yaml

    try:
        recorded = yaml.safe_load((Path(labels) / "config.yaml").read_text())
        return str(recorded["generator"]["model"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def train_know(settings: KnowTraining, log) -> dict:
    """M_know: logistic regression on the embedder's normalised question vectors (actors/know.py)."""
    from sentence_transformers import SentenceTransformer
    from sklearn.linear_model import LogisticRegression

    from actors.know import WEIGHTS
    from jobs.models import resolve

    check_output(settings.output)
    if "://" in settings.labels:  # Path() made s3://b/x s3:/b/x, which nothing reads
        raise UserError(f"--labels {settings.labels}: train reads a label run from a local folder; copy it here first")
    skip = excluded_ids(settings.exclude)
    source = str(Path(settings.labels) / "labels" / "self_knowledge.parquet")
    labelled = read_table(source, ["id", "question", "label"]).to_pylist()
    rows = [r for r in labelled if str(r["id"]) not in skip]
    if not rows:
        raise UserError(f"{source}: no self-knowledge label left to train on")
    train = [r for r in rows if not held_out(r["id"], settings.held_out)]
    test = [r for r in rows if held_out(r["id"], settings.held_out)]
    if {r["label"] for r in rows} != {"know", "unknown"}:
        raise UserError(f"{source}: the training labels need both know and unknown examples")
    if {r["label"] for r in train} != {"know", "unknown"}:
        raise UserError(f"{source}: after the held-out split ({len(test)} of {len(rows)} labels, held_out "
                        f"{settings.held_out}) the training part lacks know or unknown examples: more labels needed")
    encoder = SentenceTransformer(resolve(settings.embedder), device="cpu")
    started = time.perf_counter()
    vectors = encoder.encode([r["question"] for r in rows], batch_size=64, normalize_embeddings=True,
                             show_progress_bar=False)
    encode_s = time.perf_counter() - started
    index = {r["id"]: i for i, r in enumerate(rows)}
    x_train, y_train = vectors[[index[r["id"]] for r in train]], [r["label"] == "know" for r in train]
    classifier = LogisticRegression(C=settings.c, class_weight="balanced", max_iter=2000)
    started = time.perf_counter()
    classifier.fit(x_train, y_train)
    fit_s = time.perf_counter() - started
    metrics = {"train_auc": round(auc(y_train, classifier.predict_proba(x_train)[:, 1].tolist()), 4)}
    if test and len({r["label"] for r in test}) == 2:
        x_test = vectors[[index[r["id"]] for r in test]]
        metrics["held_out_auc"] = round(auc([r["label"] == "know" for r in test],
                                            classifier.predict_proba(x_test)[:, 1].tolist()), 4)
    else:  # the card says why it has no held-out AUC (the README promises one)
        metrics["held_out_auc"] = None
        metrics["held_out_auc_missing"] = (f"the held-out part ({len(test)} labels) does not hold both know and "
                                           "unknown examples")
    metrics.update(encode_questions_per_s=round(len(rows) / encode_s, 1), fit_s=round(fit_s, 2))
    card = {"model": "self-knowledge (M_know) classifier", "embedder": settings.embedder, "labels": source,
            # whose closed-book answers the labels judged: M_know predicts that generator's, no other's
            "labels_generator": labels_generator(settings.labels),
            "excluded": settings.exclude, "excluded_labels_dropped": len(labelled) - len(rows),
            "examples": len(rows), "train": len(train), "held_out": len(test),
            "know_share": round(sum(r["label"] == "know" for r in rows) / len(rows), 4),
            "settings": {"C": settings.c, "class_weight": "balanced", "held_out_share": settings.held_out},
            "metrics": metrics, "input": "question -> P(the generator answers it correctly closed-book)"}
    # written beside the earlier model and renamed into place once whole (cleared first, a failed write left
    # an empty folder), with the relevance pairs it may hold (they were deleted)
    with staged(settings.output, keep=(PAIRS,)) as folder:
        (folder / WEIGHTS).write_text(json.dumps({"embedder": settings.embedder, "coef": classifier.coef_[0].tolist(),
                                                  "intercept": float(classifier.intercept_[0])}))
        write_card(str(folder), card)
    known = sum(r["label"] == "know" for r in train)
    checked = (f"held-out AUC {metrics['held_out_auc']} on {len(test)}" if metrics["held_out_auc"] is not None
                else f"no held-out AUC: {metrics['held_out_auc_missing']}")
    log(f"wrote {settings.output}: {len(train)} training labels ({known / len(train):.1%} know), {checked}")
    return card
