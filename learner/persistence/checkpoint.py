"""Checkpoints as safetensors files: written atomically, the newest N kept, damage refused by name.

A checkpoint is one safetensors file: raw tensor bytes and a JSON header, no pickle anywhere. Its
metadata holds the run's counters and schedule as one JSON string (safetensors metadata is
str -> str) and a SHA-256 of the tensor bytes, so a file that was cut short or damaged is refused
with its name and the reason, and the one before it is used. A file is written under a temporary
name, fsynced and moved into place with os.replace: neither a reader nor a learner killed
mid-write ever leaves half a checkpoint under a checkpoint's name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from clusterenv.learner.config import CheckpointConfig

log = logging.getLogger(__name__)

# /2: one entry per component (learner/persistence/components.py); /1 files are refused by name.
FORMAT = "clusterenv-checkpoint/2"
PERIODIC_DIR = "checkpoints"
_PERIODIC = re.compile(r"^ckpt-(\d+)\.safetensors$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and why."""


def save_checkpoint(
    directory: Path, name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> Path:
    """Write `name`.safetensors into `directory`; a reader never sees a half-written file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.safetensors"
    tmp = path.with_name(path.name + ".tmp")
    blob = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, dict(metadata))
    with open(tmp, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # and so is the rename
    finally:
        os.close(fd)
    return path


def digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and the JSON state of a periodic checkpoint; CheckpointError if unusable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    if meta.get("format") == "clusterenv-checkpoint/1":
        raise CheckpointError(f"{path}: written by an older clusterenv (before every component "
                              "saved itself); this version cannot resume from it")  # fmt: skip
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not a clusterenv checkpoint (format {meta.get('format')!r})"
        )
    if meta.get("digest") != digest(tensors):
        raise CheckpointError(f"{path}: damaged (its tensors do not match their checksum)")
    try:
        state = json.loads(meta["state"])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: damaged state ({exc})") from None
    return tensors, state


class Checkpoints:
    """The periodic checkpoints of one run directory (RUN_DIR/checkpoints/ckpt-NNNNNNNN)."""

    def __init__(
        self, run_dir: Path, cfg: CheckpointConfig, clock: Callable[[], float] = time.monotonic
    ):
        self.directory, self.cfg, self.clock = run_dir / PERIODIC_DIR, cfg, clock
        self._last_at, self._last_updates = clock(), 0

    def due(self, updates: int) -> bool:
        """Whether `checkpoint_every_s` or `checkpoint_every_updates` has passed since the last."""
        every_s, every_u = self.cfg.checkpoint_every_s, self.cfg.checkpoint_every_updates
        return bool(
            (every_s and self.clock() - self._last_at >= every_s)
            or (every_u and updates - self._last_updates >= every_u)
        )

    def paths(self) -> list[Path]:
        """Periodic checkpoints on disk, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(_PERIODIC.match(p.name), p) for p in self.directory.iterdir()]
        return [p for _, p in sorted((int(m[1]), p) for m, p in found if m)]

    def save(
        self, tensors: Mapping[str, torch.Tensor], state: dict[str, Any], updates: int
    ) -> Path:
        """Write the next checkpoint, then delete all but the newest `checkpoints_kept`."""
        paths = self.paths()
        seq = int(_PERIODIC.match(paths[-1].name)[1]) + 1 if paths else 0
        meta = {"format": FORMAT, "state": json.dumps(state), "digest": digest(tensors)}
        path = save_checkpoint(self.directory, f"ckpt-{seq:08d}", tensors, meta)
        for old in [*self.paths()[: -self.cfg.checkpoints_kept], *self.directory.glob("*.tmp")]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
        self._last_at, self._last_updates = self.clock(), updates
        return path

    def newest(self) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]]:
        """The newest usable checkpoint; a damaged one is logged and the one before it tried."""
        problems = []
        for path in reversed(self.paths()):
            try:
                return (path, *load_checkpoint(path))
            except CheckpointError as exc:
                log.warning("%s; trying the checkpoint before it", exc)
                problems.append(str(exc))
        raise CheckpointError(
            f"no usable checkpoint in {self.directory}" + "".join(f"; {p}" for p in problems)
        )
