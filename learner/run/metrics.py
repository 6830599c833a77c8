"""Run metrics with namespaced keys (`eval/…`, `pipeline/…`, `learner/…`): JSON lines and
TensorBoard event files, written side by side from the same rows.

Strict JSON: a value that is not a finite number (the loss before the first update) is null, and
it is left out of the event file (a scalar there has no null).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tensorboardX import SummaryWriter

# The x axis of every row and of every TensorBoard scalar.
STEP_KEY = "env_steps"


class MetricsWriter:
    """`path` (metrics.jsonl) and, in the same folder, `events.out.tfevents.*` for TensorBoard."""

    def __init__(self, path: Path):
        self.path = path
        # The events writer (it starts a thread) first: metrics.jsonl appearing is the sign
        # that the writer is whole, which the trainer relies on for a signal at start-up.
        self._events = SummaryWriter(logdir=str(path.parent))
        self._file = path.open("a", buffering=1)

    def write(self, row: dict[str, Any]) -> None:
        clean = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
        }
        self._file.write(json.dumps(clean, separators=(",", ":"), allow_nan=False) + "\n")
        step = clean.get(STEP_KEY)
        for key, value in clean.items():
            if key != STEP_KEY and isinstance(value, int | float):
                self._events.add_scalar(key, value, global_step=step)
        # A row per evaluation is rare: flushing each one keeps TensorBoard as fresh as the JSON.
        self._events.flush()

    def close(self) -> None:
        self._file.close()
        self._events.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
