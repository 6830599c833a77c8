"""bench/update_cost.py's SAC comparison runs both systems' real updates and writes them down."""

from __future__ import annotations

import json

from bench.update_cost import main


def test_sac_update_cost_times_both_systems_and_writes_the_results(tmp_path):
    out = tmp_path / "update_cost_sac.json"
    assert main(["--algo", "sac", "--env", "Pendulum-v1", "--steps", "3", "--repeats", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["args"]["algo"] == "sac" and doc["args"]["steps"] == 3
    assert set(doc["runs"]) == {"clusterenv SAC", "SB3 SAC"}
    assert all(len(ms) == 1 and ms[0] > 0 for ms in doc["runs"].values())
    assert "prioritized_overhead" not in doc
