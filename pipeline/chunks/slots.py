"""Actor slots: which rungs of a run's exploration ladder a worker process's envs take.

A worker process claims the lowest slot no live process holds when it starts serving a run, and
keeps it while it lives. A process that died leaves its slot to the next one that starts, so a
restarted worker takes its predecessor's rungs (Ape-X's fixed ε_i stays with actor i) instead of
the next ones round the ladder, and a run's live processes hold slots 0..N-1, the N the learner
sized the ladder for (pipeline/behaviour.py's EpsilonLadder).

A holder ("hostname:pid", tasks/collect.py) counts as dead when its worker's registry heartbeat
has lapsed (a lost machine, a SIGKILLed worker) or, for a process of this worker, when its pid is
gone (a prefork child replaced while the worker lives on: the heartbeat is the worker's, not the
child's).

The gap: a replacement that starts on another worker before the dead one's heartbeat has lapsed
(its TTL, celeryconfig's clusterenv_heartbeat_ttl_s) finds no dead slot and takes a new one; the
dead slot goes to the next process that starts.
"""

from __future__ import annotations

import os

import redis

from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.keys import RunKeys

# Claims race only with processes starting at the same moment; each lost race means one of them
# got a slot, so a few rounds always settle.
CLAIM_ROUNDS = 64


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: there
        return True
    return True


class ActorSlots:
    """One worker process's slot in one run's `actor-slots` hash."""

    def __init__(self, client: redis.Redis, keys: RunKeys, worker_name: str):
        self.client, self.key, self.me = client, keys.actor_slots, worker_name
        self.hostname = worker_name.rpartition(":")[0] or worker_name
        self.registry = WorkerRegistry(client)

    def _alive(self, holder: str) -> bool:
        if holder == self.me:
            return True
        hostname, _, pid = holder.rpartition(":")
        if hostname == self.hostname and pid.isdigit():  # a sibling process: its pid tells
            return _pid_alive(int(pid))
        return self.registry.is_alive(hostname or holder)

    def claim(self) -> int:
        """This process's slot: the one it holds already, else the lowest free or dead one."""
        for _ in range(CLAIM_ROUNDS):
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(self.key)  # a claim by anyone else meanwhile: read again
                    held = {int(k): _text(v) for k, v in pipe.hgetall(self.key).items()}
                    mine = [slot for slot, holder in held.items() if holder == self.me]
                    if mine:
                        return min(mine)
                    slot = next(s for s in range(len(held) + 1)
                                if s not in held or not self._alive(held[s]))  # fmt: skip
                    pipe.multi()
                    pipe.hset(self.key, str(slot), self.me)
                    pipe.execute()
                    return slot
                except redis.WatchError:
                    continue
        raise RuntimeError(
            f"could not claim an actor slot in {self.key} ({CLAIM_ROUNDS} races lost)"
        )

    def release(self) -> None:
        """Give this process's slot back (it stops serving the run but lives on)."""
        for _ in range(CLAIM_ROUNDS):
            with self.client.pipeline() as pipe:
                try:
                    pipe.watch(self.key)
                    mine = [k for k, v in pipe.hgetall(self.key).items() if _text(v) == self.me]
                    pipe.multi()
                    if mine:
                        pipe.hdel(self.key, *mine)
                    pipe.execute()
                    return
                except redis.WatchError:  # another process claimed meanwhile: read again
                    continue


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
