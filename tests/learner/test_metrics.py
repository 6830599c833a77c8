"""metrics.jsonl is strict JSON, and the TensorBoard event file beside it holds the same rows."""

import json
import math

import pytest

from clusterenv.learner.run.metrics import MetricsWriter, read_metrics
from tests.tfevents import read_scalars


def test_rows_land_in_jsonl_and_tensorboard_with_the_same_keys(tmp_path):
    m = MetricsWriter(tmp_path / "metrics.jsonl")
    rows = [
        {"env_steps": 2000, "wall_s": 1.25, "eval/return_mean": 21.5, "losses/td_loss": math.nan,
         "learner/updates": 40, "pipeline/lag_updates_mean": 3.0},
        {"env_steps": 4000, "wall_s": 2.5, "eval/return_mean": 180.0, "losses/td_loss": 0.75,
         "learner/updates": 100, "pipeline/lag_updates_mean": 5.5},
    ]  # fmt: skip
    for row in rows:
        m.write(row)
    m.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text
    for line in text.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    back = read_metrics(tmp_path / "metrics.jsonl")
    assert back[0]["losses/td_loss"] is None and back[1]["losses/td_loss"] == 0.75

    scalars = read_scalars(tmp_path)
    keys = {k for row in rows for k in row} - {"env_steps"}
    assert set(scalars) == keys
    for key in keys:
        expected = [(r["env_steps"], r[key]) for r in back if r[key] is not None]
        assert [(s, pytest.approx(v)) for s, v in scalars[key]] == expected, key
    # The NaN loss before the first update has no point in TensorBoard, as it is null in JSON.
    assert scalars["losses/td_loss"] == [(4000, 0.75)]
