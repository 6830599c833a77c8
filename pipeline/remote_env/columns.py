"""The columns of a remote vector env over its shards: reset/step in column order, lost envs re-homed.

A lost shard's envs get fresh copies on the least-loaded surviving shard (an `adopt` request:
no free worker needed) or, with no survivor, on a new shard placed through Celery; for that step
they report `truncated=True` with `worker_lost` in their info, as NEXT_STEP autoreset expects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.remote_env.group import ShardGroup, ShardRef, remote_error
from pipeline.remote_env.messages import ADOPT, RESET, STEP, Message

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One reset/step result over all envs, in column order."""

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: list[dict[str, Any]]
    errors: list[dict[str, Any]] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


class ShardColumns:
    """Column i of the vector env always belongs to exactly one shard of `group`."""

    def __init__(self, group: ShardGroup):
        self.group, self.num_envs = group, group.num_envs
        self.obs_shape: tuple[int, ...] = ()
        self.obs_dtype = np.dtype(np.float32)
        self.last_obs: np.ndarray | None = None

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

    def set_obs_space(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.obs_shape, self.obs_dtype = shape, np.dtype(dtype)

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
            obs=np.zeros((n, *self.obs_shape), dtype=self.obs_dtype),
            rewards=np.zeros(n, dtype=np.float64),
            terminated=np.zeros(n, dtype=bool),
            truncated=np.zeros(n, dtype=bool),
            infos=[{} for _ in range(n)],
        )

    @staticmethod
    def _scatter(batch: Batch, msg: Message, ref: ShardRef) -> None:
        idx = np.asarray(msg.envs, dtype=np.int64)
        batch.obs[idx] = msg.arrays["obs"]
        for name, out in (("reward", batch.rewards), ("terminated", batch.terminated)):
            if name in msg.arrays:
                out[idx] = msg.arrays[name]
        if "truncated" in msg.arrays:
            batch.truncated[idx] = msg.arrays["truncated"]
        for i, info in zip(msg.envs, msg.tree or [], strict=False):
            batch.infos[i] = info
        for err in msg.extra.get("errors", []):
            batch.errors.append({**err, "worker": f"{ref.worker} pid {ref.pid}", "shard": ref.id})

    def reset(self, envs: list[int], seeds: list[int | None], options: Any) -> Batch:
        """Reset these columns; a shard lost meanwhile has its envs re-placed and reset again."""
        batch = self._empty()
        if self.last_obs is not None:
            batch.obs[:] = self.last_obs
        seed_of = dict(zip(envs, seeds, strict=True))
        todo = sorted(envs)
        while todo:
            requests = {}
            for sid, ref in self.group.live.items():
                mine = [i for i in ref.envs if i in seed_of and i in todo]
                if mine:
                    requests[sid] = Message(
                        RESET, 0, mine, options, extra={"seeds": [seed_of[i] for i in mine]}
                    )
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
        self.last_obs = batch.obs.copy()
        return batch

    def step(self, actions: np.ndarray) -> Batch:
        """Step every column; the columns of a lost shard report truncated with their last obs."""
        batch = self._empty()
        requests = {
            sid: Message(STEP, 0, ref.envs, arrays={"action": actions[ref.envs]})
            for sid, ref in self.group.live.items()
        }
        replies, lost = self.group.exchange(requests)
        for sid, msg in replies.items():
            self._scatter(batch, msg, self.group.live[sid])
        if lost:
            lost_envs = set(i for ref in lost for i in ref.envs)
            moved = self._recover(lost)
            for i in moved:
                # NEXT_STEP: this step ends the episode; the fresh copy resets on the next step.
                if i in lost_envs and self.last_obs is not None:
                    batch.obs[i] = self.last_obs[i]
                    batch.rewards[i] = 0.0
                    batch.terminated[i] = False
                batch.truncated[i] = True
                batch.infos[i] = {**batch.infos[i], "worker_lost": True}
            batch.lost = moved
        self.last_obs = batch.obs.copy()
        return batch
