"""A worker needs only the base install: with torch, matplotlib, tqdm and tyro made unimportable,
every worker-side module imports and a real `celery -A clusterenv.tasks worker` collects chunks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterenv.learner import LEARNER_EXTRA
from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from tests.tasks.test_collect_sync import run_two_versions

# Loaded by every Python process started with this folder on PYTHONPATH (site imports
# `sitecustomize` at start-up): imports of the learner's dependencies fail, and are logged.
BLOCKER = f"""
import os, sys

class LearnerOnly:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {LEARNER_EXTRA!r}:
            with open(os.environ["BLOCKED_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"{{name}} is not part of a worker install", name=name)
        return None

sys.meta_path.insert(0, LearnerOnly())
with open(os.environ["BLOCKED_LOG"] + ".pids", "a") as pids:
    pids.write(f"{{os.getpid()}}\\n")
"""
# User-side adapters for another library that itself needs torch: never imported by workers.
NEEDS_ITS_LIBRARY = {"clusterenv.pipeline.remote_env.sb3"}  # stable-baselines3

IMPORT_ALL = """
import pkgutil, importlib, sys
import clusterenv.celeryconfig, clusterenv.pipeline, clusterenv.tasks
names = [m.name for pkg in (clusterenv.pipeline, clusterenv.tasks)
         for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
         if m.name not in {skip!r}]
for name in names:
    importlib.import_module(name)
assert not [m for m in sys.modules if m.split(".")[0] in {blocked!r}]
print(len(names))
"""


@pytest.fixture
def blocked_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """os.environ set so that child Pythons cannot import the learner's dependencies."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / "blocked.log"
    log.touch()
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("BLOCKED_LOG", str(log))
    return log


def test_every_worker_module_imports_without_the_learner_dependencies(blocked_env, tmp_path):
    code = IMPORT_ALL.format(blocked=LEARNER_EXTRA, skip=NEEDS_ITS_LIBRARY)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 25  # every module of pipeline/ and tasks/
    assert blocked_env.read_text() == ""
    # The block works: the learner itself cannot be imported under it.
    learner = subprocess.run([sys.executable, "-c", "import clusterenv.learner.dqn.learning"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert learner.returncode != 0 and "not part of a worker install" in learner.stderr


def test_the_clusterenv_command_answers_without_the_learner_extra(blocked_env, tmp_path):
    def clusterenv(*args: str) -> subprocess.CompletedProcess:
        code = f"import sys; sys.argv = {['clusterenv', *args]!r}; from clusterenv.learner import main; sys.exit(main())"
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    version = clusterenv("--version")
    assert version.returncode == 0 and version.stdout.startswith("clusterenv "), version.stderr
    train = clusterenv("train")
    assert train.returncode == 2
    assert (
        "the learner needs the `learner` extra" in train.stderr and "Traceback" not in train.stderr
    )


@pytest.mark.slow
def test_a_worker_without_the_learner_dependencies_collects_chunks(
    blocked_env, redis_url, client, celery_app, run_id, tmp_path
):
    log = tmp_path / "worker.log"
    pool = LocalWorkers(redis_url, 1, log_path=log, queue=f"q-{run_id}")
    before = WorkerRegistry(client).alive_processes()
    pool.start()
    try:
        pool.wait_ready(client, expected=before + 1)
        (worker_pid,) = pool.pids
        headers = run_two_versions(celery_app, client, run_id, 4, pool.queue)
    finally:
        pool.stop()
    assert [h["policy_version"] for h in headers] == [0, 1]
    assert all(h["env_steps"] == 16 for h in headers), headers
    loaded = Path(f"{blocked_env}.pids").read_text().split()
    assert str(worker_pid) in loaded  # the worker ran under the block
    assert blocked_env.read_text() == "", log.read_text()
