"""Score Self-Reasoning answer variants on a question set, in one vLLM load (benchmarks/replay.py).

Every variant reads the passages an earlier ``rag`` run retrieved for the same questions (Self-Reasoning
retrieves the same top-k), and answers are scored like ``ragsift evaluate``. For choosing on a
calibration slice, never on a reported one.

    python benchmarks/self_reasoning_variants.py --questions runs/slices/calib.parquet \\
        --rag-run runs/tune/calib_leaf --corpus ../shared/data/corpus.parquet --out runs/tune/sr_variants.json
"""

from __future__ import annotations

import argparse
import collections
import json

VARIANTS = {
    "paper": {},
    "short_phrase": {"short_answer": "a name, date, number or short phrase, not a sentence"},
    "answer_chars_40": {"answer_chars": 40},
    "read": {"answer_step": "read"},
    "short_phrase_40": {"short_answer": "a name, date, number or short phrase, not a sentence", "answer_chars": 40},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", required=True)
    p.add_argument("--rag-run", required=True, help="a ragsift run with a rag/ folder over the same questions")
    p.add_argument("--corpus", required=True)
    p.add_argument("--generator", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--out")
    p.add_argument("--variants", help="comma-separated names (default: all)")
    args = p.parse_args()
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from replay import run

    from actors.generator import Generator
    from engine.steps import Item
    from jobs import metrics as M
    from jobs.pools import llm_settings
    from schemas.config import AnswerFormConfig, LLMConfig, SamplingConfig
    from schemas.records import Passage, Retrieval
    from strategies.self_reasoning import SelfReasoning, SelfReasoningConfig

    questions = pq.read_table(args.questions).to_pylist()
    rag = {r["id"]: r["retrieved_ids"] for r in ds.dataset(f"{args.rag_run}/rag").to_table().to_pylist()}
    ids = sorted({i for ids in rag.values() for i in ids})
    corpus = pq.read_table(args.corpus, columns=["id", "title", "text"])
    corpus = {r["id"]: r for r in corpus.filter(pc.is_in(corpus["id"], value_set=pa.array(ids))).to_pylist()}
    by_question = {q["question"]: q["id"] for q in questions}

    def retrieve(item, request):
        ids = rag[by_question[item.question]][:request.k]
        return Retrieval([Passage(i, corpus[i]["title"] or "", corpus[i]["text"], 0.0) for i in ids])

    generator = Generator(llm_settings(LLMConfig(model=args.generator)), SamplingConfig().model_dump())
    scores = {}
    picked = args.variants.split(",") if args.variants else list(VARIANTS)
    for name in picked:
        settings = VARIANTS[name]
        config = SelfReasoningConfig(**{k: v for k, v in settings.items() if k in SelfReasoningConfig.model_fields})
        strategy = SelfReasoning(config, AnswerFormConfig())
        items = [Item(q["question"], kind=q["kind"], dataset=q["dataset"]) for q in questions]
        done = run(strategy, items, generator, retrieve)
        s = {"EM": 0.0, "F1": 0.0, "acc": 0.0}
        for q, d in zip(questions, done):
            s["EM"] += M.exact_match(d.answer, q["answers"])
            s["F1"] += M.f1(d.answer, q["answers"])
            s["acc"] += M.accuracy(d.answer, q["answers"])
        scores[name] = {k: round(100 * v / len(questions), 1) for k, v in s.items()}
        scores[name]["resolved_by"] = dict(collections.Counter(d.resolved_by for d in done))
        words = sorted(len(d.answer.split()) for d in done)
        scores[name]["median_answer_words"] = words[len(words) // 2]
        print(name, scores[name], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"questions": args.questions, "rag_run": args.rag_run, "n": len(questions),
                       "variants": {n: VARIANTS[n] for n in picked}, "scores": scores}, f, indent=2)


if __name__ == "__main__":
    main()
