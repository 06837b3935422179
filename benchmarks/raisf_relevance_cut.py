"""RA-ISF's relevance cut chosen by answer quality, on a calibration slice (issue 17's open lever).

``ragsift calibrate`` picks ``raisf.relevance_threshold`` by passage F1 against the gold passages.
This asks the question that matters for the answers: reading only the passages a cut keeps, how good
are they? A cut keeps the passages whose relevance score is at least t, which is always the top m
by score for some m, so answering once per m (m = 1..k, kept in retrieval order as RA-ISF reads them)
scores every cut. A question that keeps nothing goes to decomposition, which this does not run: its
value is ``--empty-value`` (default 0.0, near what decomposition gave: on the evaluation slice RA-ISF's
decomposed questions scored 9.7 F1 against rag's 27.4, see results/README).

Input: a ``ragsift calibrate`` output (its probe rows hold each question's top k and their scores
from the judge it ran with). Both RA-ISF's answer prompt (``raisf/answer_passages``) and rag's are
scored, on the same passages. For a calibration slice, never a reported one.

    python benchmarks/raisf_relevance_cut.py --questions runs/slices/calib.parquet \\
        --probe-run runs/tune/calib_ce --corpus ../shared/data/corpus.parquet --out results/tuning/...json
"""

from __future__ import annotations

import json

import variants
import yaml

PROMPTS = ("raisf/answer_passages", "rag/user")


def cut_value(t: float, scores: list[list[float]], value: dict[int, list[float]], empty: float) -> dict:
    """The mean answer value when every question reads the passages scoring >= t (value[m][j]: question
    j's value reading its m best), or ``empty`` when it keeps none."""
    ms = [sum(s >= t for s in row) for row in scores]
    v = [value[m][j] if m else empty for j, m in enumerate(ms)]
    return {"t": t, "value": round(sum(v) / len(v), 4), "mean_kept": round(sum(ms) / len(ms), 2),
            "keep_none": sum(m == 0 for m in ms)}


def thinned(curve: list[dict], points: int = 21) -> list[dict]:
    """The candidates nearest to an even grid of cuts over [0, 1]: enough to draw, small enough to commit."""
    picked = [min(curve, key=lambda c: abs(c["t"] - g / (points - 1))) for g in range(points)]
    return [c for i, c in enumerate(picked) if c not in picked[:i]]


def main() -> None:
    p = variants.parser(__doc__, "--probe-run", "a ragsift calibrate output over the same questions")
    p.add_argument("--empty-value", type=float, default=0.0,
                   help="(F1+acc)/2 counted for a question that keeps no passage (it would be decomposed)")
    args = p.parse_args()
    import pyarrow.parquet as pq

    from engine.steps import Item
    from jobs import metrics as M
    from jobs.calibrate import candidates, first_step, quality
    from schemas.config import AnswerFormConfig
    from strategies.base import format_passages, prompt
    from strategies.forms import final_answer, final_request, form_of

    questions = {q["id"]: q for q in pq.read_table(args.questions).to_pylist()}
    probes = {}
    for row in pq.read_table(f"{args.probe_run}/calibration_probe", columns=["id", "trace", "error"]).to_pylist():
        probe = first_step(row, "probe")
        if not row["error"] and probe and row["id"] in questions and M.gold_answers(questions[row["id"]]["answers"]):
            probes[row["id"]] = probe
    ids = sorted(probes)
    qs = [questions[i] for i in ids]
    corpus = variants.passages(args.corpus, [pid for i in ids for pid in probes[i]["top_k"]])
    forms = AnswerFormConfig()
    generator = variants.generator(args.generator)
    k = max(len(probes[i]["top_k"]) for i in ids)

    def kept(i: str, m: int) -> list:
        """The m best-scoring passages of question i, in retrieval order."""
        scores = probes[i]["relevance_p_yes"]
        best = sorted(sorted(range(len(scores)), key=lambda j: -scores[j])[:m])
        return [corpus[probes[i]["top_k"][j]] for j in best]

    answers: dict[str, dict[int, list[str]]] = {}
    scores: dict[str, dict[int, dict]] = {}
    for name in PROMPTS:
        template = prompt(name)
        answers[name], scores[name] = {}, {}
        for m in range(1, k + 1):
            requests, forms_asked = [], []
            for i, q in zip(ids, qs):
                form = form_of(Item(q["question"], kind=q["kind"], dataset=q["dataset"]), forms)
                forms_asked.append(form)
                user = template.format(passages=format_passages(kept(i, m)), question=q["question"])
                requests.append(final_request(user, form, forms))
            answers[name][m] = [final_answer(r, f) for r, f in zip(generator.generate(requests), forms_asked)]
            scores[name][m] = variants.score(answers[name][m], qs)
            print(name, m, scores[name][m], flush=True)

    # every cut t: each question reads the passages scoring >= t (m of them), or keeps none
    judged = [probes[i]["relevance_p_yes"] for i in ids]
    cuts = candidates([s for row in judged for s in row])
    calibrated = yaml.safe_load(open(f"{args.probe_run}/calibrated.yaml"))["raisf"]["relevance_threshold"]
    curves = {}
    for name in PROMPTS:
        value = {m: [quality(a, q["answers"]) for a, q in zip(answers[name][m], qs)] for m in answers[name]}
        curve = [cut_value(t, judged, value, args.empty_value) for t in cuts]
        curves[name] = {"best": max(curve, key=lambda c: (c["value"], -c["t"])), "keep_all": curve[0],
                        "calibrated_by_passage_f1": cut_value(calibrated, judged, value, args.empty_value),
                        "curve": thinned(curve)}
        print(name, {key: c for key, c in curves[name].items() if key != "curve"}, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"questions": args.questions, "probe_run": args.probe_run, "n": len(ids),
                       "generator": args.generator, "empty_value": args.empty_value,
                       "by_top_m": scores, "cuts": curves}, f, indent=2)


if __name__ == "__main__":
    main()
