"""Yes/no answers with a short reasoning before the choice (answer form ``yes_no_reasoned``) against
the guided choice (``yes_no``), on a tuning slice of yes/no questions.

The ``yes_no`` form reads the choice off the first token: the model answers without a word of
reasoning. The 0.5B model's choice has no signal (AUC 0.47, ``yes_no_signal.py``) and the 1.5B
model's rag answers strategyqa near chance on every slice (46.7-64.0), which is where RA-ISF's
difference from rag is decided (results/README.md). This asks each question both ways, with the
forms' own requests (strategies/forms.py), closed book (direct's user prompt) and reading the
passages an earlier ``rag`` run retrieved (rag's; retrieval does not depend on the generator). A
reasoned output that names no answer counts as wrong (``unanswered``).

    python benchmarks/yes_no_reasoning.py --questions runs/slices/yesno400.parquet --rag-run runs/tune/yesno400_g15 \\
        --corpus ../shared/data/corpus.parquet --generator qwen2.5-coder-1.5b-instruct \\
        --out results/tuning/yes_no_reasoning_g15.json

``--closed-book-prompt`` replaces the form's system prompt closed book with a wording of its own (the
first one tried). Results are merged into ``--out`` by mode. For choosing on a tuning slice (yesno400:
DEV ``train`` questions no other slice uses), never a reported one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import variants  # noqa: E402
from yes_no_signal import PARTS, user_prompts  # noqa: E402

CLOSED_BOOK_PROMPT = ("Answer the question with yes or no. First write your reasoning in at most three short "
                      "sentences: the facts you know that decide it. Then give the answer.")


def main() -> None:
    p = variants.parser(__doc__, "--rag-run", "a ragsift run with a rag/ folder over the same questions")
    p.add_argument("--limit", type=int, help="the first N questions only")
    p.add_argument("--modes", default="direct,rag")
    p.add_argument("--closed-book-prompt", action="store_true")
    args = p.parse_args()
    import pyarrow.parquet as pq

    from schemas.config import AnswerFormConfig
    from schemas.records import Generate
    from strategies.forms import YES_NO, YES_NO_REASONED, final_answer, final_request

    questions = pq.read_table(args.questions).to_pylist()[: args.limit]
    retrieved = {r["id"]: r["retrieved_ids"]
                 for r in pq.read_table(f"{args.rag_run}/rag", columns=["id", "retrieved_ids"]).to_pylist()}
    found = variants.passages(args.corpus, {i for q in questions for i in retrieved[q["id"]]})
    generator = variants.generator(args.generator)
    forms = AnswerFormConfig()
    out_path = Path(args.out) if args.out else None
    result = json.loads(out_path.read_text()) if out_path and out_path.exists() else {"modes": {}}
    result.update(questions=args.questions, rag_run=args.rag_run, generator=args.generator, n=len(questions))
    prompts = user_prompts(questions, retrieved, found)
    for mode in args.modes.split(","):
        users = prompts[mode]
        choice = [final_answer(r, YES_NO) for r in generator.generate([final_request(u, YES_NO, forms) for u in users])]
        requests = [final_request(u, YES_NO_REASONED, forms) for u in users]
        if mode == "direct" and args.closed_book_prompt:
            requests = [Generate((("system", CLOSED_BOOK_PROMPT), r.messages[1]), r.max_tokens, r.json_schema)
                        for r in requests]
        outputs = generator.generate(requests)
        reasoned = [final_answer(o, YES_NO_REASONED) for o in outputs]
        out = {"system": requests[0].messages[0][1], "unanswered": sum(not r for r in reasoned),
               "completion_tokens_per_q": round(sum(o.completion_tokens for o in outputs) / len(outputs), 1),
               "by": {}}
        for part, keep in PARTS:
            idx = [i for i, q in enumerate(questions) if keep(q)]
            if not idx:
                continue
            sub = [questions[i] for i in idx]
            out["by"][part] = {
                "n": len(idx),
                "gold_yes": round(100 * sum(q["answers"][0].lower() == "yes" for q in sub) / len(idx), 1),
                "choice": variants.score([choice[i] for i in idx], sub)["acc"],
                "reasoned": variants.score([reasoned[i] for i in idx], sub)["acc"],
                "answered_yes": {"choice": round(100 * sum(choice[i] == "yes" for i in idx) / len(idx), 1),
                                 "reasoned": round(100 * sum(reasoned[i] == "yes" for i in idx) / len(idx), 1)},
                "changed": sum(choice[i] != reasoned[i] for i in idx)}
            print(mode, part, out["by"][part], flush=True)
        out["examples"] = [{"id": q["id"], "gold": q["answers"][0], "choice": c, "output": o.text[:700]}
                           for q, c, o in list(zip(questions, choice, outputs))[:5]]
        result["modes"]["direct_closed_book_prompt" if mode == "direct" and args.closed_book_prompt else mode] = out
        if out_path:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
