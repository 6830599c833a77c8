"""The torch side of the weight-name contract: an MLP whose parameters are `layers.{i}.weight`
and `layers.{i}.bias`, what pipeline/policy.py's NumpyMLP reads on the workers; and the
networks' part of a checkpoint.

The MLP's backward pass is also written out by hand (`MLP.backward`): for a small MLP on one CPU
core, autograd's bookkeeping cost more than the matrix products (bench/update_cost.py), and
tests check the result against autograd's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from clusterenv.learner.core.agent import State


def hidden_sizes(text: str, flag: str = "hidden") -> list[int]:
    """Layer sizes from "256,256"; a ValueError naming the flag otherwise."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"--{flag} must be positive integers like 256,256, got {text!r}")
    return sizes


class MLP(nn.Module):
    """Linear layers with ReLU between them, from flattened observations to one output per
    action (Q-values or logits) or to a value."""

    def __init__(self, obs_dim: int, num_outputs: int, hidden: list[int]):
        super().__init__()
        sizes = [obs_dim, *hidden, num_outputs]
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        # The same Parameter objects for the net's life: load_state_dict copies into them.
        self._weights_and_biases = [(layer.weight, layer.bias) for layer in self.layers]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.forward_keeping_inputs(obs)[0]

    def forward_keeping_inputs(self, obs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Outputs, and each layer's input (what `backward` needs)."""
        # Plain tensors and F.linear: per-call Module and ModuleList overhead cost more than a
        # 64 x 256 matrix product here (a py-spy profile of a CartPole run).
        x, inputs = obs.reshape(len(obs), -1), []
        for i, (weight, bias) in enumerate(self._weights_and_biases):
            if i > 0:
                x = torch.relu(x)
            inputs.append(x)
            x = nn.functional.linear(x, weight, bias)
        return x, inputs

    def backward(self, grad_out: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        """Write d(loss)/d(parameter) into each parameter's `.grad`, given d(loss)/d(outputs)
        and the layer inputs from `forward_keeping_inputs`. The `.grad` tensors must exist."""
        g = grad_out
        for i in reversed(range(len(inputs))):
            weight, bias = self._weights_and_biases[i]
            torch.mm(g.t(), inputs[i], out=weight.grad)
            torch.sum(g, 0, out=bias.grad)
            if i > 0:
                # A ReLU's output is 0 or positive, so its sign is the ReLU's derivative
                # (and cheaper here than a boolean mask).
                g = g.mm(weight).mul_(inputs[i].sign())

    def get_weights(self) -> dict[str, np.ndarray]:
        """Numpy copies named `layers.{i}.weight|bias`, the names NumpyMLP reads."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


def network_arrays(nets: Mapping[str, nn.Module]) -> dict[str, np.ndarray]:
    """Copies of each net's parameters, named `{its key}.{parameter}`."""
    return {
        f"{prefix}.{k}": v.detach().cpu().numpy().copy()
        for prefix, net in nets.items()
        for k, v in net.state_dict().items()
    }


def restore_networks(nets: Mapping[str, nn.Module], arrays: Mapping[str, np.ndarray]) -> None:
    """Load each net from the arrays named `{its key}.{parameter}` (a `network_arrays` dict)."""
    for prefix, net in nets.items():
        net.load_state_dict({k.removeprefix(f"{prefix}."): torch.as_tensor(v)
                             for k, v in arrays.items() if k.startswith(f"{prefix}.")})  # fmt: skip


def optimizer_arrays(opt: torch.optim.Optimizer) -> tuple[dict[str, np.ndarray], list[dict]]:
    """An optimizer's state_dict flattened: per-parameter arrays `optim.{i}.{name}`, and the
    param groups (plain numbers and lists) for JSON. No torch.save: it pickles."""
    sd = opt.state_dict()
    arrays = {
        f"optim.{index}.{name}": torch.as_tensor(value).numpy().copy()
        for index, per_param in sd["state"].items()
        for name, value in per_param.items()
    }
    return arrays, sd["param_groups"]


def restore_optimizer(
    opt: torch.optim.Optimizer, arrays: Mapping[str, np.ndarray], groups: list[dict]
) -> None:
    """Take back what `optimizer_arrays` returned."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in arrays.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = torch.as_tensor(value)
    opt.load_state_dict({"state": state, "param_groups": groups})


def save_training(learner: Any, nets: Mapping[str, nn.Module]) -> State:
    """What every agent's learner saves: its networks, its optimizer (`learner.optimizer`), the
    torch and numpy generators (`learner.rng`), `updates` and `last_loss`."""
    arrays = network_arrays(nets)
    optim, groups = optimizer_arrays(learner.optimizer)
    arrays.update(optim)
    arrays["rng.torch"] = torch.get_rng_state().numpy()
    loss = learner.last_loss
    values = {"updates": learner.updates, "last_loss": loss if math.isfinite(loss) else None,
              "optimizer": groups, "rng": learner.rng.bit_generator.state}  # fmt: skip
    return arrays, values


def restore_training(
    learner: Any, nets: Mapping[str, nn.Module], arrays: Mapping[str, np.ndarray],
    values: Mapping[str, Any],
) -> None:  # fmt: skip
    """Take back what `save_training` returned."""
    restore_networks(nets, arrays)
    restore_optimizer(learner.optimizer, arrays, values["optimizer"])
    torch.set_rng_state(torch.as_tensor(arrays["rng.torch"]))
    learner.rng.bit_generator.state = values["rng"]
    learner.updates = values["updates"]
    loss = values["last_loss"]
    learner.last_loss = float("nan") if loss is None else loss
