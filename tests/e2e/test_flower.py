"""Flower, started as the docs say, lists chunk tasks with their arguments and a JSON result summary."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.servers import flower, http_get


def get_json(url: str):
    status, body = http_get(url)
    assert status == 200, status
    return json.loads(body)


@pytest.mark.slow
def test_flower_shows_chunks(redis_url, workers, celery_app, client, run_id):
    unauthenticated = {"FLOWER_UNAUTHENTICATED_API": "true"}
    with flower(redis_url, env=unauthenticated, timeout_s=30) as base:
        w = {
            "layers.0.weight": np.ones((2, 4), np.float32),
            "layers.0.bias": np.zeros(2, np.float32),
        }
        RedisWeightSource(client, RunKeys(run_id)).publish(w)
        # Task events are off in the workers (celeryconfig) until Flower turns them on, within
        # its 5 s enable-events period: chunks sent before then never show, so keep sending.
        deadline = time.monotonic() + 30
        mine: list[dict] = []
        sent = 0
        while len([t for t in mine if t["state"] == "SUCCESS"]) < 3:
            assert time.monotonic() < deadline, f"flower shows {mine} of {sent} chunks sent"
            req = ChunkRequest(
                run_id, sent, "CartPole-v1", 2, 5, seed=1, behaviour=EpsilonGreedy(0.5)
            )
            celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
            sent += 1
            time.sleep(0.5)
            tasks = get_json(f"{base}/api/tasks?taskname={COLLECT_CHUNK_TASK}&limit=1000").values()
            mine = [t for t in tasks if run_id in (t.get("kwargs") or "")]
        for t in mine:
            if t["state"] != "SUCCESS":
                continue
            assert "'steps': 5" in t["kwargs"]
            result = json.loads(t["result"])  # the result summary reads as JSON
            assert result["steps"] == 10 and result["policy_version"] == 0, result
            assert {"episodes_finished", "weight_fetches", "bytes"} <= set(result), result
