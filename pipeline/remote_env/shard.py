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
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.cluster.heartbeat import Heartbeat
from clusterenv.pipeline.codec import CodecError
from clusterenv.pipeline.keys import ShardKeys, remote_env_client, remote_env_replies
from clusterenv.pipeline.remote_env.messages import (
    ADOPT,
    CALL,
    CALL_KINDS,
    CLOSE,
    HELLO,
    RESET,
    STEP,
    Message,
    ShardSpec,
    jsonable_metadata,
    pack,
    request_problem,
    unpack,
)
from clusterenv.pipeline.remote_env.values import Rows
from clusterenv.pipeline.spaces import from_leaves, leaf_spaces, space_to_tree

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


def _call_one(env: gym.Env, req: dict[str, Any], j: int) -> Any:
    """One env's answer to a CALL request (see RemoteVectorEnv.call / get_attr / set_attr)."""
    kind, name = req["kind"], req["name"]
    if kind == "get":
        return env.get_wrapper_attr(name)
    if kind == "set":
        env.set_wrapper_attr(name, req["values"][j])
        return None
    if kind == "call":
        attr = env.get_wrapper_attr(name)
        return attr(*req.get("args", ()), **req.get("kwargs", {})) if callable(attr) else attr
    # "wrapped": is a wrapper of the class named "module:qualname" in the env's stack?
    while isinstance(env, gym.Wrapper):
        if name in {f"{c.__module__}:{c.__qualname__}" for c in type(env).__mro__}:
            return True
        env = env.env
    return False


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
        self.last_obs: dict[int, Any] = {}
        self.obs_space: gym.Space | None = None
        self.action_space: gym.Space | None = None
        self.action_leaves: list[gym.Space] = []
        self.same_step = spec.autoreset == AutoresetMode.SAME_STEP.value
        self.steps = 0

    def _make_one(self) -> gym.Env:
        spec = self.spec
        if spec.env_spec is None:
            return gym.make(spec.env_id, **spec.env_kwargs)
        # The user's whole EnvSpec, wrapper stack included; it came as JSON, never pickled.
        return gym.make(EnvSpec.from_json(json.dumps(spec.env_spec)), **spec.env_kwargs)

    def _make(self, indices: list[int]) -> list[dict[str, Any]]:
        errors = []
        for i in indices:
            try:
                env = self._make_one()
            except Exception as exc:
                errors.append(_error(i, "make", exc))
                continue
            self.envs[i] = env
            # A fresh env (first placement or adopted after a lost worker) resets on its next step.
            self.needs_reset[i] = True
            if self.obs_space is None:
                self.obs_space, self.action_space = env.observation_space, env.action_space
                self.action_leaves = leaf_spaces(env.action_space)
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

    def reset(self, msg: Message) -> Message:
        seeds = msg.extra.get("seeds") or [None] * len(msg.envs)
        rows, infos, errors = Rows(self.obs_space, len(msg.envs), self.spec.note_types), [], []
        for j, (i, seed) in enumerate(zip(msg.envs, seeds, strict=True)):
            info: dict[str, Any] = {}
            try:
                obs, info = self.envs[i].reset(seed=seed, options=msg.tree)
                self.needs_reset[i] = False
            except Exception as exc:
                errors.append(_error(i, "reset", exc))
                obs = self.last_obs.get(i, self.obs_space.sample())
            rows.put(j, obs)
            self.last_obs[i] = obs
            infos.append(info)
        return rows.message(RESET, msg, infos, errors)

    def _step_one(self, i: int, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        env = self.envs[i]
        if self.needs_reset[i]:
            # NEXT_STEP autoreset, exactly as SyncVectorEnv: the step after a done resets.
            obs, info = env.reset()
            self.needs_reset[i] = False
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            if self.same_step:
                # SAME_STEP, as SyncVectorEnv: the final obs and info ride in the reset's info.
                final = {"final_obs": obs, "final_info": info}
                obs, info = env.reset()
                info = {**info, **final}
            else:
                self.needs_reset[i] = True
        return obs, reward, terminated, truncated, info

    def _end_failed(self, i: int) -> tuple[Any, dict[str, Any]]:
        """Env i raised in step: its state is unknown, so its episode ends (truncated); obs, info."""
        last = self.last_obs.get(i)
        if last is None:
            last = self.obs_space.sample()
        self.needs_reset[i] = True
        if not self.same_step:
            return last, {}
        final = {"final_obs": last, "final_info": {}}
        try:  # SAME_STEP: the next episode starts in this step, as after any other end
            obs, info = self.envs[i].reset()
        except Exception:  # the step's error is reported; the reset is tried again next step
            return last, final
        self.needs_reset[i] = False
        return obs, {**info, **final}

    def step(self, msg: Message) -> Message:
        # Writable copies: some envs clip their action in place.
        actions = [msg.arrays[f"action{k}"].copy() for k in range(len(self.action_leaves))]
        n = len(msg.envs)
        rows, reward = Rows(self.obs_space, n, self.spec.note_types), np.zeros(n, dtype=np.float64)
        terminated, truncated = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        infos, errors = [], []
        for j, i in enumerate(msg.envs):
            action = from_leaves(self.action_space, iter([a[j] for a in actions]))
            try:
                obs, r, term, trunc, info = self._step_one(i, action)
            except Exception as exc:
                errors.append(_error(i, "step", exc))
                obs, info = self._end_failed(i)
                r, term, trunc = 0.0, False, True
            reward[j], terminated[j], truncated[j] = r, term, trunc
            rows.put(j, obs, r, term, trunc)
            self.last_obs[i] = obs
            infos.append(info)
        self.steps += 1
        columns = {"reward": reward, "terminated": terminated, "truncated": truncated}
        return rows.message(STEP, msg, infos, errors, **columns)

    def call(self, msg: Message) -> Message:
        """Read, set or call an attribute of each env, or ask whether a wrapper class wraps it."""
        req = msg.tree
        if not (
            isinstance(req, dict)
            and req.get("kind") in CALL_KINDS
            and isinstance(req.get("name"), str)
        ):
            return Message(CALL, msg.seq, msg.envs, extra={"fatal": f"bad call request {req!r}"})
        results, errors = [], []
        for j, i in enumerate(msg.envs):
            try:
                results.append(_call_one(self.envs[i], req, j))
            except Exception as exc:
                errors.append(_error(i, f"{req['kind']} {req['name']}", exc))
                results.append(None)
        return Message(CALL, msg.seq, msg.envs, results, extra={"errors": errors})

    def handle(self, msg: Message) -> Message:
        unknown = [i for i in msg.envs if i not in self.envs and msg.op != ADOPT]
        if unknown:
            return Message(msg.op, msg.seq, msg.envs, extra={"fatal": f"no envs {unknown} here"})
        problem = request_problem(msg)
        if problem is not None:
            return Message(msg.op, msg.seq, msg.envs, extra={"fatal": f"bad request: {problem}"})
        if msg.op == STEP:
            want = {f"action{k}": (len(msg.envs),) for k in range(len(self.action_leaves))}
            if any(msg.arrays.get(k, np.zeros(0)).shape[:1] != n for k, n in want.items()):
                got = {k: a.shape for k, a in msg.arrays.items()}
                problem = f"a step needs one action per env and leaf {want}, got {got}"
                return Message(STEP, msg.seq, msg.envs, extra={"fatal": f"bad request: {problem}"})
            return self.step(msg)
        if msg.op == RESET:
            return self.reset(msg)
        if msg.op == CALL:
            return self.call(msg)
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
                "render_mode": env.render_mode if isinstance(env.render_mode, str) else None,
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
