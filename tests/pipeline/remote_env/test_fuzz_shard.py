"""Fuzzed requests pushed into a real shard's request list on a real server: each gets a reply
naming what is wrong, and the shard goes on serving well-formed requests."""

from __future__ import annotations

import threading
import uuid

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import ShardKeys, remote_env_client, remote_env_replies
from clusterenv.pipeline.remote_env.messages import (
    CLOSE,
    RESET,
    STEP,
    Message,
    ShardSpec,
    pack,
    unpack,
)
from clusterenv.pipeline.remote_env.shard import Shard
from tests.bad_input import json_values

ENVS = [0, 1]

bad_requests = st.one_of(
    st.binary(max_size=120),  # not a message at all
    st.builds(lambda a: Message(STEP, 1, ENVS, arrays={"action0": a}),  # one action too few or many
              st.sampled_from([np.zeros(1, np.int64), np.zeros(3, np.int64), np.zeros((), np.int64)])),
    st.just(Message(STEP, 1, ENVS)),  # no actions
    st.builds(lambda s: Message(RESET, 1, ENVS, extra={"seeds": s}),
              json_values.filter(lambda s: s is not None and not (
                  isinstance(s, list) and len(s) == 2
                  and all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in s)))),
    st.builds(lambda e: Message(STEP, 1, e, arrays={"action0": np.zeros(2, np.int64)}),
              st.lists(st.integers(2, 9), min_size=2, max_size=2)),  # envs it does not hold
).map(lambda r: r if isinstance(r, bytes) else pack(r))  # fmt: skip


def test_a_shard_answers_fuzzed_requests_and_serves_on(redis_url):
    client = connect(redis_url, blocking=True)
    session = f"fuzz-{uuid.uuid4().hex[:8]}"
    keys, replies = ShardKeys(session, 0), remote_env_replies(session)
    client.set(remote_env_client(session), "1", ex=120)
    spec = ShardSpec(session, 0, "CartPole-v1", ENVS, heartbeat_ttl_s=5.0, idle_timeout_s=60.0)
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(Shard(connect(redis_url, blocking=True), spec, "w").serve())
    )
    thread.start()

    def ask(blob: bytes) -> Message:
        client.rpush(keys.requests, blob)
        got = client.blpop([replies], timeout=20)
        assert got is not None, "the shard did not answer"
        return unpack(got[1])

    try:
        hello = client.blpop([replies], timeout=30)
        assert hello is not None and not unpack(hello[1]).extra.get("errors")
        assert "fatal" not in ask(pack(Message(RESET, 1, ENVS, extra={"seeds": [1, 2]}))).extra

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(bad_requests)
        def fuzz(blob):
            reply = ask(blob)
            fatal = reply.extra.get("fatal", "")
            assert fatal.startswith(("bad request: ", "no envs ")), reply
            assert thread.is_alive()

        fuzz()
        ok = ask(pack(Message(STEP, 2, ENVS, arrays={"action0": np.array([0, 1])})))
        assert "fatal" not in ok.extra and ok.arrays["obs0"].shape == (2, 4)
        assert ask(pack(Message(CLOSE, 3, []))).op == CLOSE
        thread.join(timeout=10)
        assert result["exit"] == "closed"
    finally:
        client.delete(remote_env_client(session))  # a shard still serving sees its client gone
        thread.join(timeout=10)
        client.delete(replies, keys.requests, keys.heartbeat)
