"""``ragsift calibrate``: choose the strategies' thresholds on a calibration slice, the papers' way.

    ragsift calibrate --questions calib.parquet --index-dir idx --output runs/calib [--generator ...]

One pass of the ``calibration_probe`` strategy over the slice (strategies/calibration_probe.py)
records, per question, the scores each threshold cuts and the answers of the branches it chooses
between; every candidate value is then scored offline against the gold answers (">= t" below is
``strategies.base.passes``: a cut of 1 passes no score, as the strategies read it):

    raisf.know_threshold        answer closed-book when P('yes') >= t, else read the top k (with
                                rag's instruction, or RA-ISF's own when it reads all k with the
                                paper's): the t whose mix answers best (score = (F1 + accuracy) / 2;
                                ties, within one question's worth (1/n) of the best -> the higher
                                t, i.e. retrieve more)
    think_act.context,          read the top 3 sentences, the top 3 passages, or k of either, under
    think_act.top_sentences,    its instruction or rag's (the probe's ``readings``): the one whose
    think_act.answer_prompt     answers score best (ties -> its instruction before rag's, sentences
                                before passages, fewer before more: the paper's reading first)
    think_act.beta_threshold    retrieve when beta < beta': likewise, against that read (ties, as
                                above -> the higher beta')
    think_act.ambiguity_threshold
                                split into sub-queries when P(AMBIGUOUS) >= t, else go on (at that
                                beta'): likewise (ties, as above -> the higher t, i.e. split less). The probe
                                answers sub-queries under the config it runs with (context, beta')
    raisf.relevance_threshold   a passage is relevant when P('yes') >= t: the t with the best F1
                                against the gold passages among the top k. With ``raisf.read:
                                retrieved`` the cut only switches between reading all k (rag's
                                request) and decomposing, so it is chosen by answers instead: a
                                second pass runs RA-ISF itself over the slice at the F1 cut t0
                                (into ``<output>/decomposition_pass``), and for each t <= t0 a
                                question whose passages all score below t takes its decomposition
                                answer from that pass, every other one its read of all k (the
                                probe's); the best t (ties -> the lower t, decomposing less). The
                                sub-questions' nodes read and cut as at t0: an approximation
    migres.relevance_threshold  the largest delta at which ``--keep`` (0.8) of the questions keep a
                                passage of their top N (MIGRES Section 4 / Table 11)
    answer_form.verdict_cut     (claims with two verdicts in the slice) answer the first verdict when its
                                probability in rag's read of the top k is >= t, else the second: likewise
                                (ties -> the higher t). The likelier label can be the same for every
                                claim while the probability still ranks them (results/README.md, "Claims")

Writes ``<output>/calibrated.yaml`` (a config file for ``--config``: the values, every setting that
decides answers they were measured under, and a ``calibration`` section naming the slice, the sha256
of its file as given and the models, which run metadata then carries) and ``<output>/calibration.json``
(every candidate's score). Use a slice that you do not report on: the thresholds are fitted to it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import ExitStack

import pyarrow.fs as pafs

from jobs import answer as answer_job
from jobs import metrics as M
from jobs.chunks import passage_of
from jobs.evaluate import answer_files, reads_split_index
from jobs.identity import know_model, ranker_name
from jobs.pools import build_stages, llm_engines_stopped, pool_plan, ray_request
from jobs.question_sources import sha256_of, source_sha256
from jobs.questions import by_first_id, question_columns
from jobs.request_cache import open_cache
from jobs.storage import filesystem, join, read_table, redact
from schemas.config import IndexConfig, dump_yaml, speed_setting
from schemas.errors import UserError
from strategies.base import passes
from strategies.calibration_probe import reading_of
from strategies.raisf import DECOMPOSED
from strategies.registry import make_strategy

PROBE = "calibration_probe"
DECOMPOSITION_PASS = "decomposition_pass"
WRITTEN = ("calibration.json", "calibrated.yaml")
# every field calibrate may choose: the file holds its choice, never the base config's value
CHOSEN = {"raisf.know_threshold", "raisf.relevance_threshold", "think_act.context", "think_act.top_sentences",
          "think_act.answer_prompt", "think_act.beta_threshold", "think_act.ambiguity_threshold",
          "migres.relevance_threshold", "answer_form.verdict_cut"}
# the run's own, not what its answers were measured under: which questions (and how their file is read),
# where it writes, and the calibration record, which the file writes anew
RUN_OWN = {"questions", "output", "strategies", "limit", "input.columns", "input.split", "commit", "calibration"}
# --force discards an output only when its config changed, and the code's version is not part of that
STALE = f"rerun calibrate into a new --output, or delete its {PROBE}/ folder first"


def candidates(scores: list[float]) -> list[float]:
    """0, the midpoints between neighbouring distinct scores, and 1: a cut between two observed
    scores, not on one, so ``>=`` and ``>`` agree on the slice; 0 passes every score and 1 none
    (``strategies.base.passes``), as the strategies read them."""
    distinct = sorted({s for s in scores if math.isfinite(s)})  # a NaN score passes no cut: no cut beside it
    return [0.0, *(midpoint(a, b) for a, b in zip(distinct, distinct[1:])), 1.0]


def midpoint(a: float, b: float) -> float:
    """Between ``a`` and ``b``, in six decimals where they still fall between (a judge's 0.9999993 and
    1.0 round to one number, and the cut that told them apart was lost)."""
    short = round((a + b) / 2, 6)
    return short if a < short < b else (a + b) / 2


def switch_curve(scores: list[float], above: list[float], below: list[float], cuts: list[float]) -> list[dict]:
    """The mean value of "use ``above`` when score >= t, else ``below``" at each t of ``cuts``."""
    return [{"t": t, "value": sum(a if passes(s, t) else b for s, a, b in zip(scores, above, below)) / len(scores),
             "above": sum(passes(s, t) for s in scores) / len(scores)} for t in cuts]


def switch_threshold(scores: list[float], above: list[float], below: list[float]) -> tuple[float, list[dict]]:
    """The t for "use ``above`` when score >= t, else ``below``" with the best mean value, and every
    candidate's value. A cut that beats a higher one by less than one question's worth (1/n) is a
    tie, and ties go to the higher t: sending a fifth of the slice down a costlier branch for a tenth of
    a question is noise, not a choice."""
    curve = switch_curve(scores, above, below, candidates(scores))
    top = max(c["value"] for c in curve)
    best = max((c for c in curve if c["value"] > top - 1 / len(scores) + 1e-9), key=lambda c: c["t"])
    return best["t"], curve


def f1_threshold(scores: list[float], gold: list[bool]) -> tuple[float, list[dict]]:
    """The t for "relevant when score >= t" with the best F1 against ``gold`` (ties -> the higher t)."""
    curve = []
    for t in candidates(scores):
        tp = sum(passes(s, t) and g for s, g in zip(scores, gold))
        fp = sum(passes(s, t) and not g for s, g in zip(scores, gold))
        fn = sum(not passes(s, t) and g for s, g in zip(scores, gold))
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        curve.append({"t": t, "F1": f1, "precision": tp / (tp + fp) if tp + fp else 0.0,
                      "recall": tp / (tp + fn) if tp + fn else 0.0})
    best = max(curve, key=lambda c: (round(c["F1"], 9), c["t"]))
    return best["t"], curve


def keep_threshold(best_scores: list[float], keep: float) -> float:
    """A delta at which a share ``keep`` of the questions keeps their best-scoring passage, as high as that
    allows: midway between the last question it must keep and the next lower score, not on the first one's
    score. The ranker scores a passage a little differently in another batch (~1e-7 for the bi-encoder),
    so a delta on the boundary question's own score lost that question (and any tied with it) at random:
    75% of a slice kept a passage where 80% were promised."""
    ranked = sorted((s for s in best_scores if math.isfinite(s)), reverse=True)
    boundary = ranked[max(0, math.ceil(keep * len(ranked) - 1e-9) - 1)]
    # no question scores lower: any cut under the boundary keeps them all; a margin well past batch noise
    lower = next((s for s in ranked if s < boundary), boundary - 0.01)
    return midpoint(lower, boundary)


def quality(prediction: str, golds: list[str], verdicts: tuple[str, ...] = ()) -> float:
    """One answer's value for the switch objectives: (F1 + accuracy) / 2; ``verdicts``: the claim labels, a gold
    among them matched as a label ("NOT SUPPORTED" is no "SUPPORTED")."""
    return (M.f1(prediction, golds) + M.accuracy(prediction, golds, verdicts)) / 2


def first_step(row: dict, step: str) -> dict | None:
    """The first trace entry of ``step`` in an answer row (a root's own, before its sub-questions')."""
    return next((t for t in json.loads(row["trace"] or "[]") if t.get("step") == step), None)


def choose(rows: list[dict], gold: dict[str, dict], keep: float, parts: bool = False,
           verdicts: tuple[str, str] = ("SUPPORTS", "REFUTES")) -> dict:
    """Every threshold from the probe rows joined with their gold; a dict per config field. ``parts``: the
    probe read an index of split passages (index.chunk_words), a part of a gold passage counting as gold;
    ``verdicts``: the two labels of a claim (answer_form.verdicts), where the probe recorded claims."""
    probes = []
    for row in rows:
        g = gold.get(row["id"])
        p = first_step(row, "probe")
        if row["error"] or not g or not M.gold_answers(g.get("answers")) or not p or "ta_retrieval" not in p:
            continue
        probes.append((p, g))
    if not probes:
        errors = [row["error"] for row in rows if row["error"]]
        if errors:  # the gold is not what is missing: say what failed, as the rows do
            raise UserError(f"no probe row could be scored: {len(errors)} of {len(rows)} probe rows are errors, "
                            f"e.g. {errors[0]}")
        raise UserError("no probe row could be scored: the calibration questions need gold `answers`")
    if any(not isinstance(p["ta_retrieval"], dict) or "ta_p_ambiguous" not in p for p, _ in probes):
        raise UserError(f"these probe rows were written by an older ragsift (no Think-then-Act split branch): {STALE}")
    if any(set(p["ta_retrieval"]) != set(probes[0][0]["ta_retrieval"]) or reading_of(next(iter(p["ta_retrieval"]), "")) is None
           for p, _ in probes):
        raise UserError("these probe rows were written by an older ragsift (Think-then-Act read at one count, "
                        f"one instruction): {STALE}")

    def score(prediction, golds):
        return quality(prediction, golds, tuple(verdicts))

    def value(field, p, g):
        return score(p[field], g["answers"])

    out = {}
    know, curve = switch_threshold([p["know_p_yes"] for p, _ in probes], [value("raisf_closed", p, g) for p, g in probes],
                                   [value("raisf_read" if "raisf_read" in p else "read", p, g) for p, g in probes])
    out["raisf.know_threshold"] = {"value": know, "n": len(probes), "curve": curve}
    # Think-then-Act: what it reads first, then both of its switches against that read
    keys = list(probes[0][0]["ta_retrieval"])  # the probe's order: the paper's reading first
    by_reading = {key: sum(score(p["ta_retrieval"][key], g["answers"]) for p, g in probes) / len(probes)
                  for key in keys}
    best = max(keys, key=lambda key: (round(by_reading[key], 9), -keys.index(key)))
    style, context, top = reading_of(best)
    out["think_act.context"] = {"value": context, "n": len(probes), "quality": by_reading}
    out["think_act.top_sentences"] = {"value": top, "n": len(probes)}
    out["think_act.answer_prompt"] = {"value": style, "n": len(probes)}
    read = [score(p["ta_retrieval"][best], g["answers"]) for p, g in probes]
    # it answers closed-book when beta >= beta', else retrieves
    beta, curve = switch_threshold([p["ta_beta"] for p, _ in probes], [value("ta_closed", p, g) for p, g in probes], read)
    out["think_act.beta_threshold"] = {"value": beta, "n": len(probes), "curve": curve}
    # it splits when P(AMBIGUOUS) >= t, else goes on as it would at the beta' just chosen; a split
    # into nothing new goes on the same way
    goes_on = [value("ta_closed", p, g) if passes(p["ta_beta"], beta) else r for (p, g), r in zip(probes, read)]
    split = [r if p["ta_sub_queries"] is None else score(p["ta_sub_queries"], g["answers"])
             for (p, g), r in zip(probes, goes_on)]
    cut, curve = switch_threshold([p["ta_p_ambiguous"] for p, _ in probes], split, goes_on)
    out["think_act.ambiguity_threshold"] = {"value": cut, "n": len(probes), "curve": curve}
    pairs = [(s, (passage_of(pid) if parts else pid) in set(g.get("gold_passage_ids") or []))
             for p, g in probes if g.get("gold_passage_ids")
             for pid, s in zip(p["top_k"], p["relevance_p_yes"])]
    if any(gold_ for _, gold_ in pairs):  # with no gold passage retrieved every cut scores F1 0: none to choose
        rel, curve = f1_threshold([s for s, _ in pairs], [gold_ for _, gold_ in pairs])
        asked = [p for p, g in probes if g.get("gold_passage_ids")]
        share = sum(any(passes(s, rel) for s in p["relevance_p_yes"]) for p in asked) / len(asked)
        out["raisf.relevance_threshold"] = {"value": rel, "n": len(pairs), "questions_with_a_relevant_passage": share,
                                            "curve": curve}
    best = [p["migres_scores"][0] for p, _ in probes if p["migres_scores"] and math.isfinite(p["migres_scores"][0])]
    if best:
        out["migres.relevance_threshold"] = {"value": keep_threshold(best, keep), "n": len(best), "keep": keep}
    claims = [(p["verdict_p_first"], g) for p, g in probes if p.get("verdict_p_first") is not None]
    if claims:
        first, second = verdicts
        cut, curve = switch_threshold([s for s, _ in claims], [score(first, g["answers"]) for _, g in claims],
                                      [score(second, g["answers"]) for _, g in claims])
        out["answer_form.verdict_cut"] = {"value": cut, "n": len(claims), "curve": curve}
    return out


def reads_all(raisf) -> bool:
    """RA-ISF's relevance cut switches between reading all k and decomposing."""
    return raisf.read == "retrieved" and raisf.passage_relevance and raisf.decomposition


def read_all_threshold(raisf_rows: list[dict], probe_rows: list[dict], gold: dict[str, dict], f1_cut: dict,
                       verdicts: tuple[str, ...] = ()) -> dict:
    """RA-ISF's relevance cut under ``read: retrieved``, by answers (module docstring): ``raisf_rows``
    are RA-ISF's answers at the F1 cut ``f1_cut`` (``choose``'s result), ``probe_rows`` hold each
    question's read of all k; ``verdicts``: the run's claim labels, as ``quality`` reads them."""
    reads = {}
    for row in probe_rows:
        p = first_step(row, "probe")
        if p is not None and not row["error"]:
            if "raisf_read" not in p:
                raise UserError(f"these probe rows were written by an older ragsift (no RA-ISF read of all k): {STALE}")
            reads[row["id"]] = p["raisf_read"]
    t0 = f1_cut["value"]
    scores, read, below = [], [], []
    for row in raisf_rows:
        g = gold.get(row["id"])
        relevance = first_step(row, "relevance")
        # a question answered closed-book (self-knowledge) never reaches the cut
        if (row["error"] or not g or not M.gold_answers(g.get("answers")) or row["id"] not in reads or relevance is None
                or row["resolved_by"] not in ("passages", *DECOMPOSED)):
            continue
        decomposed = row["resolved_by"] in DECOMPOSED
        # the trace's scores are rounded: at t0 the pass's own branch decides; no passage is always decomposed
        best = max(relevance["p_yes"], default=-math.inf)
        scores.append(min(best, math.nextafter(t0, -math.inf)) if decomposed else max(best, t0))
        read.append(quality(reads[row["id"]], g["answers"], verdicts))
        # below t <= t0 is only ever a question RA-ISF decomposed at t0
        below.append(quality(row["answer"] or "", g["answers"], verdicts) if decomposed else read[-1])
    if not scores:
        raise UserError("no RA-ISF row of the decomposition pass could be scored against the probe's reads")
    cuts = {c for c in candidates([s for s in scores if s > -math.inf]) if c <= t0} | {t0}
    curve = switch_curve(scores, read, below, sorted(cuts))
    best = max(curve, key=lambda c: (round(c["value"], 9), -c["t"]))
    return {"value": best["t"], "by": "answers: read all k or decompose (raisf.read: retrieved)", "n": len(scores),
            "decomposed": sum(s < best["t"] for s in scores) / len(scores),
            "passage_f1_cut": f1_cut, "curve": curve}


def pass_config(config, know: float, relevance: float):
    """The probe's config as RA-ISF's own run at the thresholds chosen so far (validated: its node budget
    and depth are checked before the probe, not after it)."""
    data = config.model_dump()
    data["raisf"].update(know_threshold=know, relevance_threshold=relevance)
    run = type(config).model_validate({**data, "strategies": ["raisf"], "output": join(config.output, DECOMPOSITION_PASS)})
    make_strategy("raisf", run)
    return run


def decomposition_pass(config, chosen: dict, probe_rows: list[dict], gold: dict[str, dict], log, **shared) -> dict:
    """RA-ISF over the slice at the thresholds chosen so far, then its read-all cut from its answers."""
    run = pass_config(config, chosen["raisf.know_threshold"]["value"], chosen["raisf.relevance_threshold"]["value"])
    log(f"raisf.read is 'retrieved': RA-ISF at relevance cut {run.raisf.relevance_threshold} into {redact(run.output)}")
    answer_job.answer(run, log=log, **shared)
    rows = [r for f in answer_files(join(run.output, "raisf")) for r in read_table(f).to_pylist()]
    return read_all_threshold(rows, probe_rows, gold, chosen["raisf.relevance_threshold"],
                              tuple(config.answer_form.verdicts))


def shared_stages(config) -> dict:
    """One set of actor pools and one request cache for both passes (RA-ISF's stages are the probe's):
    a second set would load the models again, and hold a multi-device pool's placement groups twice."""
    from jobs.ray_session import init_ray

    needs = make_strategy(PROBE, config).stages
    pools = pool_plan(config, needs)
    init_ray(config.ray, *ray_request(config, pools))
    return {"stages": build_stages(config, needs, pools), "cache": open_cache(config) if config.cache.enabled else None}


def model_settings(llm) -> dict:
    """A generator's or judge's settings that decide its answers, where they are not the defaults, and
    its model always: what a file passed alone with --config must carry to judge as calibrated (with only
    the model's name, an endpoint's pool became a local vLLM of that name at another context length).
    Speed and placement settings (replicas, GPUs) stay the user's."""
    defaults = type(llm)().model_dump()
    return {key: value for key, value in llm.model_dump().items()
            if key == "model" or (value != defaults[key] and not speed_setting(type(llm), key))}


def config_values(config, chosen: dict, fingerprint: str | None, n: int, questions: str | None = None,
                  converted: str | None = None) -> dict:
    """The calibrated config file's content: the chosen values, every setting they were measured under
    (``answer_settings``: a file passed alone with --config answers as the probe did; flags such as
    --generator still override), and a ``calibration`` section that run metadata carries. ``questions``:
    the slice as the user named it, ``fingerprint`` its file's sha256 (None for a ``datasets`` folder or
    ``hf:`` name, not one file); ``converted``: the sha256 of the Parquet copy ragsift answered
    (``config.questions``), where it converted the slice."""
    values = answer_settings(config)
    for field, result in chosen.items():
        section, key = field.split(".")
        values.setdefault(section, {})[key] = result["value"]
    if "answer_form.verdict_cut" in chosen:  # a cut on P(first verdict): the labels' order goes with it
        values["answer_form"]["verdicts"] = list(config.answer_form.verdicts)
    values["calibration"] = {
        "questions": redact(questions or config.questions), "questions_sha256": fingerprint,
        **({"converted_sha256": converted} if converted else {}),
        **({"split": config.input.split} if config.input.split else {}), "n": n,
        "generator": config.generator.model, "judge": config.judge.model if config.judge else None,
        "ranker": ranker_name(config), "know": know_model(config),
        "chosen": {field: result["value"] for field, result in chosen.items()}}
    return values


def answer_settings(config) -> dict:
    """Every setting of ``config`` that decides answers and is not its default, as a config file holds it:
    the models (a threshold on P('yes') belongs to the model that judged; RA-ISF's are on the trained
    judges' scores when they judge, MIGRES's delta on the ranker's), sampling and retrieval (the answers
    every cut was scored by), the strategies' other settings (a cut chosen for reading all k must not be
    applied to reading P_rel) and the answer forms. Not the slice's own (``RUN_OWN``), nor how the index
    was built (its manifest says), nor the base config's value of a field calibrate chooses: the file
    holds its choice, or nothing where it chose none."""
    defaults = type(config)()
    values: dict = {}
    for name in type(config).model_fields:
        value, default = getattr(config, name), getattr(defaults, name)
        if name in RUN_OWN or value is None:
            continue
        if name in ("generator", "judge"):
            values[name] = model_settings(value)
            continue
        base = (default or type(value)()).model_dump()
        changed = {key: v for key, v in value.model_dump().items()
                   if v != base[key] and not speed_setting(type(config), f"{name}.{key}")
                   and f"{name}.{key}" not in RUN_OWN | CHOSEN and (name != "index" or key in IndexConfig.search_time)}
        if changed:
            values[name] = changed
    return values


def calibrated_yaml(values: dict) -> str:
    return ("# ragsift calibrate: thresholds chosen on the calibration slice named below; pass with --config\n"
            + dump_yaml(values))


def add_arguments(p: argparse.ArgumentParser) -> None:
    answer_job.add_arguments(p, retry_errors=False, strategy_help=argparse.SUPPRESS,  # it runs its own probe
                             output_help="output directory: the probe's answers, calibrated.yaml, calibration.json")
    p.add_argument("--keep", type=float, default=0.8,
                   help="MIGRES: share of questions that must keep a passage at delta (its paper: 0.8)")


def run(args: argparse.Namespace) -> int:
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    if not 0 < args.keep <= 1:
        raise UserError(f"--keep {args.keep}: a share of the questions, in (0, 1] (its paper: 0.8)")
    if args.strategy is not None:
        raise UserError(f"--strategy {args.strategy!r}: calibrate runs its own probe of every strategy's thresholds "
                        "(no --strategy)")
    # a calibration record in a --config (calibrating again over an earlier file) is the earlier slice's, not this one's
    given = answer_job.given_config(args, strategies=[PROBE]).model_copy(update={"calibration": None})
    config = answer_job.with_questions_read(given)
    cols = question_columns(config.questions)
    if "answers" not in cols:
        raise UserError(f"{config.questions}: calibration needs gold `answers`")
    shared, stopped = {}, ExitStack()
    if reads_all(config.raisf):
        pass_config(config, config.raisf.know_threshold, config.raisf.relevance_threshold)  # fails fast
        shared = shared_stages(config)
        # its own pools, shared by two passes (a single pass's are stopped by answer), however it ends
        stopped.enter_context(llm_engines_stopped(shared["stages"]))
    with stopped:
        metrics = answer_job.answer(config, log=log, force=args.force, **shared)
        # thresholds fitted to the rows that happened to answer would be written, and used, as the slice's
        status = answer_job.error_status("calibrate", metrics, config.commit.max_error_share,
                                         "no thresholds were written: once the cause is fixed, --force asks them again")
        if status:
            fs, root = filesystem(config.output)
            for name in WRITTEN:  # an earlier calibration's would read as this one's
                if fs.get_file_info(f"{root}/{name}").type == pafs.FileType.File:
                    fs.delete_file(f"{root}/{name}")
            return status
        gold = by_first_id(read_table(config.questions, ["id", *[c for c in ("answers", "gold_passage_ids")
                                                                 if c in cols]]).to_pylist())
        files = answer_files(join(config.output, PROBE))
        rows = [r for f in files for r in read_table(f).to_pylist()]
        # from the probe's own record (its identity), not the index folder, which may have been rebuilt since
        chosen = choose(rows, gold, args.keep, parts=reads_split_index(files), verdicts=tuple(config.answer_form.verdicts[:2]))
        if reads_all(config.raisf) and "raisf.relevance_threshold" in chosen:
            chosen["raisf.relevance_threshold"] = decomposition_pass(config, chosen, rows, gold, log, force=args.force,
                                                                     **shared)
        answered = sum(not r.get("error") for r in rows)  # the rows the thresholds rest on
        values = config_values(config, chosen, source_sha256(given.questions), answered, questions=given.questions,
                               converted=sha256_of(config.questions) if config.questions != given.questions else None)
        fs, root = filesystem(config.output)
        with fs.open_output_stream(f"{root}/calibration.json") as f:
            f.write(json.dumps(chosen, indent=2).encode())
        with fs.open_output_stream(f"{root}/calibrated.yaml") as f:
            f.write(calibrated_yaml(values).encode())
        for field, result in chosen.items():
            extra = {k: {kk: vv for kk, vv in v.items() if kk != "curve"} if isinstance(v, dict) else v
                     for k, v in result.items() if k not in ("value", "curve")}
            log(f"{field} = {result['value']}  {extra}")
        if "raisf.relevance_threshold" not in chosen:  # not written: a run with this file keeps the config's own cut
            log("raisf.relevance_threshold not calibrated: no calibration question has a gold passage among its "
                "top k (gold_passage_ids of this index)")
        log(f"wrote {redact(config.output)}/calibrated.yaml and calibration.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    from jobs.cli import run_job

    return run_job("calibrate", argv)


if __name__ == "__main__":
    sys.exit(main())
