"""PPO's chunks through real Celery workers: sampled actions with their behaviour log-probs."""

from __future__ import annotations

import time

import numpy as np

from clusterenv.pipeline.behaviour import Categorical
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import NumpyMLP, log_softmax
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, url_of
from tests.pipeline.chunks.test_chunk_pipeline import ENV_KWARGS, POLICY


def test_categorical_chunks_carry_the_log_probs_of_the_actions_taken(
    workers, celery_app, client, run_id
):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(POLICY)
    logp = {"logp": ArraySpec("<f4", ())}
    reader = StreamReader(connect(url_of(client), blocking=True), keys, CARTPOLE, logp)
    for cid in range(4):
        req = ChunkRequest(run_id, cid, "CartPole-v1", 3, 20, seed=5, behaviour=Categorical(),
                           env_kwargs=ENV_KWARGS)  # fmt: skip
        celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
    got: list[dict[str, np.ndarray]] = []
    deadline = time.monotonic() + 60
    while reader.stats.chunks < 4:
        assert time.monotonic() < deadline, f"only {reader.stats.chunks} of 4 chunks arrived"
        reader.poll(lambda h, a: got.append({k: v.copy() for k, v in a.items()}))
    assert reader.stats.rejected == 0
    a = {k: np.concatenate([g[k] for g in got]) for k in got[0]}
    logp = log_softmax(NumpyMLP(POLICY)(a["obs"]))
    np.testing.assert_allclose(a["logp"], logp[np.arange(len(a["action"])), a["action"]], rtol=1e-5)
    # Sampled, not greedy: the policy's less likely action was taken on some steps.
    assert (a["action"] != logp.argmax(axis=1)).any()
