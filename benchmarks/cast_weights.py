"""Copy a model directory with its ``model.safetensors`` cast to another dtype (float16 / float32).

The lent GPU machine takes 64 MiB a call and gives back 16 MiB a file: models travel as fp16 and are
widened to fp32 before training or serving (benchmarks/train_relevance_gpu.sh).

    python benchmarks/cast_weights.py SRC DST float32     # DST may be SRC: cast in place
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def cast(src: str, dst: str, dtype: str) -> None:
    weights = load_file(f"{src}/model.safetensors")  # read before a copy in place overwrites it
    if Path(src).resolve() != Path(dst).resolve():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in weights.items()}, f"{dst}/model.safetensors",
              metadata={"format": "pt"})


if __name__ == "__main__":
    cast(*sys.argv[1:4])
