"""n-step returns (`--n-step N`), computed at ingest from one chunk's rows (and by workers that
compute their rows' initial priorities: pipeline/chunks/priorities.py).

Where: on the learner, per chunk, as the chunk enters replay. A chunk holds each actor env's rows
in time order (`env_index`; pipeline/chunks/actor.py drops the autoreset step, so an episode ends
exactly after a row with `terminated` or `truncated`), so a row's next N-1 steps are the rows that
follow it for the same env. Computing it here costs no wire bytes (the worker would have to send
the same rows anyway) and a few vectorized passes per chunk of learner CPU; and since a chunk is
whole or absent, a lost chunk leaves no half-built return behind (a return built across chunks
would wait on the next chunk of the same env, which may never come).

The rule, per row t of an env, with k the steps the window takes (1 <= k <= N):
    R = r_t + γ r_{t+1} + ... + γ^(k-1) r_{t+k-1},   target = R + γ^k (1 - terminated) max Q(s_{t+k})
The window stops early at the episode's end: after a terminated row nothing is bootstrapped; after
a truncated row (a time limit) it bootstraps from that row's `next_obs`, the episode's true final
observation; it never reaches past either into the next episode (the trap: the row after a done
row is the new episode's first step). It also stops at the chunk's last row of the env: those
rows get shorter returns (k < N), still exact targets, just less far-sighted.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clusterenv.pipeline.frames import NEXT_FRAMES

# What replay keeps per row beside the 1-step columns: the window's length k (the discount of the
# bootstrap is gamma ** k). A 1-step row has k = 1.
STEPS = "n_steps"


def n_step_windows(
    arrays: Mapping[str, np.ndarray], n: int, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of the chunk, in the chunk's order: its n-step return R, its window's last row
    (`tail`, an index into the chunk) and the window's length k."""
    env = arrays["env_index"]
    done = arrays["terminated"].astype(bool) | arrays["truncated"].astype(bool)
    rows = len(env)
    # Each env's rows in time order, side by side: position p of the sorted order holds row
    # order[p], and the next step of the same env is at p + 1 while env[order[p + 1]] is the same.
    order = np.argsort(env, kind="stable")
    env_sorted, done_sorted = env[order], done[order]
    reward = arrays["reward"][order].astype(np.float64)
    start = np.arange(rows)
    ret, last, steps = reward.copy(), start.copy(), np.ones(rows, np.int64)
    open_ = ~done_sorted  # the window may take another step: it has not reached an episode's end
    for j in range(1, n):
        grow = start[open_ & (last + 1 < rows)]
        grow = grow[env_sorted[last[grow] + 1] == env_sorted[grow]]  # the same env's next step
        last[grow] += 1
        ret[grow] += gamma**j * reward[last[grow]]
        steps[grow] += 1
        open_[:] = False
        open_[grow] = ~done_sorted[last[grow]]
    # Back to the chunk's row order.
    inverse = np.empty(rows, np.int64)
    inverse[order] = np.arange(rows)
    return ret[inverse], order[last][inverse], steps[inverse]


def next_rows(env_index: np.ndarray) -> np.ndarray:
    """Per row, the row of the same env's next step in the chunk (-1 for an env's last row).
    Across an episode's end it is the new episode's first step: callers check `done`."""
    order = np.argsort(env_index, kind="stable")
    following = np.full(len(order), -1, np.int64)
    same = env_index[order[1:]] == env_index[order[:-1]]
    following[order[:-1][same]] = order[1:][same]
    return following


def n_step_returns(arrays: Mapping[str, np.ndarray], n: int, gamma: float) -> dict[str, np.ndarray]:
    """The chunk's rows with `reward` the n-step return, `next_obs` (or `next_frames`) and
    `terminated` those of the window's last row, and `n_steps` its length; other columns as they
    were. Rows keep their order."""
    ret, tail, steps = n_step_windows(arrays, n, gamma)
    out = dict(arrays)
    out["reward"] = ret.astype(np.float32)
    next_name = NEXT_FRAMES if NEXT_FRAMES in arrays else "next_obs"
    out[next_name] = arrays[next_name][tail]
    out["terminated"] = arrays["terminated"][tail]
    out[STEPS] = steps.astype(np.uint8)
    return out
