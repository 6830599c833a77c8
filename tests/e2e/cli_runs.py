"""Running `clusterenv train` as a user does, from the e2e tests: a subprocess with a mark in its
environment, every process below it watched, none left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil

from bench.signals import default_stop_signals
from tests.servers import PrivateRedis

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


def train_to_end(args: list[str], run_parent: Path, timeout_s: float) -> tuple[Path, dict, str]:
    """`clusterenv train ARGS --run-dir RUN_PARENT` to its end, which must be a clean exit with
    no process left behind; its run directory, summary.json and stderr."""
    mark = uuid.uuid4().hex
    proc = start_cli([*args, "--run-dir", str(run_parent)], mark)
    tree = Tree(proc)
    err = wait_watching(proc, tree, timeout_s)
    assert proc.returncode == 0, err
    assert_no_survivors(mark, tree)
    run_dir = only_run_dir(run_parent)
    return run_dir, json.loads((run_dir / "summary.json").read_text()), err


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
