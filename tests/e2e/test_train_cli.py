"""`clusterenv train` as a user runs it: a real run, clean exits, workers joining mid-run, bad flags."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import re
import signal
import subprocess
import textwrap
import time
import typing
import uuid
from pathlib import Path

import pytest

from clusterenv.learner.run.metrics import read_metrics
from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC
from tests.e2e.cli_runs import (
    CLI,
    Tree,
    assert_no_survivors,
    only_run_dir,
    run_with_broker_fault,
    start_cli,
    wait_watching,
)
from tests.tfevents import read_scalars
from tests.worker_log import SUCCEEDED


@pytest.mark.slow
def test_embedded_run_trains_publishes_and_leaves_nothing_behind(tmp_path):
    mark = uuid.uuid4().hex
    proc = start_cli(
        ["train", "--total-steps", "4000", "--eval-every", "1500", "--workers", "2",
         "--lr-end", "0", "--sync", DEFAULT_SYNC, "--chunk-steps", "32",  # train's defaults,
         "--run-dir", str(tmp_path)], mark,  # not CartPole's preset: several probes in 4k steps
    )  # fmt: skip
    tree = Tree(proc)
    err = wait_watching(proc, tree, 240)
    assert proc.returncode == 0, err
    run_dir = only_run_dir(tmp_path)
    for name in (
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "final.safetensors",
        "workers.log",
    ):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    # It spends its budget, or stops early on an evaluation at CartPole's target (CI saw DQN
    # under train's defaults solve it at 3,584 steps once).
    assert summary["updates"] > 0 and summary["policy_versions"] > 3
    assert summary["env_steps"] >= 4000 or summary["solved"], summary
    if summary["solved"]:
        assert summary["best"]["eval_mean"] >= summary["target_return"]
    # The default rule, APS (named: CartPole's preset syncs on-change): every worker fetched its
    # first version, then checked probes of the newer ones (whether those trip the tolerance this
    # early is the rule's business).
    assert summary["sync_rule"] == DEFAULT_SYNC
    assert summary["sync_total"]["weight_fetches"] >= 2
    assert summary["sync_total"]["probe_fetches"] > 0
    assert len(summary["sync_per_worker"]) == 2
    assert summary["ingest"]["rejected"] == 0
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows and all("eval/return_mean" in r for r in rows)
    # --lr-end 0: the learning rate falls from --lr towards 0 as env steps are collected.
    lrs = [r["learner/lr"] for r in rows]
    assert lrs == sorted(lrs, reverse=True) and 0 <= lrs[-1] < lrs[0] < 2.3e-3, lrs
    # TensorBoard beside it: every numeric key of the rows, at the same env steps and values.
    scalars = read_scalars(run_dir)
    for key in ("eval/return_mean", "learner/updates", "pipeline/weight_fetches"):
        expected = [(r["env_steps"], pytest.approx(r[key])) for r in rows if r.get(key) is not None]
        assert scalars[key] == expected, key
    assert set(scalars) == {k for r in rows for k, v in r.items() if v is not None} - {"env_steps"}
    assert len(tree.seen) >= 3  # server and two workers were seen below the CLI
    assert_no_survivors(mark, tree)
    # best.safetensors holds the network of the best evaluation, which summary.json names.
    best = max(rows, key=lambda r: r["eval/return_mean"])
    assert summary["best"]["eval_mean"] == pytest.approx(best["eval/return_mean"])
    assert summary["best"]["env_steps"] == best["env_steps"]
    # The run's checkpoints play back locally: the final one and the best one.
    for target in (run_dir, run_dir / "best.safetensors"):
        out = subprocess.run(CLI + ["eval", str(target), "--episodes", "2"], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0 and "over 2 episodes" in out.stdout, out.stderr


@pytest.mark.slow
def test_the_run_survives_a_broker_restart(tmp_path):
    mark = uuid.uuid4().hex
    # Everything on the broker is lost in the restart: queue, stream, weights.
    proc, tree, err = run_with_broker_fault(
        tmp_path, ["--total-steps", "10000", "--target-return", "1e9", "--eval-every", "2000"],
        lambda server: server.restart(3.0), mark,
    )  # fmt: skip
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["broker_recoveries"] >= 1
    assert summary["env_steps"] >= 10000 and summary["ingest"]["rejected"] == 0
    rows = read_metrics(only_run_dir(tmp_path) / "metrics.jsonl")
    assert rows[-1]["env_steps"] >= 10000  # it evaluated after the restart, to the end
    assert_no_survivors(mark, tree)


@pytest.mark.slow
def test_a_broker_gone_for_good_ends_the_run_with_one_line(tmp_path):
    mark = uuid.uuid4().hex
    proc, tree, err = run_with_broker_fault(
        tmp_path, ["--total-steps", "1000000"], lambda server: server.stop(), mark
    )
    assert proc.returncode == 1, err
    assert "run failed: " in err and ("broker unreachable" in err or "ingest failed" in err), err
    assert "Traceback" not in err
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["failed"]  # what was learned is kept, with the reason
    assert (only_run_dir(tmp_path) / "final.safetensors").exists()
    assert_no_survivors(mark, tree)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_the_run_cleanly(tmp_path, sig):
    mark = uuid.uuid4().hex
    proc = start_cli(
        ["train", "--total-steps", "1000000", "--workers", "2", "--run-dir", str(tmp_path)], mark
    )
    tree = Tree(proc)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("*/metrics.jsonl")) and time.monotonic() < deadline:
        # metrics.jsonl appears as the run starts: a signal from then on, even during the start-up
        # (first publish, ingest), must still leave a summary, so look often and signal at once.
        time.sleep(0.01)
    tree.look()
    assert "valkey-server" in tree.names() and len(tree.alive()) >= 3  # server, two workers
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    run_dir = only_run_dir(tmp_path)  # what was learned is kept
    assert json.loads((run_dir / "summary.json").read_text())["interrupted"] is True
    assert (run_dir / "final.safetensors").exists()
    assert_no_survivors(mark, tree)


@pytest.mark.slow
def test_workers_on_a_given_broker_and_one_started_mid_run(redis_url, workers, tmp_path):
    # A low replay ratio keeps the rate limiter from holding collection to the tasks the
    # fixture's workers already hold (on a slow machine the learner is the bottleneck, and the
    # late worker would see no collection task to take: only evaluations).
    proc = start_cli(
        ["train", "--redis-url", redis_url, "--workers", "0", "--total-steps", "1000000",
         "--target-return", "1e9", "--samples-per-insert", "2", "--run-dir", str(tmp_path)],
        uuid.uuid4().hex,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("*/metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the run is going on
    late_log = tmp_path / "late.log"
    late = LocalWorkers(redis_url, 1, log_path=late_log)
    late.start()
    try:
        # The late worker's own log shows it wrote chunks; then stop the run. A task it takes
        # of an earlier test's stopped run also succeeds, at once and "skipped": not those.
        deadline = time.monotonic() + 120
        while not wrote_chunks(_text(late_log)):
            assert proc.poll() is None and time.monotonic() < deadline, _text(late_log)[-2000:]
            time.sleep(0.5)
        time.sleep(1.0)  # let its chunks reach the learner
        # An operator sees the run's progress from the broker alone.
        run_id = only_run_dir(tmp_path).name
        deadline = time.monotonic() + 15  # the status is refreshed every 5 s
        while True:
            (status,) = [s for s in broker_statuses(redis_url) if s["run_id"] == run_id]
            if status["env_steps"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status["state"] == "running" and status["env_steps"] > 0, status
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        late.stop()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    (status,) = [s for s in broker_statuses(redis_url) if s["run_id"] == run_id]
    assert status["state"] == "interrupted", status
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    names = list(summary["sync_per_worker"])
    assert any(late.tag in n for n in names), names  # the learner ingested the late worker's chunks
    assert len(names) == 3


def wrote_chunks(log: str) -> bool:
    """Whether a worker's log shows a collect_chunk task that wrote at least one chunk."""
    for match in SUCCEEDED.finditer(log):
        summary = json.loads(match[2])
        if summary.get("chunks_done", 0) > 0 and "skipped" not in summary:
            return True
    return False


def broker_statuses(redis_url: str) -> list[dict]:
    out = subprocess.run(CLI + ["status", "--redis-url", redis_url, "--json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize(
    "args,message",
    [
        (["--env", "NoSuchEnv-v9"], "NoSuchEnv-v9"),
        (["--total-steps", "-5"], "--total-steps must be positive"),
        (["--lr-end", "-1e-4"], "--lr-end must be >= 0"),
        (["--redis-url", "redis://127.0.0.1:1/0"], "cannot reach Redis at redis://127.0.0.1:1/0"),
        (["--sync", "sometimes"], "unknown sync policy 'sometimes'"),
        (["--env", "Pendulum-v1"], "Discrete action space"),
        (
            ["--algo", "ppo", "--env", "Pendulum-v1", "--sync", "aps:0.1:tv"],
            "'tv' does not apply to squashed_gaussian policies; choose kl",
        ),
        (["--env-kwargs", "[1]"], "must be a JSON object"),
        (["--metrics-port", "70000"], "--metrics-port must be a TCP port"),
    ],
)
def test_bad_flags_give_one_line_errors(tmp_path, args, message):
    out = subprocess.run(CLI + ["train", "--run-dir", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # argparse adds a usage line


def field_docs(cls: type) -> dict[str, str]:
    """Each field of a config dataclass and its docstring (the string literal below it), nested
    config dataclasses flattened, as tyro reads them for --help."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    fields = {f.name for f in dataclasses.fields(cls)}  # not the ClassVars an agent declares
    for node, after in zip(body, body[1:] + [None], strict=True):
        if not isinstance(node, ast.AnnAssign) or node.target.id not in fields:  # type: ignore[attr-defined]
            continue
        name = node.target.id  # type: ignore[attr-defined]
        kind = typing.get_type_hints(cls)[name]
        if isinstance(kind, typing.TypeVar):  # the agent's config: the caller adds its own
            continue
        if dataclasses.is_dataclass(kind):
            docs.update(field_docs(kind))
        elif isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[name] = after.value.value
        else:
            docs[name] = ""
    return docs


def test_an_unreachable_broker_leaves_no_run_directory(tmp_path):
    out = subprocess.run(CLI + ["train", "--run-dir", str(tmp_path), "--redis-url",
                                "redis://127.0.0.1:1/0"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "cannot reach Redis" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_version():
    out = subprocess.run(CLI + ["--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("clusterenv 0.")


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_help_explains_every_flag(algo):
    """`train --help` lists the run's settings and DQN's; `train --algo ppo --help` PPO's instead."""
    out = subprocess.run(CLI + ["train", "--algo", algo, "--help"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0
    from clusterenv.learner.config import AGENT_CONFIGS, TrainConfig

    docs = {**field_docs(TrainConfig), **field_docs(AGENT_CONFIGS[algo])}
    assert len(docs) > 30
    # The help is wrapped in columns: compare words, not lines.
    words = " ".join(out.stdout.replace("│", " ").split())
    for name, text in docs.items():
        assert text, f"{name} has no docstring"
        assert f"--{name.replace('_', '-')}" in words
        assert " ".join(text.split()[:3]) in words, name
    # One default per flag: an unset setting says what it means once, not "unset: …" and then
    # "(default: None)" as well.
    assert words.count("(default") == len(docs)
    assert "(default: None)" not in words and "unset" not in words
    # The other agent's own settings are not flags of this one (--eps-start is DQN's alone).
    other = next(a for a in AGENT_CONFIGS if a != algo)
    for name in set(field_docs(AGENT_CONFIGS[other])) - set(docs):
        flag = f"--{name.replace('_', '-')}"  # as an option: its metavar, or its --no- twin
        assert not re.search(rf"{flag} (INT|FLOAT|STR|{{)|{flag}, --no-", words), name


def test_workers_that_never_start_give_one_line(tmp_path):
    # A setting the workers cannot read (celeryconfig parses it at import) stops each local
    # worker before it reports; the learner says so in one line, with the log's last line.
    env = {**os.environ, "CLUSTERENV_VISIBILITY_TIMEOUT": "soon"}
    out = subprocess.run(CLI + ["train", "--workers", "1", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 1
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "local celery worker exited with code" in err and "'soon'" in err, err
    assert "workers.log" in err
