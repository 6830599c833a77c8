"""Initial priorities computed by workers (Ape-X; DQN's `--initial-priority worker`): each row's
|n-step TD error| under the worker's own copy of the network, sent as a `priority` column.

Q(s_t, a_t) and max_a Q(s_t, a) come from the forward pass the worker made to act (kept per step
as `q_taken` and `q_max`, never sent); the bootstrap max_a Q(s_t+k) of a window that ends
mid-episode is the next row's `q_max`. Only a window that ends at a time limit (its final
observation was acted on by the dropped autoreset step) or at the env's last row in the chunk needs
one more forward, batched: about one row per env per chunk. A window that ends in termination
bootstraps nothing. The learner's Double-DQN target differs a little (its target network picks
the value; a worker has only the weights it acts with, as Ape-X's actors): the learner rewrites a
row's priority after the row's first update anyway.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clusterenv.pipeline.frames import FRAMES, NEXT_FRAMES
from clusterenv.pipeline.n_step import n_step_windows, next_rows
from clusterenv.pipeline.policy import NumpyPolicy

Q_TAKEN, Q_MAX = "q_taken", "q_max"  # per-step columns while acting
PRIORITY = "priority"  # the column sent: |TD error|, float32


def q_columns(outputs: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
    """What acting keeps per step for the priorities: Q of the action taken, and the largest Q."""
    return {
        Q_TAKEN: outputs[np.arange(len(actions)), actions].astype(np.float32),
        Q_MAX: outputs.max(axis=1).astype(np.float32),
    }


def with_priorities(
    arrays: Mapping[str, np.ndarray], policy: NumpyPolicy, n: int, gamma: float
) -> dict[str, np.ndarray]:
    """The chunk's arrays with `q_taken` and `q_max` replaced by `priority`, each row's
    |R + gamma^k (1 - terminated) max_a Q(s_t+k, a) - Q(s_t, a_t)| over its n-step window
    (pipeline/n_step.py: the same windows the learner builds)."""
    q_taken, q_max = arrays[Q_TAKEN], arrays[Q_MAX]
    out = {k: v for k, v in arrays.items() if k not in (Q_TAKEN, Q_MAX)}
    ret, tail, steps = n_step_windows(arrays, n, gamma)
    terminated = arrays["terminated"][tail].astype(bool)
    truncated = arrays["truncated"][tail].astype(bool)
    after = next_rows(arrays["env_index"])[tail]
    # The trap: past a done row the next row is a new episode's first step, not s_t+k.
    known = (after >= 0) & ~terminated & ~truncated
    bootstrap = np.zeros(len(tail))
    bootstrap[known] = q_max[after[known]]
    need = ~known & ~terminated
    if need.any():
        rows, which = np.unique(tail[need], return_inverse=True)  # windows may share a tail
        bootstrap[need] = policy(_next_observations(arrays, rows)).max(axis=1)[which]
    target = ret + gamma**steps * bootstrap
    out[PRIORITY] = np.abs(target - q_taken).astype(np.float32)
    return out


def _next_observations(arrays: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    if FRAMES in arrays:  # stacks rebuilt from the chunk's frames, for these rows only
        return arrays[FRAMES][arrays[NEXT_FRAMES][rows]]
    return arrays["next_obs"][rows]
