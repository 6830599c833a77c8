"""Actor slots (pipeline/chunks/slots.py) on a real server: the lowest free slot, kept while its
process lives, taken over when it dies, so a restarted worker's envs keep their ladder rungs."""

from __future__ import annotations

import subprocess
import sys

from clusterenv.pipeline.behaviour import EpsilonLadder
from clusterenv.pipeline.chunks.slots import ActorSlots
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.keys import RunKeys


def test_processes_take_the_lowest_free_slots_and_keep_them(client, run_id):
    registry = WorkerRegistry(client)
    for host in ("a", "b"):
        registry.announce(f"celery@{host}", 1, ttl_s=60)
    a, b = (ActorSlots(client, RunKeys(run_id), f"celery@{h}:100") for h in "ab")
    assert (a.claim(), b.claim()) == (0, 1)
    assert (a.claim(), b.claim()) == (0, 1)  # asked again (a run rebuilt after an env fault)
    a.release()
    assert ActorSlots(client, RunKeys(run_id), "celery@b:101").claim() == 0
    for host in ("a", "b"):
        registry.withdraw(f"celery@{host}")


def test_a_restarted_worker_takes_over_the_dead_ones_slot_and_its_epsilons(client, run_id):
    """Three workers hold slots 0-2 of a 6-env ladder; the one in slot 1 dies (its heartbeat
    lapses: withdrawn here, as a SIGTERM does, or expired after a SIGKILL); its replacement
    gets slot 1, so its envs act with the dead worker's two ε, and the others keep theirs."""
    registry, keys = WorkerRegistry(client), RunKeys(run_id)
    for host in ("a", "b", "c", "d"):
        registry.announce(f"celery@{host}", 1, ttl_s=60)
    old = {h: ActorSlots(client, keys, f"celery@{h}:7") for h in "abc"}
    slots = {h: s.claim() for h, s in old.items()}
    assert slots == {"a": 0, "b": 1, "c": 2}
    ladder = EpsilonLadder(0.4, 7.0, size=6)
    before = ladder.for_actor(slots["b"], 2)
    registry.withdraw("celery@b")
    assert ActorSlots(client, keys, "celery@d:8").claim() == 1
    assert ladder.for_actor(1, 2) == before
    assert old["a"].claim() == 0 and old["c"].claim() == 2
    for host in ("a", "c", "d"):
        registry.withdraw(f"celery@{host}")


def test_a_dead_sibling_process_leaves_its_slot_though_its_worker_lives(client, run_id):
    """A prefork child replaced while its worker runs on: the worker's heartbeat is alive, but
    the child's pid is gone, and a process of the same worker takes its slot."""
    registry, keys = WorkerRegistry(client), RunKeys(run_id)
    registry.announce("celery@host", 2, ttl_s=60)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(gone.stdout)
    assert ActorSlots(client, keys, "celery@host:1").claim() == 0  # pid 1 is alive
    assert ActorSlots(client, keys, f"celery@host:{dead_pid}").claim() == 1
    assert ActorSlots(client, keys, "celery@host:999999999").claim() == 1  # the dead child's
    registry.withdraw("celery@host")
