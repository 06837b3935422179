"""``ragsift calibrate``: choose the strategies' thresholds on a calibration slice, the papers' way.

    ragsift calibrate --questions calib.parquet --index-dir idx --output runs/calib [--generator ...]

One pass of the ``calibration_probe`` strategy over the slice (strategies/calibration_probe.py)
records, per question, the scores each threshold cuts and the answers of the branches it chooses
between; every candidate value is then scored offline against the gold answers:

    raisf.know_threshold        answer closed-book when P('yes') >= t, else read the top k: the t
                                whose mix answers best (score = (F1 + accuracy) / 2; ties -> the
                                higher t, i.e. retrieve more)
    think_act.context           read the top 3 sentences or the top 3 passages: the one whose
                                answers score better (ties -> sentences, the paper's reading)
    think_act.beta_threshold    retrieve when beta < beta': likewise, against that read (ties -> the
                                higher beta')
    think_act.ambiguity_threshold
                                split into sub-queries when P(AMBIGUOUS) >= t, else go on (at that
                                beta'): likewise (ties -> the higher t, i.e. split less). The probe
                                answers sub-queries under the config it runs with (context, beta')
    raisf.relevance_threshold   a passage is relevant when P('yes') >= t: the t with the best F1
                                against the gold passages among the top k
    migres.relevance_threshold  the largest delta at which ``--keep`` (0.8) of the questions keep a
                                passage of their top N (MIGRES Section 4 / Table 11)

Writes ``<output>/calibrated.yaml`` (a config file for ``--config``: the values and a
``calibration`` section naming the slice, its fingerprint and the models, which run metadata then
carries) and ``<output>/calibration.json`` (every candidate's score). Use a slice that you do not
report on: the thresholds are fitted to it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import yaml

from jobs import answer as answer_job
from jobs import metrics as M
from jobs.evaluate import answer_files
from jobs.identity import ranker_name
from jobs.questions import question_columns
from jobs.storage import file_sha256, filesystem, read_table, redact
from schemas.errors import UserError
from strategies.think_act import CONTEXTS

PROBE = "calibration_probe"


def candidates(scores: list[float]) -> list[float]:
    """0, the midpoints between neighbouring distinct scores, and 1: a cut between two observed
    scores, not on one, so ``>=`` and ``>`` agree on the slice."""
    distinct = sorted(set(scores))
    return [0.0, *(round((a + b) / 2, 6) for a, b in zip(distinct, distinct[1:])), 1.0]


def switch_threshold(scores: list[float], above: list[float], below: list[float]) -> tuple[float, list[dict]]:
    """The t for "use ``above`` when score >= t, else ``below``" with the best mean value (ties ->
    the higher t), and every candidate's value."""
    curve = [{"t": t, "value": sum(a if s >= t else b for s, a, b in zip(scores, above, below)) / len(scores),
              "above": sum(s >= t for s in scores) / len(scores)} for t in candidates(scores)]
    best = max(curve, key=lambda c: (round(c["value"], 9), c["t"]))
    return best["t"], curve


def f1_threshold(scores: list[float], gold: list[bool]) -> tuple[float, list[dict]]:
    """The t for "relevant when score >= t" with the best F1 against ``gold`` (ties -> the higher t)."""
    curve = []
    for t in candidates(scores):
        tp = sum(s >= t and g for s, g in zip(scores, gold))
        fp = sum(s >= t and not g for s, g in zip(scores, gold))
        fn = sum(s < t and g for s, g in zip(scores, gold))
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        curve.append({"t": t, "F1": f1, "precision": tp / (tp + fp) if tp + fp else 0.0,
                      "recall": tp / (tp + fn) if tp + fn else 0.0})
    best = max(curve, key=lambda c: (round(c["F1"], 9), c["t"]))
    return best["t"], curve


def keep_threshold(best_scores: list[float], keep: float) -> float:
    """The largest delta at which a share ``keep`` of the questions keeps their best-scoring passage."""
    ranked = sorted(best_scores, reverse=True)
    return ranked[max(0, math.ceil(keep * len(ranked) - 1e-9) - 1)]


def quality(prediction: str, golds: list[str]) -> float:
    """One answer's value for the switch objectives: (F1 + accuracy) / 2."""
    return (M.f1(prediction, golds) + M.accuracy(prediction, golds)) / 2


def choose(rows: list[dict], gold: dict[str, dict], keep: float) -> dict:
    """Every threshold from the probe rows joined with their gold; a dict per config field."""
    probes = []
    for row in rows:
        g = gold.get(row["id"])
        steps = [t for t in json.loads(row["trace"] or "[]") if t.get("step") == "probe"]
        if row["error"] or not g or not g.get("answers") or not steps or "ta_retrieval" not in steps[0]:
            continue
        probes.append((steps[0], g))
    if not probes:
        raise UserError("no probe row could be scored: the calibration questions need gold `answers`")
    if any(not isinstance(p["ta_retrieval"], dict) or "ta_p_ambiguous" not in p for p, _ in probes):
        raise UserError("these probe rows were written by an older ragsift (no Think-then-Act split branch): "
                        "rerun calibrate with --force or into a new --output")

    def value(field, p, g):
        return quality(p[field], g["answers"])

    out = {}
    know, curve = switch_threshold([p["know_p_yes"] for p, _ in probes], [value("raisf_closed", p, g) for p, g in probes],
                                   [value("read", p, g) for p, g in probes])
    out["raisf.know_threshold"] = {"value": know, "n": len(probes), "curve": curve}
    # Think-then-Act: what it reads first, then both of its switches against that read
    by_context = {c: sum(quality(p["ta_retrieval"][c], g["answers"]) for p, g in probes) / len(probes)
                  for c in CONTEXTS}
    context = max(CONTEXTS, key=lambda c: (round(by_context[c], 9), -CONTEXTS.index(c)))
    out["think_act.context"] = {"value": context, "n": len(probes), "quality": by_context}
    read = [quality(p["ta_retrieval"][context], g["answers"]) for p, g in probes]
    # it answers closed-book when beta >= beta', else retrieves
    beta, curve = switch_threshold([p["ta_beta"] for p, _ in probes], [value("ta_closed", p, g) for p, g in probes], read)
    out["think_act.beta_threshold"] = {"value": beta, "n": len(probes), "curve": curve}
    # it splits when P(AMBIGUOUS) >= t, else goes on as it would at the beta' just chosen; a split
    # into nothing new goes on the same way
    goes_on = [value("ta_closed", p, g) if p["ta_beta"] >= beta else r for (p, g), r in zip(probes, read)]
    split = [r if p["ta_sub_queries"] is None else quality(p["ta_sub_queries"], g["answers"])
             for (p, g), r in zip(probes, goes_on)]
    cut, curve = switch_threshold([p["ta_p_ambiguous"] for p, _ in probes], split, goes_on)
    out["think_act.ambiguity_threshold"] = {"value": cut, "n": len(probes), "curve": curve}
    pairs = [(s, pid in set(g.get("gold_passage_ids") or [])) for p, g in probes if g.get("gold_passage_ids")
             for pid, s in zip(p["top_k"], p["relevance_p_yes"])]
    if pairs:
        rel, curve = f1_threshold([s for s, _ in pairs], [gold_ for _, gold_ in pairs])
        asked = [p for p, g in probes if g.get("gold_passage_ids")]
        share = sum(any(s >= rel for s in p["relevance_p_yes"]) for p in asked) / len(asked)
        out["raisf.relevance_threshold"] = {"value": rel, "n": len(pairs), "questions_with_a_relevant_passage": share,
                                            "curve": curve}
    best = [p["migres_scores"][0] for p, _ in probes if p["migres_scores"]]
    if best:
        out["migres.relevance_threshold"] = {"value": round(keep_threshold(best, keep), 6), "n": len(best), "keep": keep}
    return out


def config_values(config, chosen: dict, fingerprint: str, n: int) -> dict:
    """The calibrated config file's content: the chosen values, the models they were measured with (a
    threshold on P('yes') belongs to the model that judged: flags such as --generator still override),
    and a ``calibration`` section that run metadata carries."""
    values: dict = {"generator": {"model": config.generator.model}}
    if config.judge is not None:
        values["judge"] = {"model": config.judge.model}
    # so do the trained judges and the ranker: RA-ISF's thresholds are on their scores when they judge, and
    # MIGRES's delta is on the ranker's (without them in the file, a trained M_know's 0.76 would be applied
    # to the generator's P('yes'))
    raisf = {key: getattr(config.raisf, key) for key in ("judges", "know_judge", "relevance_judge")
             if getattr(config.raisf, key) != type(config.raisf).model_fields[key].default}
    if raisf:
        values["raisf"] = raisf
    if config.raisf.know_by == "trained":
        values["know"] = {"model": config.know.model}
    if config.reranker.model:
        values["reranker"] = {"model": config.reranker.model}
    for field, result in chosen.items():
        section, key = field.split(".")
        values.setdefault(section, {})[key] = result["value"]
    values["calibration"] = {
        "questions": redact(config.questions), "questions_sha256": fingerprint, "n": n,
        "generator": config.generator.model, "judge": config.judge.model if config.judge else None,
        "ranker": ranker_name(config),
        "chosen": {field: result["value"] for field, result in chosen.items()}}
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    answer_job.add_arguments(p)
    p.add_argument("--keep", type=float, default=0.8,
                   help="MIGRES: share of questions that must keep a passage at delta (its paper: 0.8)")


def run(args: argparse.Namespace) -> int:
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    config = answer_job.config_from_args(args)
    config = config.model_copy(update={"strategies": [PROBE]})
    cols = question_columns(config.questions)
    if "answers" not in cols:
        raise UserError(f"{config.questions}: calibration needs gold `answers`")
    answer_job.answer(config, log=log, force=args.force)
    gold = {r["id"]: r for r in read_table(config.questions, ["id", *[c for c in ("answers", "gold_passage_ids")
                                                                      if c in cols]]).to_pylist()}
    rows = [r for f in answer_files(f"{config.output}/{PROBE}") for r in read_table(f).to_pylist()]
    chosen = choose(rows, gold, args.keep)
    qfs, qpath = filesystem(config.questions)
    fingerprint = file_sha256(qfs, qpath)
    fs, root = filesystem(config.output)
    values = config_values(config, chosen, fingerprint, len(rows))
    with fs.open_output_stream(f"{root}/calibration.json") as f:
        f.write(json.dumps(chosen, indent=2).encode())
    text = ("# ragsift calibrate: thresholds chosen on the calibration slice named below; pass with --config\n"
            + yaml.safe_dump(values, sort_keys=False))
    with fs.open_output_stream(f"{root}/calibrated.yaml") as f:
        f.write(text.encode())
    for field, result in chosen.items():
        extra = {k: v for k, v in result.items() if k not in ("value", "curve")}
        log(f"{field} = {result['value']}  {extra}")
    log(f"wrote {redact(config.output)}/calibrated.yaml and calibration.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("calibrate", argv)


if __name__ == "__main__":
    sys.exit(main())
