"""bench/common.py's results writer: every payload a benchmark hands it becomes JSON."""

from __future__ import annotations

import json

import numpy as np

from bench.common import write_results
from bench.sb3_dqn import minatar_torso


def test_numpy_scalars_and_classes_among_sb3s_arguments_are_written(tmp_path):
    payload = {"rate": np.float32(1.5), "count": np.int64(3),
               "sb3": {"policy_kwargs": {"features_extractor_class": minatar_torso()}}}  # fmt: skip
    path = write_results("example", payload, tmp_path / "example.json")
    doc = json.loads(path.read_text())
    assert (doc["rate"], doc["count"]) == (1.5, 3)
    assert doc["sb3"]["policy_kwargs"]["features_extractor_class"].endswith("MinAtarTorso")
