"""``ragsift train``: judge models from labelled questions, RA-ISF's own loop (Appendix A: collect,
then train the sub-modules), written as plain model directories that ragsift's actor pools load.

    ragsift train relevance --questions dev.parquet --index-dir idx --output models/m_rel \\
        --exclude results/slices/eval.txt --exclude data/demo/sample_questions.parquet
    ragsift train know --labels runs/labels --output models/m_know --exclude ...

    # mine where the index is, train where the GPU is (the cross-encoder wants a GPU's steps)
    ragsift train relevance --questions dev.parquet --index-dir idx --output pairs --mine-only --exclude ...
    ragsift train relevance --pairs pairs/pairs.parquet --architecture cross-encoder --bf16 --output models/m_rel_ce

relevance (M_rel)  (question, passage) -> relevant, from the offline MiniLM; positives are the
                   questions' gold passages, negatives the non-gold passages BM25 and dense
                   retrieval rank highest (hard negatives) and one easy one. By default MiniLM is
                   fine-tuned as a bi-encoder and a logistic fit turns its cosine into a logit
                   (``relevance_logit.json``); ``--architecture cross-encoder`` trains a
                   CrossEncoder instead (a new head: it needs more steps than a CPU gives, see
                   BENCHMARKS.md; on a GPU it learns in minutes and ranks best). Either serves
                   as ``reranker.model`` (the ranker stage) and RA-ISF's relevance judge.
know (M_know)      question -> will this generator answer correctly closed-book: logistic
                   regression on the embedder's question vectors, from ``ragsift label``'s
                   know / unknown labels; written as a CrossEncoder-free classifier directory.

Questions named by ``--exclude`` (id lists, or question Parquet files) are never trained on: the
reported sample and evaluation slice go there. A held-out share of the remaining questions (by a
hash of the id) gives the figures in the model card (``card.json`` and ``README.md`` beside the
weights: data, counts, settings, held-out metrics, examples/s).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from actors.reranker import LOGIT
from jobs.storage import read_table


def excluded_ids(sources: list[str]) -> set[str]:
    """Ids from id-list files (one per line) or question Parquet files (their ``id`` column)."""
    ids: set[str] = set()
    for source in sources:
        if source.endswith(".parquet"):
            ids |= set(read_table(source, ["id"])["id"].to_pylist())
        else:
            ids |= {line.strip() for line in Path(source).read_text().splitlines() if line.strip()}
    return ids


def held_out(qid: str, share: float) -> bool:
    """A stable split by question (never by pair, so no question is on both sides); salted, so that
    it is independent of the plain id hash the DEV slices are ordered by."""
    return int(hashlib.sha256(f"held-out:{qid}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def mine_pairs(rows: list[dict], index_dir: str, negatives: int, random_negatives: int = 0, depth: int = 30,
               seed: int = 0) -> list[dict]:
    """(question, passage, label) pairs: every gold passage, per retrieval method the ``negatives``
    best-ranked non-gold passages of the top ``depth`` (hard negatives), and ``random_negatives``
    passages that other questions retrieved (easy ones: the model also learns what is off topic)."""
    import random

    from actors.bm25 import BM25Shard
    from actors.encoder import Encoder
    from actors.retriever import ShardRetriever, merge_topk
    from jobs.index import read_manifest
    from jobs.label import passages_by_id
    from jobs.models import resolve

    manifest = read_manifest(index_dir)
    dirs = [str(Path(index_dir) / s["dir"]) for s in manifest["shards"]]
    texts = [r["question"] for r in rows]
    vectors = Encoder(resolve(manifest["embedder"])).encode(texts)
    dense = merge_topk([ShardRetriever(d).search(vectors, depth) for d in dirs], depth)
    bm25 = merge_topk([BM25Shard(d).search(texts, depth) for d in dirs], depth)
    rng = random.Random(seed)
    pool = [p for hits in dense + bm25 for p in hits]  # candidate easy negatives: other questions' hits
    gold_passages = passages_by_id(index_dir, {g for r in rows for g in r["gold_passage_ids"]})
    pairs = []

    def shown(p) -> str:  # with its title or without, at random: the ranker stage also scores bare texts
        return p.shown if rng.random() < 0.5 else p.text

    for row, d, b in zip(rows, dense, bm25):
        gold = set(row["gold_passage_ids"])
        for pid in gold & set(gold_passages):
            p = gold_passages[pid]
            pairs.append({"id": row["id"], "question": row["question"], "passage": shown(p), "label": 1.0})
        retrieved = {p.id for p in b} | {p.id for p in d}
        easy = [p for p in rng.sample(pool, min(len(pool), 4 * random_negatives + 4))
                if p.id not in gold and p.id not in retrieved][:random_negatives]
        seen = set(gold)
        for picked in ([p for p in b if p.id not in gold][:negatives], [p for p in d if p.id not in gold][:negatives],
                       easy):
            for p in [p for p in picked if p.id not in seen]:
                seen.add(p.id)
                pairs.append({"id": row["id"], "question": row["question"], "passage": shown(p), "label": 0.0})
    return pairs


def auc(labels: list[float], scores: list[float]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


PAIRS = "pairs.parquet"  # what `--mine-only` writes and `--pairs` reads


def collect_pairs(args: argparse.Namespace, log) -> tuple[list[dict], dict]:
    """The training pairs and where they came from: mined from ``--questions`` over ``--index-dir``, or
    read back from a ``--mine-only`` run (``--pairs``), whose provenance travels in the file."""
    skip = excluded_ids(args.exclude)
    if args.pairs:
        if args.mine_only:
            raise ValueError("--mine-only mines pairs; --pairs trains from pairs mined earlier: give one of them")
        table = read_table(args.pairs)
        source = json.loads((table.schema.metadata or {}).get(b"ragsift", b"{}"))
        # a question excluded now is dropped, whatever the mining excluded
        pairs = [p for p in table.select(["id", "question", "passage", "label"]).to_pylist() if p["id"] not in skip]
        if args.exclude:
            source = {**source, "excluded_when_training": args.exclude, "pairs_excluded": table.num_rows - len(pairs)}
        log(f"{args.pairs}: {table.num_rows} pairs mined earlier, {len(pairs)} kept")
        return pairs, source
    if not (args.questions and args.index_dir):
        raise ValueError("train relevance needs --questions and --index-dir (to mine pairs) or --pairs")
    rows = [r for r in read_table(args.questions, ["id", "question", "gold_passage_ids", "dataset"]).to_pylist()
            if r["gold_passage_ids"] and r["id"] not in skip]
    if args.per_dataset:
        seen, kept = collections.Counter(), []
        for r in rows:
            seen[r["dataset"]] += 1
            if seen[r["dataset"]] <= args.per_dataset:
                kept.append(r)
        rows = kept
    if args.limit:
        rows = rows[: args.limit]
    if not rows:
        raise ValueError(f"{args.questions}: no question with gold passages left to train on")
    started = time.perf_counter()
    pairs = mine_pairs(rows, args.index_dir, args.negatives, args.random_negatives, seed=args.seed)
    source = {"questions": args.questions, "index": args.index_dir, "excluded": args.exclude,
              "excluded_questions": len(skip), "questions_used": len(rows),
              "datasets": dict(collections.Counter(r["dataset"] for r in rows)),
              "mining": {"negatives": args.negatives, "random_negatives": args.random_negatives, "seed": args.seed},
              "mine_s": round(time.perf_counter() - started, 1)}
    log(f"{len(rows)} questions -> {len(pairs)} pairs ({sum(p['label'] for p in pairs):.0f} positive) "
        f"in {source['mine_s']:.0f} s")
    return pairs, source


def write_pairs(pairs: list[dict], source: dict, output: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(output) / PAIRS
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(pairs).replace_schema_metadata({"ragsift": json.dumps(source)})
    pq.write_table(table, path, compression="zstd")
    return str(path)


def train_relevance(args: argparse.Namespace, log) -> dict:
    import torch

    pairs, source = collect_pairs(args, log)
    if args.mine_only:
        log(f"wrote {write_pairs(pairs, source, args.output)}: train from it with --pairs (on a GPU, say)")
        return source
    train = [p for p in pairs if not held_out(p["id"], args.held_out)]
    test = [p for p in pairs if held_out(p["id"], args.held_out)]
    log(f"{len(train)} pairs to train, {len(test)} held out")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # every core: OMP_NUM_THREADS=1, right for FAISS beside Ray actors, would leave training on one
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    bi = args.architecture == "bi-encoder"
    work = Path(args.output) / "_checkpoints"
    started = time.perf_counter()
    model, trainer, examples = (fit_bi_encoder if bi else fit_cross_encoder)(train, args, device, work)
    train_s = time.perf_counter() - started
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    started = time.perf_counter()
    scores = relevance_scores(model, test, bi)
    predict_s = time.perf_counter() - started
    metrics = {"held_out_auc": round(auc([p["label"] for p in test], scores), 4) if test else None,
               "held_out_auc_base_cosine": base_cosine_auc(args.base, test) if test else None,
               "held_out_pairs": len(test), "train_loss_first": losses[0] if losses else None,
               "train_loss_last": losses[-1] if losses else None,
               "train_examples": examples, "train_examples_per_s": round(examples * args.epochs / train_s, 1),
               "predict_pairs_per_s": round(len(test) / predict_s, 1) if test else None,
               "mine_s": source.get("mine_s"), "train_s": round(train_s, 1), "device": device}
    model.save_pretrained(args.output)
    if bi:  # cosine -> a logit of relevant, fitted on the held-out pairs (their AUC is unchanged by it)
        fitted, fitted_scores = (test, scores) if test else (train, relevance_scores(model, train, bi))
        (Path(args.output) / LOGIT).write_text(json.dumps(logit_fit(fitted_scores, fitted)))
    card = {"model": f"relevance (M_rel) {args.architecture}", "architecture": args.architecture, "base": args.base,
            **{k: source[k] for k in ("questions", "index", "excluded", "excluded_questions", "questions_used",
                                      "datasets", "mining", "excluded_when_training", "pairs_excluded") if k in source},
            "pairs_file": args.pairs, "pairs": len(pairs), "positives": int(sum(p["label"] for p in pairs)),
            "held_out_share": args.held_out,
            "settings": {k: getattr(args, k) for k in ("epochs", "batch_size", "learning_rate", "max_length", "seed",
                                                       "bf16")},
            "metrics": metrics,
            "input": ("(question, passage) -> cosine of their vectors -> logit of relevant (scale * cosine + bias, "
                      f"{LOGIT})") if bi else "(question, 'title: text' or 'text') -> logit of relevant"}
    write_card(args.output, card)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {args.output}: held-out AUC {metrics['held_out_auc']} (the base model's cosine: "
        f"{metrics['held_out_auc_base_cosine']}), loss {metrics['train_loss_first']} -> "
        f"{metrics['train_loss_last']}, {metrics['train_examples_per_s']} examples/s training")
    return card


def fit_bi_encoder(train: list[dict], args, device: str, work: Path):
    """MiniLM fine-tuned as a bi-encoder: MultipleNegativesRankingLoss on (question, gold passage, one of
    its hard negatives) triplets, the other passages of the batch as further negatives. It starts from
    the cosine it is measured against and improves at once, where a cross-encoder's random head needs
    far more steps than a CPU gives it (BENCHMARKS.md, "Does a relevance judge learn")."""
    import random
    from collections import defaultdict

    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from jobs.models import resolve

    model = SentenceTransformer(resolve(args.base), device=device)
    model.max_seq_length = args.max_length
    rng = random.Random(args.seed)
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
        raise ValueError("no training question has both a gold passage and a negative to learn from")
    training = SentenceTransformerTrainingArguments(
        output_dir=str(work), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, warmup_steps=0.1, seed=args.seed, save_strategy="no", report_to="none",
        logging_steps=max(1, len(data["anchor"]) // args.batch_size // 20), use_cpu=device == "cpu", bf16=args.bf16,
        batch_sampler=BatchSamplers.NO_DUPLICATES)  # a question's own gold is never an in-batch "negative"
    trainer = SentenceTransformerTrainer(model=model, args=training, train_dataset=Dataset.from_dict(data),
                                         loss=MultipleNegativesRankingLoss(model))
    trainer.train()
    return model, trainer, len(data["anchor"])


def fit_cross_encoder(train: list[dict], args, device: str, work: Path):
    """A CrossEncoder from the base model (a random head), BinaryCrossEntropyLoss with positives weighted
    up to the negatives; for GPUs, where it can have the steps it needs."""
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    from jobs.models import resolve

    model = CrossEncoder(resolve(args.base), num_labels=1, max_length=args.max_length, device=device)
    columns = {"question": [p["question"] for p in train], "passage": [p["passage"] for p in train],
               "label": [p["label"] for p in train]}
    training = CrossEncoderTrainingArguments(
        output_dir=str(work), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, warmup_steps=0.1, seed=args.seed, save_strategy="no", report_to="none",
        logging_steps=max(1, len(train) // args.batch_size // 20), dataloader_drop_last=False, use_cpu=device == "cpu",
        bf16=args.bf16)
    # positives are a minority: weigh them as the negatives per positive, so the loss is balanced
    ratio = (len(train) - sum(columns["label"])) / max(1.0, sum(columns["label"]))
    loss = BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(ratio))
    trainer = CrossEncoderTrainer(model=model, args=training, train_dataset=Dataset.from_dict(columns), loss=loss)
    trainer.train()
    return model, trainer, len(train)


def relevance_scores(model, pairs: list[dict], bi: bool) -> list[float]:
    """A trained M_rel's score per (question, passage): the cross-encoder's logit, or the bi-encoder's cosine."""
    if not pairs:
        return []
    if not bi:
        return list(map(float, model.predict([(p["question"], p["passage"]) for p in pairs], batch_size=64,
                                             show_progress_bar=False)))
    q = model.encode([p["question"] for p in pairs], normalize_embeddings=True, batch_size=64, show_progress_bar=False)
    d = model.encode([p["passage"] for p in pairs], normalize_embeddings=True, batch_size=64, show_progress_bar=False)
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


def train_know(args: argparse.Namespace, log) -> dict:
    """M_know: logistic regression on the embedder's normalised question vectors (actors/know.py)."""
    from sentence_transformers import SentenceTransformer
    from sklearn.linear_model import LogisticRegression

    from actors.know import WEIGHTS
    from jobs.models import resolve

    skip = excluded_ids(args.exclude)
    source = str(Path(args.labels) / "labels" / "self_knowledge.parquet")
    rows = [r for r in read_table(source, ["id", "question", "label"]).to_pylist() if r["id"] not in skip]
    if not rows:
        raise ValueError(f"{source}: no self-knowledge label left to train on")
    train = [r for r in rows if not held_out(r["id"], args.held_out)]
    test = [r for r in rows if held_out(r["id"], args.held_out)]
    if {r["label"] for r in train} != {"know", "unknown"}:
        raise ValueError(f"{source}: the training labels need both know and unknown examples")
    encoder = SentenceTransformer(resolve(args.embedder), device="cpu")
    started = time.perf_counter()
    vectors = encoder.encode([r["question"] for r in rows], batch_size=64, normalize_embeddings=True,
                             show_progress_bar=False)
    encode_s = time.perf_counter() - started
    index = {r["id"]: i for i, r in enumerate(rows)}
    x_train, y_train = vectors[[index[r["id"]] for r in train]], [r["label"] == "know" for r in train]
    classifier = LogisticRegression(C=args.c, class_weight="balanced", max_iter=2000)
    started = time.perf_counter()
    classifier.fit(x_train, y_train)
    fit_s = time.perf_counter() - started
    metrics = {"train_auc": round(auc(y_train, classifier.predict_proba(x_train)[:, 1].tolist()), 4)}
    if test and len({r["label"] for r in test}) == 2:
        x_test = vectors[[index[r["id"]] for r in test]]
        metrics["held_out_auc"] = round(auc([r["label"] == "know" for r in test],
                                            classifier.predict_proba(x_test)[:, 1].tolist()), 4)
    metrics.update(encode_questions_per_s=round(len(rows) / encode_s, 1), fit_s=round(fit_s, 2))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / WEIGHTS).write_text(json.dumps({"embedder": args.embedder, "coef": classifier.coef_[0].tolist(),
                                           "intercept": float(classifier.intercept_[0])}))
    card = {"model": "self-knowledge (M_know) classifier", "embedder": args.embedder, "labels": source,
            "excluded": args.exclude, "examples": len(rows), "train": len(train), "held_out": len(test),
            "know_share": round(sum(r["label"] == "know" for r in rows) / len(rows), 4),
            "settings": {"C": args.c, "class_weight": "balanced", "held_out_share": args.held_out},
            "metrics": metrics, "input": "question -> P(the generator answers it correctly closed-book)"}
    write_card(args.output, card)
    log(f"wrote {args.output}: {len(train)} training labels ({card['know_share']:.1%} know), "
        f"held-out AUC {metrics.get('held_out_auc')}")
    return card


def write_card(output: str, card: dict) -> None:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.json").write_text(json.dumps(card, indent=2))
    lines = [f"# {card['model']}", "", "Trained by `ragsift train`.", "", "```json", json.dumps(card, indent=2), "```"]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="judge", required=True)
    rel = sub.add_parser("relevance", help="M_rel: a bi-encoder (or cross-encoder) from gold passages and hard negatives")
    rel.add_argument("--questions", help="questions Parquet with gold_passage_ids")
    rel.add_argument("--index-dir", help="the index the negatives are mined from")
    rel.add_argument("--output", required=True, help="model directory to write")
    rel.add_argument("--mine-only", action="store_true",
                     help=f"mine the pairs, write <output>/{PAIRS} and stop: train where the GPU is with --pairs")
    rel.add_argument("--pairs", help=f"train from a --mine-only run's {PAIRS} (no questions or index needed)")
    rel.add_argument("--exclude", action="append", default=[], help="id list or question Parquet never trained on")
    rel.add_argument("--base", default="all-minilm-l6-v2", help="model to start from (alias, path or hub name)")
    rel.add_argument("--architecture", choices=["bi-encoder", "cross-encoder"], default="bi-encoder",
                     help="bi-encoder: fine-tune the embedder's cosine (learns in CPU time); cross-encoder: a "
                          "CrossEncoder with a new head (needs a GPU's worth of steps)")
    rel.add_argument("--negatives", type=int, default=3, help="hard negatives per question and retrieval method")
    rel.add_argument("--random-negatives", type=int, default=1,
                     help="easy negatives per question: passages other questions retrieved")
    rel.add_argument("--epochs", type=float, default=1.0)
    rel.add_argument("--batch-size", type=int, default=32)
    rel.add_argument("--learning-rate", type=float, default=5e-5)
    rel.add_argument("--max-length", type=int, default=256)
    rel.add_argument("--held-out", type=float, default=0.1, help="share of questions kept out of training")
    rel.add_argument("--per-dataset", type=int, help="at most N questions of each dataset (in file order), so that "
                     "one large dataset does not make the whole training set")
    rel.add_argument("--limit", type=int, help="only the first N questions (quick runs)")
    rel.add_argument("--seed", type=int, default=0)
    rel.add_argument("--threads", type=int, help="torch threads on CPU (default: every core)")
    rel.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=False,
                     help="train in bfloat16 mixed precision (GPUs, and CPUs with AVX512-BF16 / AMX)")


    know = sub.add_parser("know", help="M_know: a classifier from `ragsift label` know / unknown labels")
    know.add_argument("--labels", required=True, help="a `ragsift label` output directory")
    know.add_argument("--output", required=True, help="model directory to write")
    know.add_argument("--exclude", action="append", default=[], help="id list or question Parquet never trained on")
    know.add_argument("--embedder", default="all-minilm-l6-v2", help="question vectors (alias, path or hub name)")
    know.add_argument("--c", type=float, default=1.0, help="inverse regularisation strength")
    know.add_argument("--held-out", type=float, default=0.1, help="share of questions kept out of training")


def run(args: argparse.Namespace) -> int:
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    (train_relevance if args.judge == "relevance" else train_know)(args, log)
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("train", argv)


if __name__ == "__main__":
    sys.exit(main())
