"""What every benchmark shares: a table printer, machine facts and the results JSON writer."""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# `clusterenv train` run by this interpreter, as every benchmark that times whole runs starts it.
TRAIN = [sys.executable, "-m", "clusterenv.learner.tools.cli", "train"]


def machine() -> dict[str, Any]:
    """Facts about where a benchmark ran, so a result file says what it is comparable with."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1_5_15": [round(x, 2) for x in load],
    }


def fmt(value: Any) -> str:
    """A table cell: floats with sensible precision, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of `rows` (dicts) over `columns`, ready to print or paste into docs."""
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    head = "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    text = [all(isinstance(r.get(c), str) for r in rows) for c in columns]  # left-aligned
    body = [
        "| "
        + " | ".join(
            v.ljust(w) if t else v.rjust(w) for v, w, t in zip(row, widths, text, strict=True)
        )
        + " |"
        for row in cells
    ]
    return "\n".join([head, rule, *body])


def train_run(flags: Sequence[str], runs_dir: Path, prefix: str) -> dict[str, Any]:
    """`clusterenv train FLAGS` in a fresh folder under `runs_dir`, quietly; the finished run as
    `clusterenv.learner.tools.report.load_run` reads it. A failed run raises with the end of its stderr."""
    from clusterenv.learner.tools.report import load_run

    parent = Path(tempfile.mkdtemp(prefix=prefix, dir=runs_dir))
    cmd = [*TRAIN, *flags, "--run-dir", str(parent)]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed: {proc.stderr[-2000:]}")
    (run_dir,) = [p for p in parent.iterdir() if p.is_dir()]
    return load_run(run_dir)


def median(values: Sequence[float]) -> float:
    """Median of `values`; +inf (e.g. 'not solved') counts as larger than anything."""
    return float(statistics.median(values)) if values else float("nan")


_LOAD_AT_START: list[float] | None = None


def mark_start() -> None:
    """Remember the machine's load as a benchmark starts (written beside the load at its end)."""
    global _LOAD_AT_START
    _LOAD_AT_START = machine()["loadavg_1_5_15"]


def write_results(name: str, payload: dict[str, Any], out: Path | None = None) -> Path:
    """Write `payload` plus argv, time and machine facts to bench/results/<name>.json (atomically)."""
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "command": shlex.join([Path(sys.executable).name, "-m", f"bench.{name}", *sys.argv[1:]]),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine() | {"loadavg_at_start": _LOAD_AT_START},
        **payload,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path


def save_figure(fig: Any, path: Path) -> None:
    """Lay out a matplotlib figure and write it to `path` (folders made as needed)."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, type):  # a class among SB3's arguments (its features extractor)
        return f"{value.__module__}.{value.__qualname__}"
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
