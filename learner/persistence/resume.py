"""`clusterenv train --resume RUN_DIR`: the run's config with the few settings that may change,
its newest usable checkpoint, the run ids of the learners that ran in it, and a lock so that
one learner at a time works in a run directory.

A resumed learner works under a new run id (`RUN_DIR name.rK`), not the dead learner's: workers
cache envs, an actor index and a weight version per run id, the dead learner's queued chunks and
stream entries carry its id, and the ingest ledger is per stream. Under a new id none of that can
be mistaken for the resumed run's; the dead learner's run is marked stopped on the broker.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.persistence.checkpoint import Checkpoints

CONFIG_FILE = "config.json"
RUN_IDS_FILE = "run_ids"
VERSION_FILE = "policy_version"  # the newest weight version any learner of the run published
LOCK_FILE = ".lock"
# Settings a resumed run may change: where it runs (machine and device), how long, how it reports
# and checkpoints.
# Anything else would make the resumed run a different experiment from the one it continues.
RESUMABLE = frozenset({
    "resume", "total_steps", "redis_url", "workers", "eval_workers", "status_every_s", "torch_threads",
    "device", "metrics_port", "metrics_host",
    "eval_timeout_s", "lost_after_s", "slots_every_s", "checkpoint_every_s",
    "checkpoint_every_updates", "checkpoints_kept", "checkpoint_replay", "chunk_time_limit_s",
    "env_faults_in_a_row",
})  # fmt: skip


@dataclass
class Resumed:
    """A checkpoint to continue from, and every run id that has worked in its run directory."""

    checkpoint: Path
    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]
    run_ids: list[str]
    newest_version: int


def saved_config(run_dir: Path) -> TrainConfig:
    """The config a run directory was started with; ValueError naming what is wrong."""
    path = run_dir / CONFIG_FILE
    try:
        return TrainConfig.from_json(path.read_text())
    except OSError:
        raise ValueError(f"{run_dir} is not a run directory (no {CONFIG_FILE})") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _flat(cfg: TrainConfig) -> dict[str, Any]:
    return {name: getattr(holder, attr) for name, (holder, attr) in cfg.settings().items()}


def check_overrides(saved: TrainConfig, given: TrainConfig) -> None:
    """ValueError (one line) for the first setting that differs from the run's and may not."""
    before, now = _flat(saved), _flat(given)
    for name, value in now.items():
        if name not in RESUMABLE and value != before[name]:
            allowed = ", ".join(f"--{n.replace('_', '-')}" for n in sorted(RESUMABLE - {"resume"}))
            raise ValueError(
                f"--{name.replace('_', '-')} {value!r} contradicts the run's {before[name]!r}; "
                f"a resumed run keeps its config except {allowed}"
            )
    if given.redis_url is not None and ":***@" in given.redis_url:  # as `redact` wrote it
        raise ValueError(
            "the run's --redis-url held a password, which config.json does not keep: "
            "give --redis-url again"
        )


def run_ids(run_dir: Path) -> list[str]:
    """Run ids of every learner that worked in `run_dir`, oldest first."""
    path = run_dir / RUN_IDS_FILE
    return path.read_text().split() if path.exists() else [run_dir.name]


def next_run_id(run_dir: Path) -> str:
    return f"{run_dir.name}.r{len(run_ids(run_dir))}"


def record_run_id(run_dir: Path, run_id: str) -> None:
    ids = [i for i in run_ids(run_dir) if i != run_id]
    (run_dir / RUN_IDS_FILE).write_text("".join(f"{i}\n" for i in [*ids, run_id]))


def record_version(run_dir: Path, version: int) -> None:
    """Note `version` as published, before it is: a resumed learner continues above it, since
    workers may still hold a version its checkpoint never saw."""
    tmp = run_dir / f"{VERSION_FILE}.tmp"
    tmp.write_text(f"{version}\n")
    os.replace(tmp, run_dir / VERSION_FILE)  # a learner killed mid-write leaves the old number


def published_version(run_dir: Path) -> int:
    try:
        return int((run_dir / VERSION_FILE).read_text())
    except (OSError, ValueError):
        return -1


def lock_run_dir(run_dir: Path) -> IO:
    """An exclusive lock on `run_dir`, held while the returned file stays open (the OS drops it
    when the learner dies, even of SIGKILL); ValueError if another learner holds it."""
    lock = (run_dir / LOCK_FILE).open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(f"{run_dir} is in use by a running learner") from None
    return lock


def load_resume(run_dir: Path, cfg: TrainConfig) -> Resumed:
    """The newest usable checkpoint of `run_dir` (CheckpointError if there is none)."""
    path, tensors, state = Checkpoints(run_dir, cfg.checkpoint).newest()
    return Resumed(path, tensors, state, run_ids(run_dir), published_version(run_dir))
