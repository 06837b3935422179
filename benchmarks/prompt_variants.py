"""Score answer-prompt variants of the baselines on a question set, in one vLLM load.

The passages come from an existing ``rag`` run over the same questions (its ``retrieved_ids``), so
every variant reads exactly the same evidence; answers go through ragsift's answer forms (yes/no
questions are a guided choice) and are scored like ``ragsift evaluate``. For choosing prompts on a
calibration slice, never on a reported one.

    python benchmarks/prompt_variants.py --questions runs/slices/calib.parquet --rag-run runs/tune/base \\
        --corpus ../shared/data/corpus.parquet [--generator qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import json

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
    import pyarrow.parquet as pq

    from actors.generator import Generator
    from engine.steps import Item
    from jobs import metrics as M
    from jobs.pools import llm_settings
    from schemas.config import AnswerFormConfig, LLMConfig, SamplingConfig
    from schemas.records import Generate, Passage
    from strategies.base import answer_messages, format_passages
    from strategies.forms import choices, final_answer, final_request, form_of

    questions = pq.read_table(args.questions).to_pylist()
    rag_rows = pq.read_table(f"{args.rag_run}/rag", columns=["id", "retrieved_ids"]).to_pylist()
    retrieved = {r["id"]: r["retrieved_ids"] for r in rag_rows}
    ids = sorted({i for ids in retrieved.values() for i in ids})
    corpus = pq.read_table(args.corpus, columns=["id", "title", "text"])
    corpus = {r["id"]: r for r in corpus.filter(pc.is_in(corpus["id"], value_set=pa.array(ids))).to_pylist()}
    forms = AnswerFormConfig()
    # the generator actor's own class, in this process: the same templating, sampling and choice handling
    generator = Generator(llm_settings(LLMConfig(model=args.generator)), SamplingConfig().model_dump())
    results = {}
    picked = args.variants.split(",") if args.variants else list(VARIANTS)
    for name in picked:
        system, direct_user, rag_user = VARIANTS[name]
        for strategy, template in (("direct", direct_user), ("rag", rag_user)):
            requests = []
            for q in questions:
                passages = [Passage(i, corpus[i]["title"] or "", corpus[i]["text"], 0.0) for i in retrieved[q["id"]]]
                user = template.format(question=q["question"], passages=format_passages(passages))
                form = form_of(Item(q["question"], kind=q["kind"], dataset=q["dataset"]), forms)
                # choice forms always take their own system prompt (final_request); a short answer the variant's
                requests.append(final_request(user, form, forms) if choices(form, forms)
                                else Generate(answer_messages(user, system)))
            scores = {"EM": 0.0, "F1": 0.0, "acc": 0.0}
            for q, response in zip(questions, generator.generate(requests)):
                answer = final_answer(response)
                scores["EM"] += M.exact_match(answer, q["answers"])
                scores["F1"] += M.f1(answer, q["answers"])
                scores["acc"] += M.accuracy(answer, q["answers"])
            results[f"{name}/{strategy}"] = {k: round(100 * v / len(questions), 1) for k, v in scores.items()}
            print(name, strategy, results[f"{name}/{strategy}"], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"questions": args.questions, "n": len(questions), "variants": {n: VARIANTS[n] for n in picked},
                       "scores": results}, f, indent=2)


if __name__ == "__main__":
    main()
