"""Run metrics as JSON lines with namespaced keys (`eval/…`, `pipeline/…`, `learner/…`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("a", buffering=1)

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]
