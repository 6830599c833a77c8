"""`clusterenv train --metrics-port`: a Prometheus endpoint scraped over HTTP while a real run
trains (embedded server, two local workers), and parsed by prometheus_client's own parser."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.e2e.cli_runs import (
    CLI,
    Tree,
    assert_no_survivors,
    only_run_dir,
    start_cli,
    wait_watching,
)
from tests.learner.test_prometheus import samples


@pytest.mark.slow
def test_the_endpoint_is_scraped_and_parsed_while_a_run_trains(tmp_path):
    mark = uuid.uuid4().hex
    proc = start_cli(
        ["train", "--total-steps", "8000", "--workers", "2", "--target-return", "1e9",
         "--eval-every", "4000", "--metrics-port", "0", "--run-dir", str(tmp_path)], mark,
    )  # fmt: skip
    tree, scrapes = Tree(proc), []
    try:
        for _ in range(50):  # the address is printed before the run directory is made
            line = proc.stderr.readline()
            if line.startswith("metrics: ") or not line:
                break
        assert line.startswith("metrics: http://127.0.0.1:"), line
        url = line.split()[1]
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            tree.look()
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    assert response.headers["Content-Type"].startswith("text/plain")
                    scrapes.append(samples(response.read().decode()))
            except (urllib.error.URLError, ConnectionError) as exc:
                # The endpoint closes with the run, before the workers are stopped.
                ended = list(tmp_path.glob("*/summary.json")) or proc.poll() is not None
                assert ended, f"the endpoint failed while the run was up: {exc}"
                break
            time.sleep(0.5)
        err = wait_watching(proc, tree, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert_no_survivors(mark, tree)
    # Until the run is wired (workers started, env spaces read) the endpoint serves the process's
    # own figures alone.
    assert all("process_resident_memory_bytes" in s for s in scrapes)
    scrapes = [s for s in scrapes if "clusterenv_env_steps_total" in s]
    assert len(scrapes) >= 3, "a run of 8,000 steps lasts several seconds"
    steps = [s["clusterenv_env_steps_total"] for s in scrapes]
    assert steps == sorted(steps) and steps[-1] > 0
    assert max(s["clusterenv_env_steps_per_second"] for s in scrapes) > 0
    assert max(s["clusterenv_updates_total"] for s in scrapes) > 0
    assert max(s["clusterenv_live_workers"] for s in scrapes) == 2  # the eval worker not counted
    assert all(0 <= s["clusterenv_chunks_per_worker"] <= 2 for s in scrapes)  # the quota
    assert max(s["clusterenv_policy_version"] for s in scrapes) >= 1
    last = scrapes[-1]
    assert any(k.startswith("clusterenv_run_info{") and "env=CartPole-v1" in k for k in last)
    assert last["clusterenv_env_errors_total{kind=step}"] == 0
    assert last["process_resident_memory_bytes"] > 0  # the learner process's own
    summary = only_run_dir(tmp_path) / "summary.json"
    assert summary.exists()


def test_a_port_in_use_is_refused_before_the_run_directory_is_made(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(CLI + ["train", "--run-dir", str(tmp_path), "--metrics-port",
                                    str(port)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and f"--metrics-port {port}: cannot serve" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []
