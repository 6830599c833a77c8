"""docker/ for real, with Debian's podman and podman-compose: both targets of docker/Dockerfile
built on a base image made without a registry (docker/base-image.sh), docker/compose.yaml
started, and its learner service trained to its exit.

Opt-in (CLUSTERENV_PODMAN=1): it takes minutes and needs root, Debian's mirror and PyPI. It
skips with the reason where podman is missing or cannot run a container. What it ran last, and
the exact commands, are in docker/README.md ("What was run").
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
import redis

from clusterenv.pipeline.cluster.embedded import free_port
from tests.learner.test_prometheus import samples

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BASE = "localhost/clusterenv-base:bookworm"
REDIS = "localhost/clusterenv-redis:bookworm"
PROJECT = "clusterenv-podman-test"
# The CPU build of torch, from local disk (PyTorch's index is not reachable from every host);
# without it the learner image takes torch from PyTorch's index (the Dockerfile's default).
WHEELS = Path(os.environ.get("CLUSTERENV_TORCH_WHEELS", "/opt/wheels"))
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("CLUSTERENV_PODMAN") != "1",
        reason="opt-in, CLUSTERENV_PODMAN=1: builds the images and runs compose.yaml with podman "
        "(1.5-3 min; root, Debian's mirror and PyPI)",
    ),
]


def sh(*argv: str | Path, env: dict[str, str], timeout: float, check: bool = True, **kw):
    proc = subprocess.run(
        [str(a) for a in argv], env=env, timeout=timeout, capture_output=True, text=True, **kw
    )
    if check and proc.returncode:
        raise AssertionError(f"{argv}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")  # fmt: skip
    return proc


def podman_env(tmp: Path) -> dict[str, str]:
    """podman's environment: as is if it runs a container, else with a containers.conf that
    works around what stops it (seen here: hybrid cgroups v1+v2, which crun refuses, and no
    CAP_SYS_RESOURCE, so podman's default ulimits cannot be set); skip if neither runs."""
    env = dict(os.environ)
    probe = ["podman", "run", "--rm", "--network", "none", BASE, "true"]
    plain = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    if plain.returncode == 0:
        return env
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    conf = tmp / "containers.conf"
    conf.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        + ('[engine]\nruntime = "runc"\n' if shutil.which("runc") else "")
    )
    env["CONTAINERS_CONF"] = str(conf)
    fixed = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    if fixed.returncode:
        pytest.skip(
            f"podman cannot run a container here: `{' '.join(probe)}` -> "
            f"{plain.stderr.strip()!r}; with CONTAINERS_CONF ({conf.read_text()!r}) -> "
            f"{fixed.stderr.strip()!r}"
        )
    return env


def build(target: str, env: dict[str, str], tmp: Path) -> float:
    """`podman build` of one Dockerfile target on the registry-free base; seconds taken."""
    # pip in the build trusts the host's CA bundle (a TLS-inspecting proxy's CA lives there).
    (tmp / "pip.conf").write_text(f"[global]\ncert = {CA_BUNDLE}\n")
    args = ["--build-arg", f"BASE={BASE}", "--network", "host"]
    if CA_BUNDLE.exists():
        args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "-v", f"{tmp / 'pip.conf'}:/etc/pip.conf:ro"]
    if list(WHEELS.glob("torch-2.13.0+cpu-*.whl")):
        args += ["-v", f"{WHEELS}:/wheels:ro", "--build-arg", "TORCH_PIP_ARGS=--find-links /wheels"]
    t0 = time.monotonic()
    sh("podman", "build", *args, "-f", "docker/Dockerfile", "--target", target,
       "-t", f"clusterenv-{target}", ".", env=env, timeout=1200, cwd=ROOT)  # fmt: skip
    return time.monotonic() - t0


def http_status(url: str, auth: str | None) -> int:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def scrape_steps(url: str) -> float | None:
    """clusterenv_env_steps_total from the learner's endpoint, or None while it is not serving."""
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return samples(response.read().decode()).get("clusterenv_env_steps_total") or None
    except (OSError, urllib.error.URLError):
        return None


def test_images_build_and_compose_trains_to_the_learners_exit(tmp_path):
    for tool in ("podman", "podman-compose"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install podman podman-compose)")
    if os.geteuid() != 0:
        pytest.skip("needs root: rootful podman, and debootstrap for the base images")
    env = dict(os.environ)
    missing = [i for i in (BASE, REDIS) if sh("podman", "image", "exists", i, env=env,
                                               timeout=60, check=False).returncode]  # fmt: skip
    if missing:
        if shutil.which("debootstrap") is None:
            pytest.skip(f"{missing} missing and no debootstrap to make them (apt-get install "
                        "debootstrap; then sh docker/base-image.sh)")  # fmt: skip
        sh("sh", DOCKER / "base-image.sh", env=env, timeout=900)
    env = podman_env(tmp_path)
    took = {target: build(target, env, tmp_path) for target in ("worker", "learner")}
    pip_list = sh(
        "podman", "run", "--rm", "clusterenv-learner", "pip", "list", env=env, timeout=120
    )
    assert "2.13.0+cpu" in pip_list.stdout and "nvidia" not in pip_list.stdout

    # The compose files as they are, in a folder of their own, so its .env is not docker/.env.
    work = tmp_path / "docker"
    work.mkdir()
    for name in ("compose.yaml", "compose.worker.yaml"):
        shutil.copy(DOCKER / name, work / name)
    password, flower_auth = secrets.token_hex(24), f"admin:{secrets.token_hex(12)}"
    redis_port, flower_port, metrics_port = free_port(), free_port(), free_port()
    (work / ".env").write_text(
        f"REDIS_PASSWORD={password}\nFLOWER_BASIC_AUTH={flower_auth}\n"
        f"FLOWER_BIND=127.0.0.1\nFLOWER_PORT={flower_port}\n"
        f"REDIS_BIND=127.0.0.1\nREDIS_PUBLISH_PORT={redis_port}\nREDIS_IMAGE={REDIS}\n"
        "REDIS_MAXMEMORY=1gb\nWORKER_CONCURRENCY=0\nTRAIN_ENV=CartPole-v1\n"
        f"METRICS_BIND=127.0.0.1\nMETRICS_PORT={metrics_port}\n"
    )
    compose = ["podman-compose", "-p", PROJECT]
    learner = f"{PROJECT}_learner_1"
    t0, scraped = time.monotonic(), None
    try:
        sh(*compose, "up", "-d", "--no-build", env=env, timeout=300, cwd=work)
        deadline = time.monotonic() + 600
        while True:
            state = sh("podman", "inspect", learner, "--format",
                       "{{.State.Status}} {{.State.ExitCode}}", env=env, timeout=60)  # fmt: skip
            status, code = state.stdout.split()
            if status in ("exited", "stopped"):
                break
            assert time.monotonic() < deadline, "the learner did not exit within 600 s"
            scraped = scraped or scrape_steps(f"http://127.0.0.1:{metrics_port}/metrics")
            time.sleep(1)
        trained = time.monotonic() - t0
        out = sh("podman", "logs", learner, env=env, timeout=60)
        logs = out.stdout + out.stderr
        assert code == "0", logs[-4000:]

        # Redis on its published port, with the password; Flower behind its login.
        assert redis.Redis(port=redis_port, password=password).ping()
        url = f"http://127.0.0.1:{flower_port}/api/workers"
        assert http_status(url, None) == 401
        assert http_status(url, flower_auth) == 200

        volume = sh("podman", "volume", "inspect", f"{PROJECT}_runs", "--format",
                    "{{.Mountpoint}}", env=env, timeout=60).stdout.strip()  # fmt: skip
        (run_dir,) = Path(volume).iterdir()
        for name in ("config.json", "metrics.jsonl", "final.safetensors", "summary.json"):
            assert (run_dir / name).is_file(), (name, sorted(p.name for p in run_dir.iterdir()))
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["failed"] is None and summary["env_steps"] > 0
        # Lost chunks are not asserted: a worker slow to come up (seen once here: 50 s between
        # Celery's "mingle" and "ready") has its first chunks written off after --lost-after-s
        # and sent again, and the run goes on, as it is meant to.
        assert summary["ingest"]["rejected"] == 0
        # The learner's Prometheus endpoint answered on its published port while it trained.
        assert scraped is not None and scraped > 0, "no scrape of the learner's metrics"
        print(
            f"\nbuild worker {took['worker']:.0f} s, learner {took['learner']:.0f} s; compose up to "
            f"the learner's exit {trained:.0f} s; {run_dir.name}: solved={summary['solved']} "
            f"best eval {summary['best']['eval_mean'] if summary['best'] else None} after "
            f"{summary['env_steps']} env steps, {summary['updates']} updates, "
            f"{summary['wall_s']:.1f} s, lost chunks {summary['lost_chunks']}; CONTAINERS_CONF {env.get('CONTAINERS_CONF')}"
        )
    finally:
        sh(*compose, "down", "-v", env=env, timeout=300, cwd=work, check=False)
        sh("podman", "network", "rm", f"{PROJECT}_default", env=env, timeout=60, check=False)
