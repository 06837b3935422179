"""Score answer-prompt variants of the baselines on a question set, in one vLLM load.

The passages come from an existing ``rag`` run over the same questions (its ``retrieved_ids``), so
every variant reads exactly the same evidence (``best_last`` in reverse order); answers go through ragsift's answer forms (yes/no
questions are a guided choice) and are scored like ``ragsift evaluate``. For choosing prompts on a
calibration slice, never on a reported one. ``few_shot_N`` variants put N solved questions before a
short-answer question as earlier chat turns (direct only): one per dataset of ``SHOT_DATASETS``, the
first in sha256-of-id order of DEV questions no slice uses (not the sample, calib, eval, know,
tune360 or yesno400), answers of at most 4 words.

    python benchmarks/prompt_variants.py --questions runs/slices/calib.parquet --rag-run runs/tune/base \\
        --corpus ../shared/data/corpus.parquet [--generator qwen2.5-coder-0.5b-instruct]
    python benchmarks/prompt_variants.py --questions runs/slices/calib.parquet --variants current,few_shot_3  # direct only
"""

from __future__ import annotations

import hashlib
import json

import variants

SHOT_DATASETS = ("nq", "hotpotqa", "2wiki", "triviaqa", "squad", "popqa")

VARIANTS = {
    # name: (system prompt or None, direct user template, rag user template)
    "current": ("answer_system", "Question: {question}\nAnswer:",
                "Use the passages below to answer the question. If they do not contain the answer, answer from your own "
                "knowledge.\n\n{passages}\n\nQuestion: {question}\nAnswer:"),
    "few_words": (None, "Answer the question in a few words.\nQuestion: {question}\nAnswer:",
                  "Answer the question in a few words, using the passages below. If they do not contain the answer, "
                  "answer from your own knowledge.\n\n{passages}\n\nQuestion: {question}\nAnswer:"),
    "question_last": ("answer_system", "Question: {question}\nAnswer:",
                      "{passages}\n\nUse the passages above to answer the question. If they do not contain the answer, "
                      "answer from your own knowledge.\nQuestion: {question}\nAnswer:"),
    "plain": (None, "{question}", "{passages}\n\n{question}"),
    "few_words_system": ("answer_system", "Answer the question in a few words.\nQuestion: {question}\nAnswer:",
                         "Answer the question in a few words, using the passages below. If they do not contain the "
                         "answer, answer from your own knowledge.\n\n{passages}\n\nQuestion: {question}\nAnswer:"),
    "short_phrase": (None, "Answer with a short phrase: a name, date, number or a few words.\nQuestion: {question}\n"
                     "Answer:", "Answer with a short phrase (a name, date, number or a few words), using the passages "
                     "below. If they do not contain the answer, answer from your own knowledge.\n\n{passages}\n\n"
                     "Question: {question}\nAnswer:"),
    "question_last_few_words": (None, "Answer the question in a few words.\nQuestion: {question}\nAnswer:",
                                "{passages}\n\nAnswer the question in a few words, using the passages above. If they "
                                "do not contain the answer, answer from your own knowledge.\nQuestion: {question}\n"
                                "Answer:"),
    # the shipped rag prompt (prompts/rag/user.txt) with the passages in reverse order, the best next to the question
    "best_last": ("answer_system", "Answer the question in a few words.\nQuestion: {question}\nAnswer:",
                  (variants.ROOT / "strategies/prompts/rag/user.txt").read_text().strip()),
    # RA-ISF's answer from passages, its paper's Appendix G instruction: the shipped prompt file itself
    "raisf_paper": ("answer_system", "Question: {question}\nAnswer:",
                    (variants.ROOT / "strategies/prompts/raisf/answer_passages.txt").read_text().strip()),
}
FEW_SHOT = {f"few_shot_{n}": n for n in (3, 6)}  # direct's current prompt after n solved examples
BEST_LAST = {"best_last"}  # variants that list the retrieved passages last to first


def few_shot_examples(dev: str, n: int) -> list[tuple[str, str]]:
    """n (question, answer) pairs by the rule in the module docstring."""
    import pyarrow.parquet as pq

    taken = variants.taken_ids("calib", "eval", "know", "tune360", "yesno400")
    rows = sorted((r for r in pq.read_table(dev, columns=["id", "dataset", "question", "answers"]).to_pylist()
                   if r["id"] not in taken and r["answers"] and len(r["answers"][0].split()) <= 4),
                  key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    first = [next(r for r in rows if r["dataset"] == d) for d in SHOT_DATASETS[:n]]
    return [(r["question"], r["answers"][0]) for r in first]


def main() -> None:
    p = variants.parser(__doc__, "--rag-run", "a ragsift run with a rag/ folder over the same questions "
                        "(without it only direct's variants are scored)", evidence_required=False)
    p.add_argument("--dev", default=str(variants.ROOT.parent / "shared/data/questions_dev.parquet"),
                   help="the DEV questions few-shot examples come from")
    args = p.parse_args()
    import pyarrow.parquet as pq

    from engine.steps import Item
    from schemas.config import AnswerFormConfig
    from schemas.records import Generate
    from strategies.base import answer_messages, format_passages
    from strategies.forms import choices, final_answer, final_request, form_of

    questions = pq.read_table(args.questions).to_pylist()
    retrieved, corpus = {}, {}
    if args.rag_run:
        rag_rows = pq.read_table(f"{args.rag_run}/rag", columns=["id", "retrieved_ids"]).to_pylist()
        retrieved = {r["id"]: r["retrieved_ids"] for r in rag_rows}
        corpus = variants.passages(args.corpus, [i for ids in retrieved.values() for i in ids])
    forms = AnswerFormConfig()
    generator = variants.generator(args.generator)
    results = {}
    picked = args.variants.split(",") if args.variants else list(VARIANTS)
    # one read of DEV: the first n examples of the longest list are the n-example list (one per dataset, in order)
    counts = {name: FEW_SHOT[name] for name in picked if name in FEW_SHOT}
    most = few_shot_examples(args.dev, max(counts.values())) if counts else []
    shots = {name: most[:n] for name, n in counts.items()}
    for name in picked:
        system, direct_user, rag_user = VARIANTS["current" if name in FEW_SHOT else name]
        reads = args.rag_run and name not in FEW_SHOT
        for strategy, template in (("direct", direct_user),) + ((("rag", rag_user),) if reads else ()):
            examples = tuple(turn for q, a in shots.get(name, ()) for turn in (("user", template.format(question=q)),
                                                                              ("assistant", a)))
            requests, forms_asked = [], []
            for q in questions:
                passages = [corpus[i] for i in retrieved.get(q["id"], ())][::-1 if name in BEST_LAST else 1]
                user = template.format(question=q["question"], passages=format_passages(passages))
                form = form_of(Item(q["question"], kind=q["kind"], dataset=q["dataset"]), forms)
                forms_asked.append(form)
                # choice forms always take their own system prompt (final_request); a short answer the variant's
                if choices(form, forms):
                    requests.append(final_request(user, form, forms))
                else:
                    messages = answer_messages(user, system)
                    requests.append(Generate(messages[:-1] + examples + messages[-1:]))
            answers = [final_answer(r, f) for r, f in zip(generator.generate(requests), forms_asked)]
            results[f"{name}/{strategy}"] = variants.score(answers, questions)
            print(name, strategy, results[f"{name}/{strategy}"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"questions": args.questions, "n": len(questions),
                       "variants": {n: VARIANTS.get(n) or {"current": VARIANTS["current"], "examples": shots[n]} for n in picked},
                       "scores": results}, f, indent=2)


if __name__ == "__main__":
    main()
