"""The model actors on a GPU: the encoder, the cross-encoder ranker, the NLI cross-encoder and M_know each
take the GPU when one is there and no device is set, answer as they do on the CPU, and how fast.

For the lent GPU machine, which has PyTorch and sentence-transformers but no Ray or vLLM: the actor classes
are plain classes that Ray wraps (engine/, jobs/pools.py), so they run there as they are. The ranker and NLI
models are MiniLM with a new, seeded classification head (no cross-encoder or NLI weights exist offline;
speed and CPU/GPU agreement do not depend on what the head learned); M_know is a seeded logistic head.

    python benchmarks/gpu_actors.py --embedder PATH_TO_MINILM --out gpu_actors.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.encoder import Encoder  # noqa: E402
from actors.know import WEIGHTS, KnowClassifier  # noqa: E402
from actors.nli import NLICrossEncoder  # noqa: E402
from actors.reranker import CrossEncoderRanker  # noqa: E402
from schemas.records import Classify, Entail, Rank  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def head_over(embedder: str, where: Path, labels: dict[int, str]) -> str:
    """MiniLM with a seeded classification head of ``labels``, saved as a CrossEncoder directory."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder(embedder, num_labels=len(labels), device="cpu")
    model.model.config.id2label, model.model.config.label2id = labels, {v: k for k, v in labels.items()}
    model.save_pretrained(str(where))
    return str(where)


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    """The best of ``repeats`` wall times of ``fn()`` after one warm-up call, and its result."""
    import torch

    out = fn()
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embedder", required=True, help="a sentence-transformers MiniLM directory")
    p.add_argument("--corpus", default=str(ROOT / "data/demo/sample_corpus.parquet"))
    p.add_argument("--questions", default=str(ROOT / "data/demo/sample_questions.parquet"))
    p.add_argument("--candidates", type=int, default=20, help="passages a question's ranking and entailment read")
    p.add_argument("--limit", type=int, default=None, help="first N passages and questions (a dry run on a CPU)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if not torch.cuda.is_available() and args.limit is None:
        sys.exit("no GPU: this checks the actors on one (--limit N runs it on the CPU as a dry run)")
    corpus = pq.read_table(args.corpus).to_pylist()[: args.limit]
    questions = [q["question"] for q in pq.read_table(args.questions).to_pylist()][: args.limit]
    passages = [f"{r['title']}: {r['text']}" for r in corpus]
    report: dict = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    "torch": torch.__version__, "cpu_threads": torch.get_num_threads(),
                    "passages": len(passages), "questions": len(questions)}

    # the encoder: every passage, as the index job encodes them; the same model picked by device=None and "cpu"
    gpu, cpu = Encoder(args.embedder), Encoder(args.embedder, device="cpu")
    report["encoder_device"] = str(gpu.model.device)
    rows = {}
    for batch in (64, 256):  # 64: the actors' default batch
        gpu.batch_size = batch
        s, vectors = timed(lambda: gpu.encode(passages, "document"))
        rows[f"gpu_batch_{batch}"] = round(len(passages) / s, 1)
    s_cpu, cpu_vectors = timed(lambda: cpu.encode(passages, "document"), repeats=1)
    rows["cpu"] = round(len(passages) / s_cpu, 1)
    report["encoder_passages_per_s"] = rows
    report["encoder_min_cosine_gpu_vs_cpu"] = float(np.min(np.sum(vectors * cpu_vectors, axis=1)))

    # each question's candidates: its dense top passages (GPU vectors), as a run's ranker stage gets them
    q_vectors = gpu.encode(questions, "query")
    top = np.argsort(-(q_vectors @ vectors.T), axis=1)[:, : args.candidates]
    ranks = [Rank(q, tuple(passages[i] for i in row), top=5) for q, row in zip(questions, top)]
    pairs = len(ranks) * args.candidates

    with tempfile.TemporaryDirectory() as tmp:
        ce = head_over(args.embedder, Path(tmp) / "ranker", {0: "relevant"})
        gpu_r, cpu_r = CrossEncoderRanker(ce), CrossEncoderRanker(ce, device="cpu")
        report["ranker_device"] = str(gpu_r.model.model.device)
        s, gpu_rankings = timed(lambda: gpu_r.rank(ranks))
        s_cpu, cpu_rankings = timed(lambda: cpu_r.rank(ranks), repeats=1)
        report["ranker_pairs_per_s"] = {"gpu_batch_32": round(pairs / s, 1), "cpu": round(pairs / s_cpu, 1)}
        report["ranker_top1_same"] = sum(a.indices[0] == b.indices[0] for a, b in zip(gpu_rankings, cpu_rankings))
        report["ranker_top5_same_set"] = sum(set(a.indices) == set(b.indices) for a, b in zip(gpu_rankings, cpu_rankings))
        report["ranker_max_score_diff"] = float(max(abs(x - y) for a, b in zip(gpu_rankings, cpu_rankings)
                                                    for x, y in zip(sorted(a.scores), sorted(b.scores))))

        nli = head_over(args.embedder, Path(tmp) / "nli", {0: "contradiction", 1: "entailment", 2: "neutral"})
        gpu_n, cpu_n = NLICrossEncoder(nli), NLICrossEncoder(nli, device="cpu")
        report["nli_device"] = str(gpu_n.model.model.device)
        entails = [Entail(r.texts[0], r.query) for r in ranks]
        s, gpu_p = timed(lambda: gpu_n.entail(entails))
        s_cpu, cpu_p = timed(lambda: cpu_n.entail(entails), repeats=1)
        report["nli_pairs_per_s"] = {"gpu_batch_32": round(len(entails) / s, 1), "cpu": round(len(entails) / s_cpu, 1)}
        report["nli_max_prob_diff"] = float(max(abs(a.p_entail - b.p_entail) for a, b in zip(gpu_p, cpu_p)))

        know = Path(tmp) / "know"
        know.mkdir()
        coef = np.random.default_rng(0).standard_normal(q_vectors.shape[1]).tolist()
        (know / WEIGHTS).write_text(json.dumps({"coef": coef, "intercept": 0.0, "embedder": args.embedder}))
        gpu_k, cpu_k = KnowClassifier(str(know), args.embedder), KnowClassifier(str(know), args.embedder, device="cpu")
        report["know_device"] = str(gpu_k.model.device)
        asks = [Classify(q) for q in questions]
        s, gpu_j = timed(lambda: gpu_k.classify(asks))
        report["know_questions_per_s_gpu"] = round(len(asks) / s, 1)
        report["know_max_prob_diff"] = float(max(abs(a.probs["yes"] - b.probs["yes"])
                                                 for a, b in zip(gpu_j, cpu_k.classify(asks))))
    print(json.dumps(report, indent=2))
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
