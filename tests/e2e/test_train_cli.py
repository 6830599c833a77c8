"""`clusterenv train` as a user runs it: a real run, clean exits, workers joining mid-run, bad flags."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import typing
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from bench.signals import default_stop_signals
from clusterenv.learner.run.metrics import read_metrics
from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC
from tests.servers import PrivateRedis
from tests.tfevents import read_scalars

CLI = [sys.executable, "-m", "clusterenv.learner.tools.cli"]


def marked_processes(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries `mark` (the CLI's children inherit it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (
                proc.environ().get("CLUSTERENV_TEST_MARK") == mark
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


class Tree:
    """Every process seen below the CLI while it ran (the server rewrites its environ, so the
    mark alone would miss it)."""

    def __init__(self, proc: subprocess.Popen):
        self.root = psutil.Process(proc.pid)
        self.seen: dict[int, psutil.Process] = {}

    def look(self) -> None:
        try:
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def names(self) -> list[str]:
        return [p.name() for p in self.seen.values() if p.is_running()]

    def alive(self) -> list[int]:
        return [
            pid
            for pid, p in self.seen.items()
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]


def wait_watching(proc: subprocess.Popen, tree: Tree, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "run did not finish in time"
        tree.look()
        time.sleep(0.2)
    return proc.stderr.read()


def start_cli(args: list[str], mark: str) -> subprocess.Popen:
    env = {**os.environ, "CLUSTERENV_TEST_MARK": mark}
    return subprocess.Popen(
        CLI + args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stop_signals,
    )


def only_run_dir(parent: Path) -> Path:
    (run_dir,) = [p for p in parent.iterdir() if p.is_dir()]
    return run_dir


def assert_no_survivors(mark: str, tree: Tree, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (marked_processes(mark) or tree.alive()) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p.pid for p in marked_processes(mark)} | set(tree.alive())
    for pid in left:  # never leave them running, even when failing
        psutil.Process(pid).kill()
    assert not left, f"processes left behind: {left}"


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
    assert summary["env_steps"] >= 4000 and summary["updates"] > 0
    assert summary["policy_versions"] > 3
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
def test_evaluation_runs_on_the_workers_not_in_the_learner(tmp_path):
    steppers = tmp_path / "steppers.txt"
    proc = start_cli(
        ["train", "--env", "tests.e2e.step_recorder:StepRecorder-v0",
         "--env-kwargs", json.dumps({"log_path": str(steppers)}), "--total-steps", "3000",
         "--eval-every", "1000", "--eval-episodes", "4", "--workers", "2",
         "--status-every-s", "0.5", "--run-dir", str(tmp_path / "runs")], uuid.uuid4().hex,
    )  # fmt: skip
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "status: steps " in err and " steps/s " in err  # no terminal: periodic status lines
    rows = read_metrics(only_run_dir(tmp_path / "runs") / "metrics.jsonl")
    assert len(rows) >= 3, rows  # evaluations came back and were recorded
    for row in rows:
        assert row["eval/policy_version"] <= row["learner/policy_version"]
        assert row["eval/latency_s"] >= 0
    pids = {int(line) for line in steppers.read_text().split()}
    assert pids and proc.pid not in pids, pids  # envs were stepped, never by the learner


def slow_eval_args(tmp_path: Path, log: Path, eval_delay_s: float, workers: int = 2) -> list[str]:
    env_kwargs = {"log_path": str(log), "delay_s": 0.002, "eval_delay_s": eval_delay_s}
    return ["train", "--env", "tests.e2e.step_recorder:SlowEval-v0", "--env-kwargs",
            json.dumps(env_kwargs), "--chunk-steps", "8", "--eval-every", "500",
            "--eval-episodes", "2", "--target-return", "1e9", "--workers", str(workers),
            "--run-dir", str(tmp_path / "runs")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 1])  # 1: the one collecting worker is never taken away
def test_chunks_keep_arriving_while_the_workers_evaluate(tmp_path, workers):
    # A chunk takes 8 envs x 8 steps x 2 ms; an evaluation step 2 envs x 20 ms.
    args = slow_eval_args(tmp_path, tmp_path / "evals.txt", eval_delay_s=0.02, workers=workers)
    proc = start_cli([*args, "--total-steps", "3000"], uuid.uuid4().hex)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    rows = read_metrics(only_run_dir(tmp_path / "runs") / "metrics.jsonl")
    # The last evaluation comes after the budget is spent, when no chunk is due any more.
    long = [r for r in rows[:-1] if r["eval/latency_s"] > 1.0]
    assert long, [r["eval/latency_s"] for r in rows]
    # A chunk takes ~0.2 s: a second of evaluation leaves room for several (the learner's rate
    # limiter may hold some back). A lone worker taken away for the evaluation delivers only the
    # chunk it was collecting when asked: 1 in every such row with `--eval-workers 0`.
    assert all(r["eval/chunks_meanwhile"] >= 2 for r in long), rows


@pytest.mark.slow
def test_a_worker_lost_during_an_evaluation_does_not_hang_the_run(tmp_path):
    log, mark = tmp_path / "evals.txt", uuid.uuid4().hex
    # An evaluation takes at most 200 steps x 2 envs x 20 ms = 8 s; the timeout is far above the
    # test's own 240 s: the evaluation must be given up because its worker's heartbeat lapsed.
    args = slow_eval_args(tmp_path, log, eval_delay_s=0.02)
    proc = start_cli(
        [*args, "--total-steps", "3000", "--eval-timeout-s", "3600", "--lost-after-s", "5"], mark
    )
    tree = Tree(proc)
    deadline = time.monotonic() + 120
    while not log.exists() or not log.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, "no evaluation started"
        time.sleep(0.05)
    tree.look()
    victim = int(log.read_text().split()[0])  # a worker of this CLI, in an evaluation now
    assert victim in {p.pid for p in tree.seen.values()}
    os.killpg(victim, signal.SIGKILL)
    err = wait_watching(proc, tree, 240)
    assert proc.returncode == 0, err
    assert "is gone; given up" in err  # abandoned when its worker went, not at the timeout
    rows = read_metrics(only_run_dir(tmp_path / "runs") / "metrics.jsonl")
    assert rows and rows[-1]["env_steps"] >= 3000  # later evaluations came back
    assert_no_survivors(mark, tree)


@pytest.mark.slow
def test_an_evaluation_that_outlasts_its_timeout_is_given_up(tmp_path):
    # A CartPole episode lasts at least 8 steps (whatever the actions), so an evaluation takes at
    # least 8 steps x 2 envs x 300 ms = 4.8 s against its timeout of 3 s; the worker stays alive,
    # so only the timeout can end the wait. (50 ms a step failed once in CI: short episodes.)
    args = slow_eval_args(tmp_path, tmp_path / "evals.txt", eval_delay_s=0.3)
    proc = start_cli([*args, "--total-steps", "2000", "--eval-timeout-s", "3"], uuid.uuid4().hex)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "took over 3 s; given up" in err


def wait_for_rows(run_parent: Path, rows: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until the run's metrics.jsonl holds `rows` evaluations (the run is well under way)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = list(run_parent.glob("*/metrics.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= rows:
            return
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)


def run_with_broker_fault(
    tmp_path: Path, args: list[str], fault: Callable[[PrivateRedis], None], mark: str
) -> tuple[subprocess.Popen, Tree, str]:
    """`clusterenv train ARGS` on a redis-server of the test's own; `fault(server)` once the run
    has logged an evaluation; then wait for the CLI to end. Returns it, its tree and its stderr."""
    with PrivateRedis() as server:
        proc = start_cli(["train", "--redis-url", server.url, "--workers", "2",
                          "--run-dir", str(tmp_path), *args], mark)  # fmt: skip
        tree = Tree(proc)
        try:
            wait_for_rows(tmp_path, 1, proc, 120)
            tree.look()
            fault(server)
            err = wait_watching(proc, tree, 240)
        finally:
            if proc.poll() is None:
                proc.kill()
    return proc, tree, err


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
    proc = start_cli(
        ["train", "--redis-url", redis_url, "--workers", "0", "--total-steps", "1000000",
         "--target-return", "1e9", "--run-dir", str(tmp_path)], uuid.uuid4().hex,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("*/metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the run is going on
    late_log = tmp_path / "late.log"
    late = LocalWorkers(redis_url, 1, log_path=late_log)
    late.start()
    try:
        # The late worker's own log shows it ran chunks of this run; then stop the run.
        deadline = time.monotonic() + 120
        while "clusterenv.collect_chunk" not in _text(late_log) or "succeeded" not in _text(
            late_log
        ):
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
        (["--env-kwargs", "[1]"], "must be a JSON object"),
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
    for node, after in zip(body, body[1:] + [None], strict=True):
        if not isinstance(node, ast.AnnAssign):
            continue
        name = node.target.id  # type: ignore[attr-defined]
        kind = typing.get_type_hints(cls)[name]
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


def test_help_explains_every_flag():
    out = subprocess.run(CLI + ["train", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    from clusterenv.learner.config import TrainConfig

    docs = field_docs(TrainConfig)
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
