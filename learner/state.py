"""A run's resumable state: what a periodic checkpoint holds and how a resumed learner takes it
back; and marking a run stopped on the broker (the learner's own at its end, dead ones' at resume).

Tensors: both networks, Adam's per-parameter state, the torch RNG state, the accounting arrays
(lag, divergence, episode returns) and, with --checkpoint-replay, replay's rows. JSON: counters
(updates, env steps, policy version, next chunk id, lost chunks, ingest counters), the evaluation
schedule and results so far, the numpy generators' states, Adam's hyperparameters and the rate
limiter. Everything else (chunks in flight, the ingest ledger, reference states) belongs to one
learner's run id on the broker and starts afresh under the resumed learner's new run id.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import torch

from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys

if TYPE_CHECKING:
    from clusterenv.learner.resume import Resumed
    from clusterenv.learner.trainer import Trainer


def mark_started(client: redis.Redis, keys: RunKeys) -> None:
    """Set the run's marker: a broker that later lacks it has lost the run's keys (a restart
    without persistence), whatever the learner has re-written since."""
    client.set(keys.marker, 1)


def mark_stopped(client: redis.Redis, keys: RunKeys) -> None:
    """Set the run's stop key (queued chunks return at once, workers drop its envs) and let its
    keys expire; stream entries nobody will read go with them."""
    pipe = client.pipeline(transaction=False)
    pipe.set(keys.stop, 1, ex=RUN_KEYS_TTL_S)  # late chunks see it and return at once
    for key in (keys.stream, keys.actor_counter, keys.weights_latest, keys.marker):
        pipe.expire(key, RUN_KEYS_TTL_S)
    pipe.execute()


def optimizer_state(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """An optimizer's state_dict flattened: per-parameter tensors `optim.{i}.{name}`, and the
    param groups (plain numbers and lists) for JSON. No torch.save: it pickles."""
    sd = opt.state_dict()
    tensors = {
        f"optim.{index}.{name}": torch.as_tensor(value)
        for index, per_param in sd["state"].items()
        for name, value in per_param.items()
    }
    return tensors, sd["param_groups"]


def load_optimizer(
    opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict]
) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    opt.load_state_dict({"state": state, "param_groups": groups})


def capture(t: Trainer, wall_s: float) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The trainer's resumable state as (tensors, JSON-able state)."""
    tensors = t.learner.state_tensors()
    opt_tensors, groups = optimizer_state(t.learner.optimizer)
    tensors.update(opt_tensors)
    tensors["rng.torch"] = torch.get_rng_state()
    acc_arrays, acc_counters = t.accounting.state()
    tensors.update({f"accounting.{k}": torch.from_numpy(v) for k, v in acc_arrays.items()})
    replay = None
    if t.cfg.checkpoint.checkpoint_replay:
        rows, replay = t.replay.snapshot()
        tensors.update({f"replay.{k}": torch.from_numpy(v) for k, v in rows.items()})
    # An evaluation still in flight dies with this learner's run id: ask for it again on resume.
    pending = t.evaluation.pending is not None
    loss = t.learner.last_loss
    state = {
        "run_id": t.run_id,
        "wall_s": wall_s,
        "updates": t.learner.updates,
        "last_loss": loss if math.isfinite(loss) else None,
        "optimizer": groups,
        "rng": {
            "learner": t.learner.rng.bit_generator.state,
            "publisher": t.publisher.rng.bit_generator.state,
        },
        "policy_version": t.publisher.version,
        "dispatch": {"next_chunk": t.dispatcher.next_id, "lost": t.dispatcher.lost},
        "evaluation": {
            "next_id": t.evaluation.next_id,
            "errors": t.evaluation.errors,
            "next_eval": t.asked_at if pending else t.next_eval,
            "asked_at": -1 if pending else t.asked_at,
            "evals": t.evals,
            "hits": t.hits,
        },
        "accounting": acc_counters,
        "ingest": {
            **vars(t.reader_stats),
            "rejected_reasons": dict(t.reader_stats.rejected_reasons),
        },
        "limiter": {"inserts": t.limiter.inserts, "samples": t.limiter.samples},
        "replay": replay,
    }
    return tensors, state


def checkpoint(t: Trainer) -> Path:
    """Write a periodic checkpoint of the trainer now."""
    return t.checkpoints.save(*capture(t, time.perf_counter() - t.t0), t.learner.updates)


def resume_run(t: Trainer, resumed: Resumed) -> None:
    """Continue from `resumed` in a fresh trainer; the runs of the learners before are stopped."""
    restore(t, resumed.tensors, resumed.state, resumed.newest_version)
    for run_id in resumed.run_ids:
        mark_stopped(t.client, RunKeys(run_id))


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def restore(
    t: Trainer, tensors: dict[str, torch.Tensor], state: dict[str, Any], newest_version: int
) -> None:
    """Put a checkpoint back into a fresh trainer. Versions continue above both the checkpoint's
    and `newest_version` (the newest any learner of the run published): none is ever reused."""
    learner = t.learner
    learner.restore(tensors)
    load_optimizer(learner.optimizer, tensors, state["optimizer"])
    torch.set_rng_state(tensors["rng.torch"])
    learner.rng.bit_generator.state = state["rng"]["learner"]
    t.publisher.rng.bit_generator.state = state["rng"]["publisher"]
    learner.updates = state["updates"]
    learner.last_loss = state["last_loss"] if state["last_loss"] is not None else float("nan")
    t.publisher.source.version = max(state["policy_version"], newest_version)
    t.dispatcher.next_id, t.dispatcher.lost = (
        state["dispatch"]["next_chunk"],
        state["dispatch"]["lost"],
    )
    ev = state["evaluation"]
    t.evaluation.next_id, t.evaluation.errors = ev["next_id"], ev["errors"]
    t.next_eval, t.asked_at, t.hits = ev["next_eval"], ev["asked_at"], ev["hits"]
    t.evals = [(int(steps), float(mean)) for steps, mean in ev["evals"]]
    arrays = {k: v.numpy() for k, v in _prefixed(tensors, "accounting.").items()}
    t.accounting.load_state(arrays, state["accounting"])
    vars(t.reader_stats).update(state["ingest"])
    if state["replay"] is not None:
        rows = {k: v.numpy() for k, v in _prefixed(tensors, "replay.").items()}
        t.replay.restore(rows, state["replay"])
        # Replay's own count, taken with its rows: the ingest thread may have counted a chunk in
        # the limiter but not yet in replay when the checkpoint was taken.
        t.limiter.inserts = state["replay"]["inserted"]
        t.limiter.samples = state["limiter"]["samples"]
    # Without replay the limiter starts afresh too: no update until --learning-starts rows arrived.
    t.wall_before = state["wall_s"]
