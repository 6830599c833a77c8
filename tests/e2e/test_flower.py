"""Flower, started as the docs say, lists chunk tasks with their arguments and a JSON result summary."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.sync.source import RedisWeightSource


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_flower_shows_chunks(redis_url, workers, celery_app, client, run_id):
    port = free_port()
    env = {**os.environ, "CLUSTERENV_REDIS_URL": redis_url, "FLOWER_UNAUTHENTICATED_API": "true"}
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "clusterenv.tasks", "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                get_json(f"{base}/api/tasks?limit=1")
                break
            except OSError:
                assert time.monotonic() < deadline, "flower did not come up"
                time.sleep(0.3)
        time.sleep(1.0)  # let Flower's event receiver attach before the tasks run
        w = {
            "layers.0.weight": np.ones((2, 4), np.float32),
            "layers.0.bias": np.zeros(2, np.float32),
        }
        RedisWeightSource(client, RunKeys(run_id)).publish(w)
        for i in range(3):
            req = ChunkRequest(run_id, i, "CartPole-v1", 2, 5, seed=1, epsilon=0.5)
            celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
        deadline = time.monotonic() + 30
        mine: list[dict] = []
        while len(mine) < 3 or any(t["state"] != "SUCCESS" for t in mine):
            assert time.monotonic() < deadline, f"flower shows {mine}"
            time.sleep(0.3)
            tasks = get_json(f"{base}/api/tasks?taskname={COLLECT_CHUNK_TASK}&limit=1000").values()
            mine = [t for t in tasks if run_id in (t.get("kwargs") or "")]
        for t in mine:
            assert "'steps': 5" in t["kwargs"]
            result = json.loads(t["result"])  # the result summary reads as JSON
            assert result["steps"] == 10 and result["policy_version"] == 0, result
            assert {"episodes_finished", "weight_fetches", "bytes"} <= set(result), result
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        flower.wait(timeout=10)
