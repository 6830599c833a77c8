"""The bench-only echo task: answered by workers that include it, absent from production workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.echo import MODULE
from bench.remote_env import celery_round_trip
from clusterenv.pipeline.cluster.embedded import EmbeddedServer, LocalWorkers
from clusterenv.pipeline.connect import connect

ROOT = Path(__file__).resolve().parents[2]


def test_production_workers_carry_no_benchmark_task():
    code = (
        "import json; from clusterenv.tasks import app; app.loader.import_default_modules(); "
        "print(json.dumps(sorted(t for t in app.tasks if not t.startswith('celery.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)  # fmt: skip
    tasks = json.loads(out.stdout.splitlines()[-1])
    assert tasks == ["clusterenv.collect_chunk", "clusterenv.evaluate", "clusterenv.host_shard"]


def test_workers_started_with_the_bench_module_answer_the_echo(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import bench.echo by name
    # A server of its own: a session worker without the task must not take an echo.
    server = EmbeddedServer()
    url = server.start()
    pool = LocalWorkers(url, 1, log_path=tmp_path / "worker.log", include=[MODULE])
    try:
        pool.start()
        pool.wait_ready(connect(url), expected=1)
        rtt = celery_round_trip(url, samples=3)
    finally:
        pool.stop()
        server.stop()
    assert 0 < rtt["p50_ms"] <= rtt["p99_ms"]
