#!/usr/bin/env bash
# `ragsift train relevance --architecture cross-encoder` on a GPU machine, from pairs mined where the
# index is (`ragsift train relevance ... --mine-only`). Written for this workplace's lent GPU machine,
# which has PyTorch and sentence-transformers but no ragsift install, no index and no network:
#   - the pairs and the base MiniLM travel in $CARRY (the base as fp16, to fit the 64 MiB transfer;
#     widened back to fp32 here before training, so the optimiser works on fp32 weights);
#   - the packages ragsift's train job needs beyond that image travel as wheels in .whl (on the
#     2026-11-27 image: sentence-transformers, and pydantic and datasets with the dependencies they
#     lack there: pydantic-core, annotated-types, typing-inspection, typing-extensions, dill,
#     multiprocess, xxhash, fsspec; binary wheels for its Python, 3.12);
#   - each setting in SETTINGS is trained, the one with the best held-out AUC (on the pairs' own
#     held-out questions, never a reported slice) is sent back as fp16, tarred and split in 15 MB parts.
# Usage there: CARRY=.devcarry [SETTINGS=2e-5:3] [LIMIT_S=330] bash benchmarks/train_relevance_gpu.sh
# Back here: cat <files_at>/model.tar.part-* | tar -C runs/models/m_rel_ce -xf - &&
#            python benchmarks/cast_weights.py runs/models/m_rel_ce runs/models/m_rel_ce float32
set -uo pipefail
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-runs/gpu_out}
SETTINGS=${SETTINGS:-"2e-5:3 5e-5:2"}  # learning rate : epochs
LIMIT_S=${LIMIT_S:-300}  # per setting; 2e-5:3 took 201 s and 206 s on an H200 (a third try hit the old 200 s)
mkdir -p "$OUT"
WHEELS=${WHEELS:-.whl}  # none there: use the Python environment as it is
if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 benchmarks/cast_weights.py "$CARRY/base16" /tmp/base32 float32 || exit 1
python3 -c 'import torch, transformers, sentence_transformers as st
print("torch", torch.__version__, "transformers", transformers.__version__, "sentence-transformers", st.__version__)'
for setting in $SETTINGS; do
  lr=${setting%%:*}; epochs=${setting##*:}
  start=$(date +%s)
  timeout "$LIMIT_S" python3 -m jobs.train relevance --pairs "$CARRY/pairs.parquet" --base /tmp/base32 \
      --architecture cross-encoder --output "/tmp/ce_$lr" --learning-rate "$lr" --epochs "$epochs" --bf16 \
      --batch-size 32 --max-length 256 2>&1 | grep -v -E "it/s\]|s/it\]" | tail -5
  echo "setting lr=$lr epochs=$epochs: $(( $(date +%s) - start )) s"
done
best=$(python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
cards = {d: json.load(open(f"{d}/card.json")) for d in sorted(glob.glob("/tmp/ce_*")) if os.path.exists(f"{d}/card.json")}
json.dump(cards, open(f"{out}/cards.json", "w"), indent=2)
if not cards:
    sys.exit("no setting finished")
best = max(cards, key=lambda d: cards[d]["metrics"]["held_out_auc"])
print("best", best, cards[best]["metrics"], file=sys.stderr)
print(best)
PY
) || exit 1
python3 benchmarks/cast_weights.py "$best" "$best" float16 || exit 1
tar -C "$best" -cf - . | split -b 15m - "$OUT/model.tar.part-"
ls -la "$OUT"
