"""`clusterenv report` on run directories: plots and a headline table (no server needed)."""

import json

import numpy as np

from clusterenv.learner.run.metrics import MetricsWriter
from clusterenv.learner.tools.cli import main
from clusterenv.learner.tools.report import band, load_run, write_report


def fake_run(parent, name, sync, solve_at, fetches, last=10000):
    d = parent / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"weights": {"sync": sync}}))
    lag = {"lag_updates_mean": 100.0, "lag_updates_p95": 300.0}
    summary = {
        "target_return": 475.0,
        "sync_total": {
            "weight_bytes": fetches * 1000,
            "weight_fetches": fetches,
            "probe_bytes": 50,
        },
        "sync_per_worker": {"w0": {}, "w1": {}},
        "lag": lag,
    }
    (d / "summary.json").write_text(json.dumps(summary))
    m = MetricsWriter(d / "metrics.jsonl")
    for step in range(2000, last + 1, 2000):
        ret = 500.0 if step >= solve_at else step / 100
        m.write({"env_steps": step, "wall_s": step / 1000, "eval/return_mean": ret,
                 "pipeline/weight_bytes": step * 10, "pipeline/lag_updates_mean": 50.0})  # fmt: skip
    m.close()
    return d


def test_report_writes_plots_and_a_table(tmp_path):
    runs = [
        fake_run(tmp_path, "a1", "on-change", 6000, 40),
        fake_run(tmp_path, "a2", "on-change", 8000, 60),
        fake_run(tmp_path, "b1", "aps:0.02", 99999, 4),
    ]
    out = tmp_path / "report"
    md = write_report(runs, out)
    for name in (
        "eval_vs_steps.png",
        "eval_vs_wall.png",
        "weight_bytes_vs_steps.png",
        "lag_vs_wall.png",
    ):
        assert (out / name).stat().st_size > 1000
    on_change = next(line for line in md.splitlines() if line.startswith("| on-change"))
    assert "| 2/2 | 7000 |" in on_change  # median of first solves at 6000 and 8000
    assert "| 25.00 |" in on_change  # median fetches per worker: (20 + 30) / 2
    aps = next(line for line in md.splitlines() if line.startswith("| aps:0.02"))
    assert "| 0/1 | - |" in aps
    assert "report.md" in {p.name for p in out.iterdir()}


def test_target_overrides_each_runs_own(tmp_path):
    # ret = step / 100 below the solve step: 40.0 at 4000, 60.0 at 6000 ...
    runs = [fake_run(tmp_path, "a1", "on-change", 99999, 40)]
    line = write_report(runs, tmp_path / "own").splitlines()[-1]
    assert "| 0/1 | - |" in line
    line = write_report(runs, tmp_path / "lower", target=55.0).splitlines()[-1]
    assert "| 1/1 | 6000 |" in line


def test_report_of_a_non_run_is_a_one_line_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a finished run directory" in capsys.readouterr().err


def test_report_needs_a_run_dir(capsys):
    assert main(["report"]) == 2
    err = capsys.readouterr().err.strip()
    assert "run director" in err and len(err.splitlines()) == 1


def test_each_run_is_drawn_to_its_own_end(tmp_path):
    # Three runs stopped at 8k, 48k and 56k env steps: the median and band cover the span where
    # at least two runs have data (to 48k), the longest run's own line goes on to 56k.
    runs = [load_run(fake_run(tmp_path, f"r{last}", "aps:0.01", 99999, 4, last=last))
            for last in (8000, 48000, 56000)]  # fmt: skip
    b = band(runs, "env_steps", "eval/return_mean")
    assert b is not None and b.runs == 3 and b.grid.max() == 56000
    ends = [b.grid[~np.isnan(y)].max() for y in [b.median, b.low, b.high]]
    assert all(46000 < end <= 48000 for end in ends), ends  # not cut at the 8k run's end
    alone = b.solo[2][~np.isnan(b.solo[2])]
    assert len(alone) > 0 and np.isclose(alone[-1], 560.0)  # ret = step / 100 at 56k
    assert np.isnan(b.solo[0]).all() and np.isnan(b.solo[1]).all()  # never alone
    # Between 8k and 48k the two longer runs agree (same curve), so the band is that curve.
    mid = (b.grid > 10000) & (b.grid < 46000)
    assert np.allclose(b.median[mid], b.grid[mid] / 100)
    md = write_report([r["dir"] for r in runs], tmp_path / "report")
    assert "| aps:0.01 | 3 | 2/3 | 48000 |" in md  # the 48k and 56k runs pass 475 at 48k
