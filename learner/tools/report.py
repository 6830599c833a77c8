"""`clusterenv report`: plots and a markdown table of headline figures from run directories.

Runs are grouped by their sync rule (from config.json); curves show the median over the group's
seeds with a min–max band where at least two of them have data, and each run's own line where it
goes on alone, so every run is drawn to its own end.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clusterenv.learner.run.metrics import read_metrics


def load_run(run_dir: Path) -> dict[str, Any]:
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        if not (run_dir / name).exists():
            raise ValueError(f"{run_dir} is not a finished run directory (no {name})")
    return {
        "dir": run_dir,
        "config": json.loads((run_dir / "config.json").read_text()),
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "rows": read_metrics(run_dir / "metrics.jsonl"),
    }


@dataclass
class Band:
    """A group's curves on one grid of x: median, min and max where at least two runs have data
    (NaN elsewhere), and each run's own line (NaN except where it is the only run with data)."""

    grid: np.ndarray
    median: np.ndarray
    low: np.ndarray
    high: np.ndarray
    solo: list[np.ndarray]
    runs: int


def band(runs: list[dict], x_key: str, y_key: str, points: int = 200) -> Band | None:
    """Each run interpolated over its own span only, so every run is drawn to its own end."""
    curves = [(np.array([r[x_key] for r in run["rows"]]), np.array([r.get(y_key) or 0 for r in run["rows"]]))
              for run in runs if run["rows"]]  # fmt: skip
    if not curves:
        return None
    grid = np.linspace(0, max(x.max() for x, _ in curves), points)
    ys = np.stack([np.where((grid >= x[0]) & (grid <= x[-1]), np.interp(grid, x, y), np.nan)
                   for x, y in curves])  # fmt: skip
    shared = np.sum(~np.isnan(ys), axis=0) >= 2
    stats = [np.full(points, np.nan) for _ in range(3)]
    for out, reduce in zip(stats, (np.nanmedian, np.nanmin, np.nanmax), strict=True):
        out[shared] = reduce(ys[:, shared], axis=0)
    alone = [~shared & ~np.isnan(y) for y in ys]
    # Each run's own line starts one grid point early, where it meets the median.
    solo = [
        np.where(a | np.append(a[1:], False), y, np.nan) for a, y in zip(alone, ys, strict=True)
    ]
    return Band(grid, *stats, solo=solo, runs=len(curves))


def _draw(ax, runs: list[dict], x_key: str, y_key: str, scale: float, label: str) -> None:
    b = band(runs, x_key, y_key)
    if b is None:
        return
    (line,) = ax.plot(b.grid, b.median / scale, label=f"{label} (n={b.runs})")
    ax.fill_between(b.grid, b.low / scale, b.high / scale, color=line.get_color(), alpha=0.2)
    for y in b.solo:  # where a single run goes on alone, its own line
        ax.plot(b.grid, y / scale, color=line.get_color(), linewidth=1.0)


def first_solve(
    run: dict[str, Any], target: float | None = None
) -> tuple[int | None, float | None]:
    """Env steps and wall seconds of the first eval at or above `target` (default: the run's)."""
    target = run["summary"].get("target_return") if target is None else target
    for r in run["rows"]:
        if target is not None and r["eval/return_mean"] >= target:
            return r["env_steps"], r["wall_s"]
    return None, None


def headline(groups: dict[str, list[dict]], target: float | None = None) -> str:
    cols = ["sync rule", "runs", "solved", "median steps to target", "median wall s to target",
            "best eval", "weight MB/worker", "fetches/worker", "probe MB/worker", "lag updates mean/p95"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rule, runs in groups.items():
        solves = [first_solve(r, target) for r in runs]
        steps = [s for s, _ in solves if s is not None]
        walls = [w for _, w in solves if w is not None]
        per_worker = [max(1, len(r["summary"]["sync_per_worker"])) for r in runs]
        sync = [r["summary"]["sync_total"] for r in runs]

        def med(key: str, scale: float = 1.0, sync=sync, per_worker=per_worker) -> str:
            vals = [s.get(key, 0) / n / scale for s, n in zip(sync, per_worker, strict=True)]
            return f"{np.median(vals):.2f}"

        lag_mean = np.median([r["summary"]["lag"]["lag_updates_mean"] for r in runs])
        lag_p95 = np.median([r["summary"]["lag"]["lag_updates_p95"] for r in runs])
        best = max(
            max((row["eval/return_mean"] for row in r["rows"]), default=float("nan")) for r in runs
        )
        lines.append("| " + " | ".join([
            rule, str(len(runs)), f"{len(steps)}/{len(runs)}",
            f"{np.median(steps):.0f}" if steps else "-", f"{np.median(walls):.1f}" if walls else "-",
            f"{best:.1f}", med("weight_bytes", 1e6), med("weight_fetches"), med("probe_bytes", 1e6),
            f"{lag_mean:.0f} / {lag_p95:.0f}",
        ]) + " |")  # fmt: skip
    return "\n".join(lines)


def write_report(run_dirs: list[Path], out: Path, target: float | None = None) -> str:
    """Write eval/bytes/lag plots and report.md into `out`; returns the markdown table.

    `target` overrides each run's own target return in the steps-to-target column, for runs that
    trained a fixed budget (`--target-return 1e9`) such as the bench/sync_policies grid.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = defaultdict(list)
    for d in run_dirs:
        run = load_run(d)
        groups[run["config"]["weights"]["sync"]].append(run)
    out.mkdir(parents=True, exist_ok=True)
    plots = [  # file, x, y, y divided by, y label
        ("eval_vs_steps.png", "env_steps", "eval/return_mean", 1, "greedy eval return"),
        ("eval_vs_wall.png", "wall_s", "eval/return_mean", 1, "greedy eval return"),
        ("weight_bytes_vs_steps.png", "env_steps", "pipeline/weight_bytes", 1e6, "cumulative weight MB (all workers)"),
        ("lag_vs_wall.png", "wall_s", "pipeline/lag_updates_mean", 1, "mean policy lag at ingest since the previous eval (gradient steps)"),
    ]  # fmt: skip
    for name, x_key, y_key, scale, ylabel in plots:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for rule, runs in groups.items():
            _draw(ax, runs, x_key, y_key, scale, rule)
        ax.set_xlabel("env steps" if x_key == "env_steps" else "wall time (s)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    md = headline(groups, target)
    images = "\n".join(f"![{n}]({n})" for n, *_ in plots)
    (out / "report.md").write_text(f"# clusterenv report\n\n{md}\n\n{images}\n")
    return md
