"""Replay MIGRES's last answer step with variants, on the information sets of an earlier run.

Each question of a ``ragsift answer --strategy migres`` run ends with an information set (its
statements) and the passages its knowledge filter kept (``retrieved_ids``). This script asks the
last step again, with the same information, in one vLLM load, and scores the answers like
``ragsift evaluate``: a fast, like-for-like way to choose how MIGRES answers before paying for a
full run. The replay only sees the last step (a different main answer earlier in the loop would
have ended the loop earlier), so the choice is confirmed by a full run afterwards. For choosing
on a calibration slice, never on a reported one.

    python benchmarks/migres_answer_variants.py --questions runs/slices/calib.parquet \\
        --run runs/tune/calib_leaf --corpus ../shared/data/corpus.parquet --out runs/tune/migres_answer.json
"""

from __future__ import annotations

import json

import variants

VARIANTS = {
    "paper": "the main module (JSON: answer, confidence, explanation, missing information); unanswerable -> "
             "the closing answer from the information",
    "main_short": "as paper, the main prompt asking for a short answer (a name, date, number or short phrase)",
    "main_then_read": "the main module decides whether the information answers the question; the answer is then "
                      "read from the information in the question's form (the closing step's prompt)",
    "read_all_statements": "main_then_read with every extracted statement, entailed or not (an entailment "
                           "threshold of 0)",
    "read_passages": "one read of the information and the kept passages in the question's form (no main module)",
}


def main() -> None:
    args = variants.parser(__doc__, "--run", "a ragsift run with a migres/ folder over the same questions").parse_args()
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    import strategies.migres as mod
    from engine.steps import Item
    from schemas.config import AnswerFormConfig
    from strategies.base import format_passages, prompt
    from strategies.forms import final_answer, final_request, form_of
    from strategies.migres import MIGRES, UNANSWERABLE, MigresConfig, information

    questions = {r["id"]: r for r in pq.read_table(args.questions).to_pylist()}
    rows = [r for r in ds.dataset(f"{args.run}/migres").to_table().to_pylist() if r["id"] in questions]
    corpus = variants.passages(args.corpus, [i for r in rows for i in r["retrieved_ids"]])
    forms = AnswerFormConfig()
    generator = variants.generator(args.generator)
    migres = MIGRES(MigresConfig(), forms=forms)
    cases = []
    for r in rows:
        q = questions[r["id"]]
        trace = next(s for s in json.loads(r["trace"]) if s.get("step") == "migres")
        item = Item(q["question"], kind=q["kind"], dataset=q["dataset"])
        passages = [corpus[i] for i in r["retrieved_ids"]]
        # every statement the leaf module extracted, whatever the entailment check said, and the LLM's
        # own accounts (knowledge prompting, no source)
        extracted = [{"info": v["info"], "source": ["?"]} for it in trace["iterations"] for v in it.get("extracted") or []]
        everything = [i for i in trace["information"] if not i["source"]] + extracted
        cases.append((q, item, trace["information"], passages, everything))

    def run_main(main_prompt: str | None):
        """The main module's (answer, answerable) per case, through MIGRES.main with ``main_prompt``."""
        out = []
        gens = [migres.main(item, info, 0) for _, item, info, *_ in cases]
        if main_prompt:  # the variant's main prompt, for this call only
            mod.prompt = lambda name: main_prompt if name == "migres/main" else prompt(name)
        try:
            requests = [next(g) for g in gens]
            pending = list(zip(gens, requests))
            results = [None] * len(gens)
            while pending:  # a structured output may ask once more (the retry with twice the tokens)
                responses = generator.generate([req for _, req in pending])
                nxt = []
                for (g, _), resp in zip(pending, responses):
                    try:
                        nxt.append((g, g.send(resp)))
                    except StopIteration as stop:
                        results[gens.index(g)] = stop.value
                pending = nxt
        finally:
            mod.prompt = prompt
        for answer, _, _ in results:
            out.append((answer, bool(answer.strip()) and UNANSWERABLE not in answer.lower()))
        return out

    def reads(template: str, with_passages: bool, every_statement: bool = False):
        requests, forms_asked = [], []
        for q, item, info, passages, everything in cases:
            user = template.format(information=information(everything if every_statement else info),
                                   question=q["question"],
                                   passages=format_passages(passages) if with_passages else "")
            forms_asked.append(form_of(item, forms))
            requests.append(final_request(user, forms_asked[-1], forms, step="final"))
        return [final_answer(r, f) for r, f in zip(generator.generate(requests), forms_asked)]

    final_template = prompt("migres/final")
    passages_template = ("Answer the question in a few words, using the information and the passages below.\n\n"
                         "Information: {information}\n\n{passages}\n\nQuestion: {question}\nAnswer:")
    short_main = prompt("migres/main").replace(
        "write an accurate and concise answer to the Question",
        "write a short answer to the Question (a name, date, number or short phrase, not a sentence)")
    picked = args.variants.split(",") if args.variants else list(VARIANTS)
    closing = None
    answers = {}
    for name in picked:
        if name in ("paper", "main_short", "main_then_read"):
            main_out = run_main(short_main if name == "main_short" else None)
            if closing is None:
                closing = reads(final_template, False)
            # main_then_read: the main module only decides when to stop; in this replay of the last
            # step that leaves the closing read for every question
            answers[name] = closing if name == "main_then_read" else [a if ok else c for (a, ok), c in
                                                                      zip(main_out, closing)]
            answers[name + "/answered"] = [ok for _, ok in main_out]
        elif name == "read_all_statements":
            answers[name] = reads(final_template, False, every_statement=True)
        elif name == "read_passages":
            answers[name] = reads(passages_template, True)
    scores = {}
    for name in picked:
        scores[name] = variants.score(answers[name], [q for q, *_ in cases])
        if name + "/answered" in answers:
            scores[name]["answered"] = sum(answers[name + "/answered"])
        print(name, scores[name], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"questions": args.questions, "run": args.run, "n": len(cases),
                       "variants": {n: VARIANTS[n] for n in picked}, "scores": scores}, f, indent=2)


if __name__ == "__main__":
    main()
