"""The learner's status on the broker and `clusterenv status` reading it (real server)."""

from __future__ import annotations

import json
import time

from clusterenv.learner.run.progress import Progress
from clusterenv.learner.run.status import RunStatus
from clusterenv.learner.tools.cli import main
from clusterenv.pipeline.cluster.status_board import RedisStatusBoard
from clusterenv.pipeline.keys import RunKeys


def test_progress_publishes_a_status_that_clusterenv_status_shows(
    redis_url, client, run_id, capsys
):
    board = RunStatus(RedisStatusBoard(client), run_id, "CartPole-v1", every_s=3600.0)
    progress = Progress(50_000, status_every_s=3600.0, board=board)
    progress.tick(1024, float("nan"), 3, lambda: 7)  # the first tick publishes at once
    progress.tick(2048, 150.0, 4, lambda: 9)  # not due again for an hour: unchanged
    progress.close()
    assert main(["status", "--redis-url", redis_url, "--json"]) == 0
    mine = [s for s in json.loads(capsys.readouterr().out) if s["run_id"] == run_id]
    assert len(mine) == 1
    s = mine[0]
    assert s["state"] == "running" and s["env"] == "CartPole-v1"
    assert (s["env_steps"], s["total_steps"], s["policy_version"]) == (1024, 50_000, 3)
    assert s["last_eval"] is None and s["weight_fetches"] == 7  # no eval yet: null, not NaN

    board.finish({"solved": True, "interrupted": False, "failed": None, "env_steps": 40_960,
                  "updates": 5000, "wall_s": 61.5})  # fmt: skip
    assert main(["status", "--redis-url", redis_url]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(run_id))
    assert "CartPole-v1  solved  steps 40960/50000" in line and "v3" in line


def test_end_states_and_the_newest_first(client, run_id):
    ends = [({"interrupted": True}, "interrupted"), ({"failed": "broker gone"}, "failed"),
            ({"solved": False}, "budget spent")]  # fmt: skip
    for i, (summary, _) in enumerate(ends):
        RunStatus(RedisStatusBoard(client), f"{run_id}-{i}", "Acrobot-v1").finish(summary)
        time.sleep(0.01)  # statuses are ordered by their millisecond timestamps
    mine = [s for s in RedisStatusBoard(client).read_all() if s["run_id"].startswith(run_id)]
    assert [s["state"] for s in mine] == [state for _, state in reversed(ends)]
    ttl = client.ttl(RunKeys(f"{run_id}-0").status)
    assert 0 < ttl <= 3600  # statuses expire with the run's other keys


def test_status_of_an_unreachable_broker_is_one_line(capsys):
    assert main(["status", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach Redis" in err and len(err.splitlines()) == 1
