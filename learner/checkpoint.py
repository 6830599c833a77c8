"""Checkpoints as safetensors files, written atomically (temp file + os.replace)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_checkpoint(
    directory: Path, name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> Path:
    """Write `name`.safetensors into `directory`; a reader never sees a half-written file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.safetensors"
    tmp = path.with_suffix(".safetensors.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=dict(metadata))
    os.replace(tmp, path)
    return path
