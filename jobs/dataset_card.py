"""A label run as a dataset ready to publish: ``<output>/labels/dataset/``, laid out as a Hugging Face
dataset repository, so ``datasets.load_dataset(<that folder>, "relevance")`` reads it and
``ragsift label --push-to-hub REPO`` uploads it as it is:

    README.md               the dataset card: one config per label kind (YAML header), then where the
                            labels come from: source questions, models, prompts, filters, counts, licences
    data/<kind>.parquet     the label rows with their chat ``messages`` (the prompts the strategies use)
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pyarrow.json as pa_json
import pyarrow.parquet as pq
import yaml

from jobs.pools import encoder_model
from jobs.question_sources import sha256_of, source_sha256
from jobs.storage import filesystem, redact, write_whole
from schemas.errors import UserError

KINDS = ("self_knowledge", "relevance", "decomposition", "self_reasoning")
PROMPTS = {"self_knowledge": ["raisf/know.txt", "raisf/answer.txt"], "relevance": ["raisf/relevance.txt"],
           "decomposition": ["raisf/decompose.txt"], "self_reasoning": ["self_reasoning"]}
WHAT = {"self_knowledge": "question -> know / unknown: the generator's closed-book answer against gold (M_know)",
        "relevance": "(question, retrieved passage) -> relevant / irrelevant, with the judge's P(yes) (M_rel)",
        "decomposition": "question -> sub-questions, as the generator decomposed it (M_decom)",
        "self_reasoning": "Self-Reasoning trajectories kept only when their answer is correct"}


def write_dataset(output: str, summary: dict, config, source: str | None = None) -> str:
    """Write ``<output>/labels/dataset`` from the label files; returns its path. ``source``: the questions as
    the user named them, where ``config.questions`` is ragsift's converted copy."""
    fs, root = filesystem(output)
    target = f"{root}/labels/dataset"
    fs.create_dir(f"{target}/data", recursive=True)
    configs = []
    for kind in KINDS:
        if not summary.get(kind, {}).get("records"):  # not collected, or nothing kept: no empty config
            with contextlib.suppress(FileNotFoundError):  # nor an earlier run's rows, which a push would publish
                fs.delete_file(f"{target}/data/{kind}.parquet")
            continue
        rows = pq.read_table(f"{root}/labels/{kind}.parquet", filesystem=fs)
        with fs.open_input_stream(f"{root}/labels/{kind}.jsonl") as f:  # same records, same order
            messages = pa_json.read_json(f).column("messages")
        # under a temporary name first: a run killed here leaves the last run's file whole
        pq.write_table(rows.append_column("messages", messages), f"{target}/data/{kind}.parquet.tmp", filesystem=fs)
        fs.move(f"{target}/data/{kind}.parquet.tmp", f"{target}/data/{kind}.parquet")
        configs.append({"config_name": kind, "data_files": [{"split": "train", "path": f"data/{kind}.parquet"}]})
    card = card_text(configs, summary, config, source)
    write_whole(fs, f"{target}/README.md", card.encode())
    return target


def questions_line(config, source: str | None) -> str:
    """Where the questions came from: the user's file and its sha256 (not those of ragsift's Parquet copy of a
    JSON Lines, CSV or ``datasets`` source, which no one can check against theirs), and the copy read."""
    source = source or config.questions
    fingerprint = source_sha256(source)
    line = f"- Questions: `{redact(source)}`" + (f" (sha256 of the file: `{fingerprint}`)" if fingerprint else
                                                 " (a `datasets` dataset: no single file to hash)")
    if source != config.questions:
        line += f", read as ragsift's Parquet copy `{redact(config.questions)}` (sha256 `{sha256_of(config.questions)}`)"
    return line


def card_text(configs: list[dict], summary: dict, config, source: str | None = None) -> str:
    header = {"license": config.label.license, "task_categories": ["question-answering", "text-classification"],
              "tags": ["rag", "ragsift", "ra-isf", "judge-training"], "configs": configs}
    models = {"generator": config.generator.model, "judge": (config.judge or config.generator).model,
              "embedder": encoder_model(config)}  # the index's, which encoded the passages and the queries
    lines = ["---", yaml.safe_dump(header, sort_keys=False).strip(), "---", "",
             "# Judge-training labels from `ragsift label`", "",
             "Collected as RA-ISF's Appendix A describes (one pass of the generator per question), plus "
             "Self-Reasoning trajectories kept by its quality control. Each row carries `messages`: the chat "
             "prompt the strategy uses and the label as the assistant turn, ready for fine-tuning tools.", "",
             "| config | what | rows | labels |", "|---|---|---:|---|"]
    for c in configs:
        counts = summary[c["config_name"]]
        extra = {k: v for k, v in counts.items() if k != "records"}
        lines.append(f"| `{c['config_name']}` | {WHAT[c['config_name']]} | {counts['records']:,} | "
                     f"{json.dumps(extra) if extra else ''} |")
    lines += ["", "## Sources", "",
              questions_line(config, source),
              f"- Passages: the index at `{redact(config.index.path) if config.index.path else None}`",
              f"- Models: {', '.join(f'{k} `{v}`' for k, v in models.items())}; sampling "
              f"{json.dumps(config.sampling.model_dump())}",
              f"- Filters: closed-book match `{config.label.match}`; collected {config.label.collect}; citation "
              f"filter {config.label.citation_filter} (precision >= {config.label.citation_precision_min}, recall >= "
              f"{config.label.citation_recall_min})",
              f"- Licence of these labels: `{config.label.license}`. Licences of the inputs: {config.label.source_licenses}", "",
              "## Prompts", ""]
    prompts = Path(__file__).resolve().parent.parent / "strategies" / "prompts"
    for c in configs:
        for name in PROMPTS[c["config_name"]]:
            files = sorted((prompts / name).glob("*.txt")) if (prompts / name).is_dir() else [prompts / name]
            for f in files:
                lines += [f"`{f.relative_to(prompts)}` (for `{c['config_name']}`):", "", "```", f.read_text().strip(),
                          "```", ""]
    return "\n".join(lines) + "\n"


def check_hub_repo(repo: str) -> None:
    """Refuse, in one line, a push the hub would refuse: the upload is the last step of a labelling run,
    and an invalid repository id ended it there with a traceback."""
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise UserError(f"--push-to-hub {repo!r} is not a Hugging Face repository id (namespace/name): {err}") from None
    if constants.HF_HUB_OFFLINE:
        raise UserError("--push-to-hub needs the Hugging Face hub, and HF_HUB_OFFLINE is set")


def push_to_hub(folder: str, repo: str) -> None:
    """Upload the dataset folder as a Hugging Face dataset repository (needs a hub login and network)."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, repo_type="dataset", exist_ok=True)
        api.upload_folder(folder_path=folder, repo_id=repo, repo_type="dataset")
    except Exception as err:  # noqa: BLE001 - no network, no login, refused: the labels are written, say so in one line
        raise UserError(f"the labels are in {folder}, but pushing them to the hub as {repo} failed "
                        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); rerun the same "
                        "command to push them (the labelling is done and resumes as done)") from None
