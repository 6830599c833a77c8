"""A user's own tasks.py, pipeline.py, learner.py and celeryconfig.py in the working directory
change nothing: `clusterenv train`, a `celery -A clusterenv.tasks worker` and the remote env all
run there, from the editable install and from a wheel installed into a fresh venv."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterenv.pipeline.cluster.embedded import EmbeddedServer
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect

ROOT = Path(__file__).resolve().parents[2]
SHADOWS = ("tasks", "pipeline", "learner", "celeryconfig")
REMOTE_ENV = """
import sys
from clusterenv.pipeline.remote_env import RemoteVectorEnv
envs = RemoteVectorEnv("CartPole-v1", 2, redis_url=sys.argv[1])
obs, _ = envs.reset(seed=0)
obs, reward, *_ = envs.step(envs.action_space.sample())
envs.close()
print(obs.shape, reward.tolist())
"""


@pytest.fixture(scope="module")
def wheel_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh venv holding clusterenv as a regular (non-editable) install of its wheel.
    Its dependencies come from this venv's site-packages through a .pth line, which does not run
    this venv's editable finder, so only the wheel's `clusterenv` is importable there."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(root), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = root.glob("clusterenv-*.whl")
    venv.create(root / "venv", with_pip=False)
    py = root / "venv" / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--quiet",
         str(wheel)], check=True, timeout=300,
    )  # fmt: skip
    where = subprocess.run([py, "-c", "import clusterenv.tasks as t; print(t.__file__)"],
                           capture_output=True, text=True, cwd=root, check=True).stdout  # fmt: skip
    assert where.startswith(site), where  # the wheel's copy, not this checkout
    return py.parent


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A working directory with modules of the common names, each failing loudly on import."""
    for name in SHADOWS:
        marker = tmp_path / f"{name}.imported"
        (tmp_path / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('the user\\'s {name}.py')\n"
        )
    return tmp_path


@pytest.fixture
def server() -> Iterator[str]:
    embedded = EmbeddedServer()
    try:
        yield embedded.start()
    finally:
        embedded.stop()


def run(argv: list[str], cwd: Path, timeout_s: float, **env: str) -> str:
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                         env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("install", ["editable", "wheel"])
def test_train_worker_and_remote_env_run_beside_the_users_modules(
    install, request, user_dir, server
):
    bin_dir = (
        Path(sys.executable).parent
        if install == "editable"
        else request.getfixturevalue("wheel_bin")
    )
    python = str(bin_dir / "python")
    assert run([str(bin_dir / "clusterenv"), "--version"], user_dir, 60).startswith("clusterenv ")

    # `clusterenv train`, with its embedded server and local workers started in this directory.
    out = run(
        [str(bin_dir / "clusterenv"), "train", "--total-steps", "1000", "--eval-every", "1000",
         "--eval-episodes", "2", "--workers", "1", "--run-dir", "runs"], user_dir, 300,
    )  # fmt: skip
    assert "budget spent" in out or "solved" in out, out
    assert list((user_dir / "runs").glob("*/summary.json")), out

    # A worker started by hand here, and the remote env on it.
    worker = subprocess.Popen(
        [python, "-m", "celery", "-A", "clusterenv.tasks", "worker", "--pool", "solo",
         "--loglevel", "INFO", "--hostname", f"user-{install}@%h"],
        cwd=user_dir, env={**os.environ, "CLUSTERENV_REDIS_URL": server},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        registry, deadline = WorkerRegistry(connect(server)), time.monotonic() + 60
        while not registry.alive_processes() and worker.poll() is None:
            assert time.monotonic() < deadline, "the worker did not register within 60 s"
            time.sleep(0.1)
        assert registry.alive_processes() == 1, "the worker exited"
        out = run([python, "-c", REMOTE_ENV, server], user_dir, 120)
        assert out.startswith("(2, 4) [1.0, 1.0]"), out
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            log, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            log, _ = worker.communicate()
    assert "user's" not in log, log
    assert not list(user_dir.glob("*.imported")), "a user module was imported"
