"""The columns of a remote vector env over its shards: reset/step in column order, lost envs re-homed.

A lost shard's envs get fresh copies on the least-loaded surviving shard (an `adopt` request:
no free worker needed) or, with no survivor, on a new shard placed through Celery; for that step
they report `truncated=True` with `worker_lost` in their info: with NEXT_STEP autoreset the
fresh copy resets on the next step, with SAME_STEP at once (its old last obs is the final obs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.remote_env.group import ShardGroup, ShardRef, remote_error
from clusterenv.pipeline.remote_env.messages import ADOPT, CALL, RESET, STEP, Message
from clusterenv.pipeline.spaces import from_leaves, leaf_spaces

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One reset/step result over all envs, in column order; observations as one array per leaf."""

    obs_leaves: list[np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]]
    kinds: list[list[str]]
    errors: list[dict[str, Any]] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


class ShardColumns:
    """Column i of the vector env always belongs to exactly one shard of `group`."""

    def __init__(self, group: ShardGroup):
        self.group, self.num_envs = group, group.num_envs
        self.same_step = group.autoreset == AutoresetMode.SAME_STEP
        self.obs_space: gym.Space = gym.spaces.Tuple(())
        self.last_obs: list[np.ndarray] | None = None

    def start(self) -> dict[str, Any]:
        """Place the shards; returns the first shard's hello (spaces, metadata)."""
        unplaced = self.group.start()
        if unplaced:
            # Fewer workers took a shard than the heartbeats promised: the started shards
            # host the rest, so an over-count costs PLACEMENT_GRACE_S, not a failure.
            envs = sorted(sum(unplaced, []))
            log.warning("%d shard(s) found no free worker; envs %s go to the others",
                        len(unplaced), envs)  # fmt: skip
            self._rehome(envs)
        return self.group.hello

    def row(self, obs_leaves: list[np.ndarray], i: int) -> Any:
        """Env i's observation (a dict, tuple or array as the space is) from per-leaf arrays."""
        return from_leaves(self.obs_space, iter([a[i].copy() for a in obs_leaves]))

    def _rehome(self, envs: list[int]) -> list[int]:
        """Fresh copies of `envs` on survivors, else on a new shard; returns envs lost meanwhile."""
        if not self.group.live:
            self.group.place([envs])
            return []
        load = {sid: len(ref.envs) for sid, ref in self.group.live.items()}
        given: dict[int, list[int]] = {sid: [] for sid in self.group.live}
        for i in envs:
            sid = min(load, key=lambda s: (load[s], s))
            given[sid].append(i)
            load[sid] += 1
        requests = {sid: Message(ADOPT, 0, e) for sid, e in given.items() if e}
        replies, lost = self.group.exchange(requests)
        for sid, msg in replies.items():
            if msg.extra.get("errors"):
                raise remote_error(
                    "could not rebuild envs", msg.extra["errors"], self.group.live[sid]
                )
            self.group.live[sid].envs = sorted(self.group.live[sid].envs + given[sid])
        return sorted(i for ref in lost for i in ref.envs + given[ref.id])

    def _recover(self, lost: list[ShardRef]) -> list[int]:
        """Re-home the envs of lost shards (and of any shard lost while doing so)."""
        todo = sorted(i for ref in lost for i in ref.envs)
        moved: list[int] = []
        while todo:
            moved += todo
            todo = self._rehome(todo)
        return sorted(set(moved))

    def _empty(self) -> Batch:
        n = self.num_envs
        return Batch(
            obs_leaves=[
                np.zeros((n, *s.shape), dtype=s.dtype) for s in leaf_spaces(self.obs_space)
            ],
            rewards=np.zeros(n, dtype=np.float64),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
            infos=[{} for _ in range(n)],
            kinds=[[] for _ in range(n)],
        )

    @staticmethod
    def _scatter(batch: Batch, msg: Message, ref: ShardRef) -> None:
        idx = np.asarray(msg.envs, dtype=np.int64)
        for k, out in enumerate(batch.obs_leaves):
            out[idx] = msg.arrays[f"obs{k}"]
        for name, out in (("reward", batch.rewards), ("terminated", batch.terminated)):
            if name in msg.arrays:
                out[idx] = msg.arrays[name]
        if "truncated" in msg.arrays:
            batch.truncated[idx] = msg.arrays["truncated"]
        for i, info in zip(msg.envs, msg.tree or [], strict=False):
            batch.infos[i] = info
        kinds = msg.extra.get("kinds") or []
        if len(kinds) == 1:  # the shard's envs all returned the same types
            kinds = kinds * len(msg.envs)
        for i, row in zip(msg.envs, kinds, strict=False):
            if isinstance(row, list) and all(isinstance(k, str) for k in row):
                batch.kinds[i] = row
        for err in msg.extra.get("errors", []):
            batch.errors.append({**err, "worker": f"{ref.worker} pid {ref.pid}", "shard": ref.id})

    def _by_shard(self, todo: list[int]) -> dict[int, list[int]]:
        """The envs of `todo` each live shard holds, for the shards that hold any."""
        wanted = set(todo)
        held = {sid: [i for i in ref.envs if i in wanted] for sid, ref in self.group.live.items()}
        return {sid: mine for sid, mine in held.items() if mine}

    def reset(self, envs: list[int], seeds: list[int | None], options: Any) -> Batch:
        """Reset these columns; a shard lost meanwhile has its envs re-placed and reset again."""
        batch = self._empty()
        if self.last_obs is not None:
            for out, last in zip(batch.obs_leaves, self.last_obs, strict=True):
                out[:] = last
        seed_of = dict(zip(envs, seeds, strict=True))
        todo = sorted(envs)
        while todo:
            requests = {
                sid: Message(RESET, 0, mine, options, extra={"seeds": [seed_of[i] for i in mine]})
                for sid, mine in self._by_shard(todo).items()
            }
            replies, lost = self.group.exchange(requests)
            for sid, msg in replies.items():
                self._scatter(batch, msg, self.group.live[sid])
            moved = self._recover(lost) if lost else []
            batch.lost += moved
            # Envs of a lost shard that were not asked to reset still start a fresh episode.
            todo = moved
            seed_of.update({i: None for i in moved if i not in seed_of})
        for i in batch.lost:
            batch.infos[i] = {**batch.infos[i], "worker_lost": True}
        self.last_obs = [a.copy() for a in batch.obs_leaves]
        return batch

    def call(
        self, envs: list[int], request: dict[str, Any], values: list[Any] | None = None
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Each env's answer to a CALL request (`values[j]` is what env envs[j] is set to), and errors."""
        value_of = dict(zip(envs, values, strict=True)) if values is not None else {}
        results: dict[int, Any] = {}
        errors: list[dict[str, Any]] = []
        todo = sorted(envs)
        while todo:
            requests = {
                sid: Message(
                    CALL, 0, mine,
                    {**request, "values": [value_of[i] for i in mine]} if values else request,
                )
                for sid, mine in self._by_shard(todo).items()
            }  # fmt: skip
            replies, lost = self.group.exchange(requests)
            for sid, msg in replies.items():
                results.update(zip(msg.envs, msg.tree or [], strict=False))
                ref = self.group.live[sid]
                errors += [{**e, "worker": f"{ref.worker} pid {ref.pid}", "shard": sid}
                           for e in msg.extra.get("errors", [])]  # fmt: skip
            # The fresh copies of a lost shard's envs are asked again.
            todo = sorted(set(self._recover(lost)) & set(todo)) if lost else []
        return [results.get(i) for i in envs], errors

    def step(self, action_leaves: list[np.ndarray]) -> Batch:
        """Step every column; the columns of a lost shard report truncated (see the module doc)."""
        batch = self._empty()
        requests = {
            sid: Message(
                STEP,
                0,
                ref.envs,
                arrays={f"action{k}": a[ref.envs] for k, a in enumerate(action_leaves)},
            )
            for sid, ref in self.group.live.items()
        }
        replies, lost = self.group.exchange(requests)
        for sid, msg in replies.items():
            self._scatter(batch, msg, self.group.live[sid])
        if lost:
            self._truncate_lost(batch, lost)
        self.last_obs = [a.copy() for a in batch.obs_leaves]
        return batch

    def _truncate_lost(self, batch: Batch, lost: list[ShardRef]) -> None:
        """The lost shards' envs end their episode (truncated, reward 0) and start on a new home."""
        last = self.last_obs
        lost_envs = set(i for ref in lost for i in ref.envs)
        moved = self._recover(lost)
        # SAME_STEP: the fresh copies reset now; NEXT_STEP: they reset on the next step.
        fresh = self.reset(moved, [None] * len(moved), None) if self.same_step else None
        for i in moved:
            final = {}
            if i in lost_envs and last is not None:
                for out, prev in zip(batch.obs_leaves, last, strict=True):
                    out[i] = prev[i]
                batch.rewards[i], batch.terminated[i] = 0.0, False
            if fresh is not None:
                final = {"final_obs": self.row(batch.obs_leaves, i), "final_info": {}}
                for out, new in zip(batch.obs_leaves, fresh.obs_leaves, strict=True):
                    out[i] = new[i]
                final = {**fresh.infos[i], **final}
            batch.truncated[i] = True
            batch.infos[i] = {**batch.infos[i], **final, "worker_lost": True}
        batch.lost = moved
