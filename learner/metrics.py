"""Run metrics as JSON lines with namespaced keys (`eval/…`, `pipeline/…`, `learner/…`).

Strict JSON: a value that is not a finite number (the loss before the first update) is null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("a", buffering=1)

    def write(self, row: dict[str, Any]) -> None:
        clean = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
        }
        self._file.write(json.dumps(clean, separators=(",", ":"), allow_nan=False) + "\n")

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
