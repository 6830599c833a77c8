"""best.safetensors: the network of the best evaluation is kept, and only for the version it scored."""

from __future__ import annotations

import numpy as np
import pytest

from clusterenv.learner.persistence.best import BestKeeper
from clusterenv.learner.run.evaluation import EvalResult
from clusterenv.learner.tools.cli import main
from clusterenv.learner.tools.eval_checkpoint import load_policy
from clusterenv.pipeline.codec import decode_weights
from tests.learner.test_eval_checkpoint import result, saved_run


def weights(fill: float) -> dict[str, np.ndarray]:
    return {
        "layers.0.weight": np.full((3, 4), fill, np.float32),
        "layers.0.bias": np.zeros(3, np.float32),
        "layers.1.weight": np.full((2, 3), fill, np.float32),
        "layers.1.bias": np.zeros(2, np.float32),
    }


def evaluation(version: int, env_steps: int, ran: set[int] | None = None) -> EvalResult:
    res = EvalResult(version, version, env_steps, 0.0, np.zeros(10))
    res.versions_evaluated = {version} if ran is None else ran
    return res


def kept(run_dir) -> float:
    return float(load_policy(run_dir / "best.safetensors").layers[0][0][0, 0])


def test_the_best_evaluation_so_far_is_kept(tmp_path):
    best = BestKeeper(tmp_path)
    assert best.chosen is None and not (tmp_path / "best.safetensors").exists()
    best.asked(3, weights(1.0))
    assert best.evaluated(evaluation(3, 2000), 10.0)
    best.asked(5, weights(2.0))
    assert not best.evaluated(evaluation(5, 4000), 5.0)  # worse: the file stays
    assert kept(tmp_path) == 1.0
    best.asked(7, weights(3.0))
    assert best.evaluated(evaluation(7, 6000), 20.0)
    assert kept(tmp_path) == 3.0
    assert best.chosen == {"eval_mean": 20.0, "eval_episodes": 10, "env_steps": 6000, "version": 7}


@pytest.mark.parametrize(
    "res",
    [evaluation(3, 2000, ran={3, 4}), evaluation(2, 2000)],
    ids=["a part ran a newer version", "not the version asked about"],
)
def test_a_score_that_is_not_this_networks_keeps_nothing(tmp_path, res):
    best = BestKeeper(tmp_path)
    best.asked(3, weights(1.0))
    assert not best.evaluated(res, 100.0)
    assert not (tmp_path / "best.safetensors").exists()


def test_a_resumed_run_keeps_beating_the_best_of_the_runs_before(tmp_path):
    first = BestKeeper(tmp_path)
    first.asked(3, weights(1.0))
    first.evaluated(evaluation(3, 2000), 50.0)
    again = BestKeeper(tmp_path)  # the learner after --resume
    assert again.mean == 50.0
    again.asked(9, weights(2.0))
    assert not again.evaluated(evaluation(9, 8000), 40.0) and kept(tmp_path) == 1.0


def test_an_unreadable_best_file_is_replaced(tmp_path):
    (tmp_path / "best.safetensors").write_bytes(b"not safetensors")
    best = BestKeeper(tmp_path)
    assert best.chosen is None
    best.asked(1, weights(4.0))
    assert best.evaluated(evaluation(1, 1000), -300.0) and kept(tmp_path) == 4.0


def test_clusterenv_eval_plays_the_best_file(tmp_path, capsys):
    # The hand-set controller network of the eval tests, kept as the best: it balances the pole.
    run = saved_run(tmp_path / "run")
    saved = decode_weights((run / "final.safetensors").read_bytes())
    acting = {
        k.removeprefix("learner.q."): v for k, v in saved.items() if k.startswith("learner.q.")
    }
    best = BestKeeper(run)
    best.asked(4, acting)
    assert best.evaluated(evaluation(4, 4000), 500.0)
    assert main(["eval", str(run / "best.safetensors"), "--episodes", "3"]) == 0
    assert result(capsys.readouterr().out) == (500.0, 0.0, 3)
