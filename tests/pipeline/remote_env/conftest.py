"""The remote-env tests' factory of remote vector envs on the session workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.remote_env import RemoteVectorEnv


@pytest.fixture
def remote(redis_url: str, workers: LocalWorkers) -> Iterator:
    """A factory for remote vector envs on the session workers, all closed after the test."""
    made: list[RemoteVectorEnv] = []

    def make(env_id: Any = "CartPole-v1", num_envs: int = 4, **kw) -> RemoteVectorEnv:
        kw.setdefault("shards", 2)
        env = RemoteVectorEnv(env_id, num_envs, redis_url=redis_url, **kw)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()
