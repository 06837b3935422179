"""M_rel's training pairs: (question, passage, label) from the questions' gold passages and the
non-gold passages BM25 and dense retrieval rank highest; mined where the index is, written to a
Parquet file that training elsewhere (a GPU) reads back with its provenance."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

from jobs.question_sources import as_parquet
from jobs.questions import gold_ids, question_columns
from jobs.storage import read_table
from jobs.train_data import excluded_ids
from schemas.errors import UserError
from schemas.training import RelevanceTraining


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
    if manifest.get("chunks"):  # the positives are the gold passages' texts; a part of one need not hold the answer
        raise UserError(f"{index_dir} holds passages split into parts (index.chunk_words): the questions' gold passage "
                        "ids name whole passages; mine training pairs from an index of the passages as they are")
    dirs = [str(Path(index_dir) / s["dir"]) for s in manifest["shards"]]
    texts = [r["question"] for r in rows]
    vectors = Encoder(resolve(manifest["embedder"])).encode(texts, "query")
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
        # in the question's own order: a set's order is the process's string hash, and each pair draws from
        # ``rng``, so the same command and seed mined other pairs in another process
        for pid in (pid for pid in dict.fromkeys(row["gold_passage_ids"]) if pid in gold_passages):
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


PAIRS = "pairs.parquet"  # what `--mine-only` writes and `--pairs` reads


def collect_pairs(settings: RelevanceTraining, log) -> tuple[list[dict], dict]:
    """The training pairs and where they came from: mined from ``--questions`` over ``--index-dir``, or
    read back from a ``--mine-only`` run (``--pairs``), whose provenance travels in the file."""
    skip = excluded_ids(settings.exclude)
    if settings.pairs:
        table = read_table(settings.pairs, ["id", "question", "passage", "label"])
        source = json.loads((table.schema.metadata or {}).get(b"ragsift", b"{}"))
        # a question excluded now is dropped, whatever the mining excluded
        pairs = [p for p in table.select(["id", "question", "passage", "label"]).to_pylist()
                 if str(p["id"]) not in skip]
        # the card's counts are of what is trained on: the file's pairs (a user may have cut or edited it since
        # it was mined; its mining's counts were copied as they were), less the questions excluded now
        kept = {str(p["id"]) for p in pairs}
        datasets = dict(collections.Counter(dataset for qid, dataset in source.get("dataset_of", {}).items()
                                            if qid in kept)) if "dataset_of" in source else None
        source = {**source, "questions_used": len(kept), **({"datasets": datasets} if datasets is not None else {}),
                  **({"excluded_when_training": settings.exclude, "pairs_excluded": table.num_rows - len(pairs)}
                     if settings.exclude else {})}
        bad = next((p["label"] for p in pairs if p["label"] not in (0, 1)), "none")
        if bad != "none":  # NaN and None passed `if label` as relevant, and the card crashed after the weights
            raise UserError(f"{settings.pairs}: a pair's label is {bad!r}; labels are 0 (irrelevant) or 1 (relevant)")
        log(f"{settings.pairs}: {table.num_rows} pairs mined earlier, {len(pairs)} kept")
        return pairs, source
    questions = as_parquet(settings.questions)
    optional = [c for c in ["dataset"] if c in question_columns(questions)]
    read = [{"dataset": None, **r, "gold_passage_ids": gold_ids(r["gold_passage_ids"])}
            for r in read_table(questions, ["id", "question", "gold_passage_ids", *optional]).to_pylist()]
    rows = [r for r in read if str(r["id"]) not in skip]
    excluded = len(read) - len(rows)  # of these questions: an id list that matches none of them says 0
    # each id once (answer keeps a repeated id's first row) and a question to ask (an empty one was mined)
    firsts: dict[str, dict] = {}
    for r in rows:
        if r["gold_passage_ids"] and (r["question"] or "").strip():
            firsts.setdefault(str(r["id"]), r)
    rows = list(firsts.values())
    if settings.per_dataset:
        seen, kept = collections.Counter(), []
        for r in rows:
            seen[r["dataset"]] += 1
            if seen[r["dataset"]] <= settings.per_dataset:
                kept.append(r)
        rows = kept
    if settings.limit:
        rows = rows[: settings.limit]
    if not rows:
        raise UserError(f"{settings.questions}: no question with gold passages left to train on")
    started = time.perf_counter()
    pairs = mine_pairs(rows, settings.index_dir, settings.negatives, settings.random_negatives, seed=settings.seed)
    source = {"questions": settings.questions, "index": settings.index_dir, "excluded": settings.exclude,
              "excluded_questions": excluded, "questions_used": len(rows),
              "datasets": dict(collections.Counter(r["dataset"] for r in rows)),
              "dataset_of": {str(r["id"]): r["dataset"] for r in rows},
              "mining": {"negatives": settings.negatives, "random_negatives": settings.random_negatives, "seed": settings.seed},
              "mine_s": round(time.perf_counter() - started, 1)}
    # a gold id that names no passage of the index gives its question no positive: all of them, a wrong
    # --index-dir or another corpus's ids, was found only when training refused the pairs, maybe elsewhere
    with_gold = len({p["id"] for p in pairs if p["label"]})
    source["questions_with_gold_in_index"] = with_gold
    if not with_gold:
        raise UserError(f"no gold passage id of the {len(rows)} questions names a passage of {settings.index_dir}: "
                        "the index of another corpus, or ids of another? nothing was written")
    missing = (f"; {len(rows) - with_gold} of the questions have no gold passage in the index (their gold ids name "
               "none of its passages) and give negatives only" if with_gold < len(rows) else "")
    log(f"{len(rows)} questions -> {len(pairs)} pairs ({sum(p['label'] for p in pairs):.0f} positive) "
        f"in {source['mine_s']:.0f} s{missing}")
    return pairs, source


def write_pairs(pairs: list[dict], source: dict, output: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(output) / PAIRS
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(pairs).replace_schema_metadata({"ragsift": json.dumps(source)})
    pq.write_table(table, path, compression="zstd")
    return str(path)
