"""Checkpoints as safetensors files, written atomically (temp file + os.replace), last N kept."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save_checkpoint(
    directory: Path,
    name: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str],
    keep: int = 3,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.safetensors"
    tmp = path.with_suffix(".safetensors.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=dict(metadata))
    os.replace(tmp, path)
    olds = sorted(directory.glob("step_*.safetensors"), key=lambda p: p.stat().st_mtime)
    for old in olds[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
