"""A checkpoint's contents gathered from the run's components, each of which saves and restores
its own state (Acme's Saveable: learner/core/agent.py), and handed back to them on resume.

Component `name`'s arrays are stored as tensors named `{name}.{array}` and its JSON values under
`name` in the checkpoint's state; nothing here knows what a component holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from clusterenv.learner.core.agent import Saveable

# The component that holds the agent's learner: its networks are `learner.{net}.{parameter}`.
LEARNER = "learner"


def gather(components: Mapping[str, Saveable]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every component's state, as (tensors, JSON-able state) for a checkpoint file."""
    tensors: dict[str, torch.Tensor] = {}
    state: dict[str, Any] = {}
    for name, component in components.items():
        arrays, state[name] = component.save()
        tensors.update(named_tensors(name, arrays))
    return tensors, state


def named_tensors(name: str, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """`arrays` as the tensors a checkpoint stores, named `{name}.{array}`."""
    # np.require, not np.ascontiguousarray: that makes a 0-d array (Adam's step) 1-d.
    return {
        f"{name}.{k}": torch.from_numpy(np.require(v, requirements="C")) for k, v in arrays.items()
    }


def scatter(
    components: Mapping[str, Saveable],
    tensors: Mapping[str, torch.Tensor],
    state: Mapping[str, Any],
) -> None:
    """Give each component back what `gather` took from it; KeyError names a missing one."""
    for name, component in components.items():
        prefix = f"{name}."
        arrays = {
            k.removeprefix(prefix): v.numpy() for k, v in tensors.items() if k.startswith(prefix)
        }
        component.restore(arrays, state[name])
