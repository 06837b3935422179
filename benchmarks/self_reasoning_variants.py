"""Score Self-Reasoning answer variants on a question set, in one vLLM load (benchmarks/replay.py).

Every variant reads the passages an earlier ``rag`` run retrieved for the same questions (Self-Reasoning
retrieves the same top-k), and answers are scored like ``ragsift evaluate``. For choosing on a
calibration slice, never on a reported one.

    python benchmarks/self_reasoning_variants.py --questions runs/slices/calib.parquet \\
        --rag-run runs/tune/calib_leaf --corpus ../shared/data/corpus.parquet --out runs/tune/sr_variants.json
"""

from __future__ import annotations

import collections
import json

import variants

PAPER = {"answer_step": "trajectory", "short_answer": "no more than 10 words"}
VARIANTS = {
    "paper": PAPER,
    "short_phrase": {**PAPER, "short_answer": "a name, date, number or short phrase, not a sentence"},
    "answer_chars_40": {**PAPER, "answer_chars": 40},
    "read": {**PAPER, "answer_step": "read"},
}


def main() -> None:
    args = variants.parser(__doc__, "--rag-run", "a ragsift run with a rag/ folder over the same questions").parse_args()
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from replay import run

    from engine.steps import Item
    from schemas.config import AnswerFormConfig
    from schemas.records import Retrieval
    from strategies.self_reasoning import SelfReasoning, SelfReasoningConfig

    questions = pq.read_table(args.questions).to_pylist()
    rag = {r["id"]: r["retrieved_ids"] for r in ds.dataset(f"{args.rag_run}/rag").to_table().to_pylist()}
    corpus = variants.passages(args.corpus, [i for ids in rag.values() for i in ids])
    by_question = {q["question"]: q["id"] for q in questions}

    def retrieve(item, request):
        ids = rag[by_question[item.question]][:request.k]
        return Retrieval([corpus[i] for i in ids])

    generator = variants.generator(args.generator)
    scores = {}
    picked = args.variants.split(",") if args.variants else list(VARIANTS)
    for name in picked:
        settings = VARIANTS[name]
        config = SelfReasoningConfig(**{k: v for k, v in settings.items() if k in SelfReasoningConfig.model_fields})
        strategy = SelfReasoning(config, AnswerFormConfig())
        items = [Item(q["question"], kind=q["kind"], dataset=q["dataset"]) for q in questions]
        done = run(strategy, items, generator, retrieve)
        scores[name] = variants.score([d.answer for d in done], questions)
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
