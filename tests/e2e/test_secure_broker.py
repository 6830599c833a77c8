"""A broker only its users can reach: a password, ACL users and TLS with client certificates, end
to end for the learner CLI, workers, the remote env and Flower (with basic auth), each against a
real redis-server started here with certificates made here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.connect import RedisUnreachable, connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.remote_env import RemoteVectorEnv
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, net
from tests.servers import Certs, PrivateRedis, flower, http_get, make_certs

CLI = [sys.executable, "-m", "clusterenv.learner.tools.cli"]
ADMIN_PW = "admin-pw-5d1c"
# What a worker (and a learner) needs, and no more: clusterenv's keys, Celery's queues, bindings
# and reply queues, Pub/Sub for events, and no admin or dangerous commands (FLUSHALL, CONFIG,
# KEYS, DEBUG, ...). docs/operations.md gives the same rule.
ROLE_RULE = "on >{pw} ~clusterenv:* ~celery* ~_kombu.* ~unacked* ~*.pidbox* &* +@all -@dangerous"
WORKER_PW, LEARNER_PW = "worker-pw-88ab", "learner-pw-3f0e"
ACL = (f"worker {ROLE_RULE.format(pw=WORKER_PW)}", f"learner {ROLE_RULE.format(pw=LEARNER_PW)}")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI makes the test certificates; it is not installed")
    return make_certs(tmp_path_factory.mktemp("certs"))


def one_line_error(url: str, secret: str) -> str:
    with pytest.raises(RedisUnreachable) as info:
        connect(url)
    message = str(info.value)
    assert "\n" not in message and secret not in message, message
    return message


# --- wrong credentials and missing certificates: one clear line, no secret in it ---


def test_a_wrong_password_or_user_is_one_line():
    powerless = "powerless on >pw-9 ~* -@all +get"
    with PrivateRedis(password=ADMIN_PW, acl=(*ACL, powerless)) as server:
        assert connect(server.url).ping()
        assert connect(server.url_for("worker", WORKER_PW)).ping()
        wrong = "not-the-pw-77"
        assert "refused the credentials" in one_line_error(server.url_for(password=wrong), wrong)
        assert "refused the credentials" in one_line_error(server.url_for("worker", wrong), wrong)
        assert "refused the credentials" in one_line_error(server.url_for(), ADMIN_PW)
        assert "refused PING" in one_line_error(server.url_for("powerless", "pw-9"), "pw-9")


def test_tls_needs_the_ca_and_a_client_certificate(certs):
    with PrivateRedis(password=ADMIN_PW, certs=certs) as server:
        assert connect(server.url).ping()
        plain = f"redis://:{ADMIN_PW}@127.0.0.1:{server.port}/0"
        one_line_error(plain, ADMIN_PW)  # plain text to a TLS-only port
        no_client_cert = f"rediss://:{ADMIN_PW}@127.0.0.1:{server.port}/0?{certs.query(False)}"
        one_line_error(no_client_cert, ADMIN_PW)
        no_ca = f"rediss://:{ADMIN_PW}@127.0.0.1:{server.port}/0?ssl_cert_reqs=required"
        assert "certificate verify failed" in one_line_error(no_ca, ADMIN_PW)


def test_the_cli_says_a_wrong_password_in_one_line_and_leaves_nothing(tmp_path):
    with PrivateRedis(password=ADMIN_PW) as server:
        wrong = server.url_for(password="guess-123")
        out = subprocess.run(CLI + ["train", "--run-dir", str(tmp_path), "--redis-url", wrong],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "refused the credentials" in out.stderr and "guess-123" not in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_worker_with_a_wrong_password_stops_and_says_why():
    with PrivateRedis(password=ADMIN_PW) as server:
        env = {**os.environ, "CLUSTERENV_REDIS_URL": server.url_for(password="guess-456")}
        out = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "clusterenv.tasks", "worker", "--pool", "solo"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 1
    assert "Unrecoverable error: RedisUnreachable" in out.stderr
    assert "refused the credentials" in out.stderr and "guess-456" not in out.stderr


# --- a real training run over a password, and over TLS with a client certificate ---


@pytest.mark.slow
@pytest.mark.parametrize("tls", [False, True], ids=["password", "tls"])
def test_a_training_run_over_a_secured_broker(tmp_path, certs, tls):
    """The password run logs in as the default user; the TLS run as the `learner` ACL user (its
    local worker too, since it inherits the URL)."""
    with PrivateRedis(password=ADMIN_PW, acl=ACL, certs=certs if tls else None) as server:
        url = server.url_for("learner", LEARNER_PW) if tls else server.url
        out = subprocess.run(
            CLI + ["train", "--redis-url", url, "--workers", "1", "--total-steps", "1500",
                   "--eval-every", "1000", "--run-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        denied = connect(server.url).acl_log()  # the ACL refused the run nothing it needed
    assert out.returncode == 0, out.stderr
    assert denied == [], denied
    assert ADMIN_PW not in out.stderr and LEARNER_PW not in out.stderr and ":***@" in out.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 1500 and summary["updates"] > 0
    assert summary["sync_total"]["weight_fetches"] >= 1 and summary["ingest"]["rejected"] == 0
    config = (run_dir / "config.json").read_text()
    assert ADMIN_PW not in config and LEARNER_PW not in config and ":***@" in config
    assert ("rediss://" in config) == tls


# --- workers, the learner side, the remote env and Flower, each as its own ACL user over TLS ---


@pytest.fixture(scope="module")
def secure_stack(certs, tmp_path_factory) -> Iterator[tuple[PrivateRedis, LocalWorkers]]:
    """A TLS-only server with client certificates, an admin password and worker/learner ACL
    users; one real worker logged in as `worker`."""
    log = tmp_path_factory.mktemp("secure-workers") / "workers.log"
    with PrivateRedis(password=ADMIN_PW, acl=ACL, certs=certs) as server:
        pool = LocalWorkers(server.url_for("worker", WORKER_PW), 1, log_path=log)
        pool.start()
        try:
            pool.wait_ready(connect(server.url), expected=1)
            yield server, pool
        finally:
            pool.stop()


@pytest.mark.slow
def test_chunks_flow_between_acl_users_over_tls(secure_stack):
    server, _ = secure_stack
    learner_url = server.url_for("learner", LEARNER_PW)
    learner = connect(learner_url)
    keys = RunKeys(f"secure-{uuid.uuid4().hex[:8]}")
    RedisWeightSource(learner, keys).publish(net(0))
    reader = StreamReader(connect(learner_url, blocking=True), keys, CARTPOLE)
    sender = celery_client(learner_url)
    for chunk in range(3):
        req = ChunkRequest(
            keys.run_id, chunk, "CartPole-v1", 2, 5, seed=1, behaviour=EpsilonGreedy(0.5)
        )
        sender.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
    got: list[int] = []
    deadline = time.monotonic() + 30
    while len(got) < 3:
        assert time.monotonic() < deadline, f"only chunks {got} arrived"
        reader.poll(lambda h, a: got.append(h["chunk"]))
    assert sorted(got) == [0, 1, 2] and reader.stats.rejected == 0
    assert connect(server.url).acl_log() == []  # nothing the worker or learner needed was refused
    # The ACL bites: the worker user reaches no other key and no admin command.
    worker = redis.Redis.from_url(server.url_for("worker", WORKER_PW))
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.get("someone-else:secret")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.flushall()
    assert connect(server.url).dbsize() > 0


@pytest.mark.slow
def test_the_remote_env_over_tls_as_an_acl_user(secure_stack):
    server, _ = secure_stack
    envs = RemoteVectorEnv("CartPole-v1", 2, redis_url=server.url_for("learner", LEARNER_PW),
                           shards=1)  # fmt: skip
    try:
        obs, _ = envs.reset(seed=3)
        assert obs.shape == (2, 4)
        for _ in range(5):
            obs, reward, *_ = envs.step(np.array([0, 1]))
        assert obs.shape == (2, 4) and reward.tolist() == [1.0, 1.0]
    finally:
        envs.close()


@pytest.mark.slow
def test_flower_with_basic_auth_over_tls(secure_stack):
    server, _ = secure_stack
    login = ("ops", "flower-pw-1")
    with flower(server.url_for("learner", LEARNER_PW), "--basic-auth=ops:flower-pw-1",
                auth=login) as base:  # fmt: skip
        assert http_get(f"{base}/api/workers")[0] == 401
        assert http_get(f"{base}/api/workers", ("ops", "wrong"))[0] == 401
        assert http_get(f"{base}/", ("ops", "wrong"))[0] == 401
        # Flower reaches the workers through the TLS broker: they answer its inspect broadcast.
        status, body = http_get(f"{base}/api/workers?refresh=1", login, timeout_s=30)
        assert status == 200
        assert any(name.startswith("local0-") for name in json.loads(body)), body


def test_celery_verifies_the_server_certificate_by_default(certs):
    """Celery's Redis transport would skip verification for a rediss:// URL without ssl_* options;
    ours verifies, as redis-py does, so a server whose CA the client was not given is refused."""
    with PrivateRedis(password=ADMIN_PW, certs=certs, client_certs=False) as server:
        bare = f"rediss://:{ADMIN_PW}@127.0.0.1:{server.port}/0"
        with celery_client(bare).connection_for_write() as conn, pytest.raises(Exception) as info:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=5)
        assert "CERTIFICATE_VERIFY_FAILED" in repr(info.value)
        one_line_error(bare, ADMIN_PW)  # redis-py, and so learner and workers, refuse it too
        with celery_client(server.url).connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=5)  # the CA given: accepted
