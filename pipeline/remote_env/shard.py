"""Worker side of the remote env: one shard's envs, stepped on requests popped from a Redis list.

A shard lives inside one long `clusterenv.host_shard` task. It answers every request on its reply
list, keeps a heartbeat key alive from a thread (so a slow env step is not mistaken for a dead
worker) and exits on `close`, after `idle_timeout_s` without requests, when the client's liveness
key lapses, or when the client has disowned it (deleted its heartbeat).
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from typing import Any

import gymnasium as gym
import numpy as np
import redis

from pipeline.cluster.heartbeat import Heartbeat
from pipeline.codec import CodecError
from pipeline.keys import ShardKeys, remote_env_client, remote_env_replies
from pipeline.remote_env.messages import (
    ADOPT,
    CLOSE,
    HELLO,
    RESET,
    STEP,
    Message,
    ShardSpec,
    jsonable_metadata,
    pack,
    request_problem,
    space_to_tree,
    unpack,
)

# How long one BLPOP waits before the loop looks at its exit conditions again.
POLL_S = 1.0
# Remote tracebacks are cut to their tail; the caller needs the frame that raised, not the world.
TRACEBACK_CHARS = 4000

log = logging.getLogger(__name__)


def _error(env: int, where: str, exc: BaseException) -> dict[str, Any]:
    return {
        "env": env,
        "where": where,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc()[-TRACEBACK_CHARS:],
    }


class ShardLiveness:
    """The shard's heartbeat key; notes why the shard should stop if it must."""

    def __init__(self, client: redis.Redis, spec: ShardSpec, value: str):
        self.client, self.spec, self.value = client, spec, value
        self.key = ShardKeys(spec.session, spec.shard).heartbeat
        self.ttl_ms = int(spec.heartbeat_ttl_s * 1000)
        self.stop_reason: str | None = None

    def beat(self, *, first: bool = False) -> bool:
        """Refresh the key; False once the shard should stop (the heartbeat loop then ends)."""
        # XX: once the client has deleted the key (it declared this shard lost), never revive it.
        if not self.client.set(self.key, self.value, px=self.ttl_ms, xx=not first):
            self.stop_reason = "disowned by the client"
        elif not self.client.exists(remote_env_client(self.spec.session)):
            self.stop_reason = "client gone"
        return self.stop_reason is None


class Shard:
    """The envs of one shard, keyed by their column in the client's vector env."""

    def __init__(self, client: redis.Redis, spec: ShardSpec, worker: str):
        self.client, self.spec, self.worker = client, spec, worker
        self.keys = ShardKeys(spec.session, spec.shard)
        self.replies = remote_env_replies(spec.session)
        self.envs: dict[int, gym.Env] = {}
        self.needs_reset: dict[int, bool] = {}
        self.last_obs: dict[int, np.ndarray] = {}
        self.obs_space: gym.Space | None = None
        self.steps = 0

    def _make(self, indices: list[int]) -> list[dict[str, Any]]:
        errors = []
        for i in indices:
            try:
                env = gym.make(self.spec.env_id, **self.spec.env_kwargs)
            except Exception as exc:
                errors.append(_error(i, "make", exc))
                continue
            self.envs[i] = env
            # A fresh env (first placement or adopted after a lost worker) resets on its next step.
            self.needs_reset[i] = True
            if self.obs_space is None:
                self.obs_space = env.observation_space
        return errors

    def _blob(self, msg: Message) -> bytes:
        msg.shard = self.spec.shard
        return pack(msg)

    def _next_request(self, reply: bytes | None) -> Any:
        """Push the last reply and wait for the next request, in one round trip."""
        if reply is None:
            return self.client.blpop([self.keys.requests], timeout=POLL_S)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(self.replies, reply)
        pipe.blpop([self.keys.requests], timeout=POLL_S)
        return pipe.execute()[1]

    def _rows(self, n: int) -> np.ndarray:
        space = self.obs_space
        return np.zeros((n, *space.shape), dtype=space.dtype)

    def reset(self, msg: Message) -> Message:
        seeds = msg.extra.get("seeds") or [None] * len(msg.envs)
        obs, infos, errors = self._rows(len(msg.envs)), [], []
        for j, (i, seed) in enumerate(zip(msg.envs, seeds, strict=True)):
            info: dict[str, Any] = {}
            try:
                obs[j], info = self.envs[i].reset(seed=seed, options=msg.tree)
                self.needs_reset[i] = False
            except Exception as exc:
                errors.append(_error(i, "reset", exc))
            self.last_obs[i] = obs[j]
            infos.append(info)
        tree = infos if any(infos) else None  # most envs return empty infos: send nothing
        return Message(RESET, msg.seq, msg.envs, tree, {"obs": obs}, {"errors": errors})

    def step(self, msg: Message) -> Message:
        actions = msg.arrays["action"].copy()  # writable: some envs clip their action in place
        n = len(msg.envs)
        obs, reward = self._rows(n), np.zeros(n, dtype=np.float64)
        terminated, truncated = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        infos, errors = [], []
        for j, i in enumerate(msg.envs):
            env, info = self.envs[i], {}
            try:
                # NEXT_STEP autoreset, exactly as SyncVectorEnv: the step after a done resets.
                if self.needs_reset[i]:
                    obs[j], info = env.reset()
                else:
                    obs[j], reward[j], terminated[j], truncated[j], info = env.step(actions[j])
                self.needs_reset[i] = bool(terminated[j] or truncated[j])
            except Exception as exc:
                # The env's state is unknown now: end its episode (truncated) and reset it next.
                errors.append(_error(i, "step", exc))
                obs[j] = self.last_obs.get(i, obs[j])
                truncated[j], self.needs_reset[i] = True, True
            self.last_obs[i] = obs[j]
            infos.append(info)
        self.steps += 1
        arrays = {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated}
        tree = infos if any(infos) else None
        return Message(STEP, msg.seq, msg.envs, tree, arrays, {"errors": errors})

    def handle(self, msg: Message) -> Message:
        unknown = [i for i in msg.envs if i not in self.envs and msg.op != ADOPT]
        if unknown:
            return Message(msg.op, msg.seq, msg.envs, extra={"fatal": f"no envs {unknown} here"})
        problem = request_problem(msg)
        if problem is not None:
            return Message(msg.op, msg.seq, msg.envs, extra={"fatal": f"bad request: {problem}"})
        if msg.op == STEP:
            return self.step(msg)
        if msg.op == RESET:
            return self.reset(msg)
        return Message(ADOPT, msg.seq, msg.envs, extra={"errors": self._make(msg.envs)})

    def hello(self, errors: list[dict[str, Any]]) -> Message:
        extra: dict[str, Any] = {"worker": self.worker, "pid": os.getpid(), "errors": errors}
        tree = None
        if not errors:
            env = next(iter(self.envs.values()))
            tree = {
                "observation_space": space_to_tree(env.observation_space),
                "action_space": space_to_tree(env.action_space),
                "metadata": jsonable_metadata(env.metadata),
            }
        return Message(HELLO, 0, self.spec.env_indices, tree, extra=extra)

    def serve(self) -> dict[str, Any]:
        """Build the envs, say hello, answer requests until an exit condition; returns a summary."""
        if not self.client.exists(remote_env_client(self.spec.session)):
            return {"shard": self.spec.shard, "exit": "client gone before start"}
        value = json.dumps({"worker": self.worker, "pid": os.getpid()})
        liveness = ShardLiveness(self.client, self.spec, value)
        liveness.beat(first=True)
        # From a thread, so a slow env step is not mistaken for a dead worker.
        beat = Heartbeat(
            f"shard-{self.spec.shard}-heartbeat", liveness.beat, self.spec.heartbeat_ttl_s / 3
        )
        reason, reply = "closed", None
        try:
            errors = self._make(self.spec.env_indices)
            reply = self._blob(self.hello(errors))
            if errors:
                return {"shard": self.spec.shard, "exit": "env creation failed"}
            beat.start()
            idle_since = time.monotonic()
            while True:
                if liveness.stop_reason:
                    reason = liveness.stop_reason
                    break
                item, reply = self._next_request(reply), None
                if item is None:
                    if time.monotonic() - idle_since > self.spec.idle_timeout_s:
                        reason = "idle timeout"
                        break
                    continue
                idle_since = time.monotonic()
                try:
                    msg = unpack(item[1])
                except CodecError as exc:
                    reply = self._blob(
                        Message(STEP, -1, [], extra={"fatal": f"bad request: {exc}"})
                    )
                    continue
                if msg.op == CLOSE:
                    # Acked only after the cleanup below, so a closed env leaves no key behind.
                    reply = self._blob(Message(CLOSE, msg.seq, []))
                    break
                reply = self._blob(self.handle(msg))
        finally:
            beat.stop(timeout_s=0)
            for env in self.envs.values():
                try:
                    env.close()
                except Exception as exc:  # closing must go on for the other envs
                    log.warning("env close failed: %s", exc)
            self.client.delete(self.keys.heartbeat, self.keys.requests)
            if reason == "client gone":
                self.client.delete(self.replies)
            elif reply is not None:
                self.client.rpush(self.replies, reply)
        return {"shard": self.spec.shard, "steps": self.steps, "exit": reason}
