"""Score answer-prompt variants of the baselines on a question set, in one vLLM load.

The passages come from an existing ``rag`` run over the same questions (its ``retrieved_ids``), so
every variant reads exactly the same evidence; answers go through ragsift's answer forms (yes/no
questions are a guided choice) and are scored like ``ragsift evaluate``. For choosing prompts on a
calibration slice, never on a reported one.

    python benchmarks/prompt_variants.py --questions runs/slices/calib.parquet --rag-run runs/tune/base \\
        --corpus ../shared/data/corpus.parquet [--generator qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import json

import variants

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
}


def main() -> None:
    args = variants.parser(__doc__, "--rag-run", "a ragsift run with a rag/ folder over the same questions").parse_args()
    import pyarrow.parquet as pq

    from engine.steps import Item
    from schemas.config import AnswerFormConfig
    from schemas.records import Generate
    from strategies.base import answer_messages, format_passages
    from strategies.forms import choices, final_answer, final_request, form_of

    questions = pq.read_table(args.questions).to_pylist()
    rag_rows = pq.read_table(f"{args.rag_run}/rag", columns=["id", "retrieved_ids"]).to_pylist()
    retrieved = {r["id"]: r["retrieved_ids"] for r in rag_rows}
    corpus = variants.passages(args.corpus, [i for ids in retrieved.values() for i in ids])
    forms = AnswerFormConfig()
    generator = variants.generator(args.generator)
    results = {}
    picked = args.variants.split(",") if args.variants else list(VARIANTS)
    for name in picked:
        system, direct_user, rag_user = VARIANTS[name]
        for strategy, template in (("direct", direct_user), ("rag", rag_user)):
            requests = []
            for q in questions:
                passages = [corpus[i] for i in retrieved[q["id"]]]
                user = template.format(question=q["question"], passages=format_passages(passages))
                form = form_of(Item(q["question"], kind=q["kind"], dataset=q["dataset"]), forms)
                # choice forms always take their own system prompt (final_request); a short answer the variant's
                requests.append(final_request(user, form, forms) if choices(form, forms)
                                else Generate(answer_messages(user, system)))
            answers = [final_answer(response) for response in generator.generate(requests)]
            results[f"{name}/{strategy}"] = variants.score(answers, questions)
            print(name, strategy, results[f"{name}/{strategy}"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"questions": args.questions, "n": len(questions), "variants": {n: VARIANTS[n] for n in picked},
                       "scores": results}, f, indent=2)


if __name__ == "__main__":
    main()
