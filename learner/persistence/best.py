"""best.safetensors: the acting network of the best greedy evaluation so far (RL-Zoo's best model).

The greedy return of the newest network swings once a bar is reached (docs/benchmarks.md,
presets), so a run keeps, beside final.safetensors, the network whose evaluation scored highest.
Evaluation runs on the workers and its result comes back later, so the weights of the version
asked about are held here until its result arrives; the file is written only when every part of
that evaluation ran exactly that version (a part may fall back to a newer one, and then the
score is not this network's). The file holds what the workers act with (the weight-name
contract of pipeline/policy.py, no prefix) and says in its metadata which evaluation chose it;
`clusterenv eval` reads it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from clusterenv.learner.persistence.checkpoint import save_checkpoint

log = logging.getLogger(__name__)

BEST = "best"


class Evaluated(Protocol):
    """What the keeper reads of a finished evaluation (learner/run/evaluation.py's EvalResult)."""

    version: int
    env_steps: int
    returns: np.ndarray
    versions_evaluated: set[int]


class BestKeeper:
    """The run's best.safetensors and the evaluation that chose it (`chosen`, None until one has)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.path = run_dir / f"{BEST}.safetensors"
        self.chosen: dict[str, float | int] | None = self._read()  # a resumed run's best so far
        self._asked: tuple[int, Mapping[str, np.ndarray]] | None = None

    @property
    def mean(self) -> float:
        return float(self.chosen["eval_mean"]) if self.chosen is not None else -math.inf

    def _read(self) -> dict[str, float | int] | None:
        if not self.path.is_file():
            return None
        try:
            with safe_open(str(self.path), framework="pt") as f:
                return json.loads((f.metadata() or {})["best"])
        except (SafetensorError, OSError, KeyError, ValueError) as exc:
            log.warning("%s is unreadable (%s); the next evaluation replaces it", self.path, exc)
            return None

    def asked(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """An evaluation of `version`, whose acting network is `weights`, was requested."""
        self._asked = (version, weights)

    def evaluated(self, result: Evaluated, mean: float) -> bool:
        """Keep the network if its evaluation is the best so far; whether it was kept."""
        if self._asked is None or self._asked[0] != result.version:
            return False
        if result.versions_evaluated != {result.version} or not mean > self.mean:
            return False
        chosen = {"eval_mean": mean, "eval_episodes": len(result.returns),
                  "env_steps": result.env_steps, "version": result.version}  # fmt: skip
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self._asked[1].items()}
        save_checkpoint(self.run_dir, BEST, tensors, {"best": json.dumps(chosen)})
        self.chosen = chosen
        return True
