"""The torch side of the weight-name contract (pipeline/policy.py's docstring): the networks the
agents train and publish, and their part of a checkpoint.

`build_network` makes one from the observation's shape and `--torso`: an MLP (`layers.{i}.*`) on
flattened observations, or a ConvNet (`input.*`, `conv.{i}.*`, `layers.{i}.*`) with the Nature
DQN's torso for 84x84 frames or MinAtar's for 10x10 planes; the workers' numpy_policy reads either.

The MLP's backward pass is also written out by hand (`MLP.backward`): for a small MLP on one CPU
core, autograd's bookkeeping cost more than the matrix products (bench/update_cost.py), and
tests check the result against autograd's. A ConvNet goes through autograd.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from clusterenv.learner.core.agent import State
from clusterenv.pipeline.policy import SDE_MEAN_CLIP, SDE_VAR_EPS

# The learner's default device: TrainConfig.torch_device() picks cuda where present (--device).
CPU = torch.device("cpu")


def hidden_sizes(text: str, flag: str = "hidden") -> list[int]:
    """Layer sizes from "256,256"; a ValueError naming the flag otherwise."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"--{flag} must be positive integers like 256,256, got {text!r}")
    return sizes


def dueling_q(features: torch.Tensor, value: nn.Linear, advantage: nn.Linear) -> torch.Tensor:
    """Q = V + A - mean(A) from the last layer's outputs after a ReLU (Wang et al. 2016): the
    mean, not the max, as the paper's stable form."""
    h = torch.relu(features)
    a = nn.functional.linear(h, advantage.weight, advantage.bias)
    return nn.functional.linear(h, value.weight, value.bias) + a - a.mean(dim=1, keepdim=True)


class MLP(nn.Module):
    """Linear layers with ReLU between them, from flattened observations to one output per
    action (Q-values or logits) or to a value; with `dueling`, the last hidden layer feeds a
    state value (`value`) and advantages (`advantage`) instead of an output layer."""

    def __init__(self, obs_dim: int, num_outputs: int, hidden: list[int], dueling: bool = False):
        super().__init__()
        sizes = [obs_dim, *hidden] if dueling else [obs_dim, *hidden, num_outputs]
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.dueling = dueling
        if dueling:  # registered after the layers: their parameters come last, as the contract's
            self.value, self.advantage = nn.Linear(sizes[-1], 1), nn.Linear(sizes[-1], num_outputs)
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
        if self.dueling:
            inputs.append(torch.relu(x))  # the head's input, last
            x = dueling_q(x, self.value, self.advantage)
        return x, inputs

    def backward(self, grad_out: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        """Write d(loss)/d(parameter) into each parameter's `.grad`, given d(loss)/d(outputs)
        and the layer inputs from `forward_keeping_inputs`. The `.grad` tensors must exist."""
        g = grad_out
        if self.dueling:
            *inputs, h = inputs
            # Q_j = V + A_j - mean(A): dQ/dA_j is g_j minus the mean of g, dQ/dV the sum of g.
            g_a = g - g.mean(dim=1, keepdim=True)
            g_v = g.sum(dim=1, keepdim=True)
            torch.mm(g_a.t(), h, out=self.advantage.weight.grad)
            torch.sum(g_a, 0, out=self.advantage.bias.grad)
            torch.mm(g_v.t(), h, out=self.value.weight.grad)
            torch.sum(g_v, 0, out=self.value.bias.grad)
            g = (g_a.mm(self.advantage.weight) + g_v.mm(self.value.weight)).mul_(h.sign())
        for i in reversed(range(len(inputs))):
            weight, bias = self._weights_and_biases[i]
            torch.mm(g.t(), inputs[i], out=weight.grad)
            torch.sum(g, 0, out=bias.grad)
            if i > 0:
                # A ReLU's output is 0 or positive, so its sign is the ReLU's derivative
                # (and cheaper here than a boolean mask).
                g = g.mm(weight).mul_(inputs[i].sign())

    def get_weights(self) -> dict[str, np.ndarray]:
        """Numpy copies named `layers.{i}.weight|bias` (and `value.*`, `advantage.*`), the names
        NumpyMLP reads."""
        return state_arrays(self)


class SDEActor(MLP):
    """A gSDE actor (pipeline/policy.py's contract, `sde.log_std`): an MLP whose last layer gives
    the d means, clipped to ±SDE_MEAN_CLIP, and a learned (F, d) log σ; its outputs are the 2d of
    a squashed Gaussian, means then log-stds, the std of dimension k at a state being
    sqrt(Σ_j z_j² σ_jk² + SDE_VAR_EPS) with z the last layer's inputs. The log-stds see z detached
    (SB3's learn_features False): the noise's scale is learned through σ alone."""

    def __init__(self, obs_dim: int, dim: int, hidden: list[int], log_std_init: float):
        super().__init__(obs_dim, dim, hidden)
        features = hidden[-1] if hidden else obs_dim
        self.sde = nn.ParameterDict({"log_std": nn.Parameter(torch.full((features, dim),
                                                                         log_std_init))})  # fmt: skip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        means, inputs = self.forward_keeping_inputs(obs)
        z = inputs[-1].detach()
        variance = (z * z).mm(torch.exp(2.0 * self.sde["log_std"])) + SDE_VAR_EPS
        return torch.cat([means.clamp(-SDE_MEAN_CLIP, SDE_MEAN_CLIP), 0.5 * variance.log()], dim=1)


# --- conv nets ------------------------------------------------------------------------------------
Torso = Literal["auto", "mlp", "nature", "minatar"]


@dataclass(frozen=True)
class ConvTorso:
    convs: tuple[tuple[int, int, int], ...]  # (out channels, kernel, stride) of each convolution
    dense: tuple[int, ...]  # the linear layers after them, before the output layer
    scale: float  # what observations are multiplied by first
    frame: tuple[int, int]  # the (H, W) that --torso auto picks this torso for


CONV_TORSOS = {
    # Mnih et al. 2015, as CleanRL's dqn_atari.py and ppo_atari.py: uint8 frames scaled to [0, 1].
    "nature": ConvTorso(((32, 8, 4), (64, 4, 2), (64, 3, 1)), (512,), 1 / 255, (84, 84)),
    # Young & Tian 2019, MinAtar's DQN: 0/1 planes, unscaled.
    "minatar": ConvTorso(((16, 3, 1),), (128,), 1.0, (10, 10)),
}


class Conv(nn.Module):
    """A valid (unpadded) 2-d convolution whose stride is a buffer beside its weight and bias, so
    that it travels with them (`conv.{i}.stride`). Fixed at construction, as the layer's shape."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int):
        super().__init__()
        torch_default = nn.Conv2d(in_channels, out_channels, kernel, stride)  # its initialization
        self.weight, self.bias = torch_default.weight, torch_default.bias
        self.register_buffer("stride", torch.tensor([stride]))
        self._stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv2d(x, self.weight, self.bias, self._stride)


class ObservationInput(nn.Module):
    """`input.shape` and `input.scale` as buffers: they travel with the weights too."""

    def __init__(self, shape: tuple[int, int, int], scale: float):
        super().__init__()
        self.register_buffer("shape", torch.tensor(shape))
        self.register_buffer("scale", torch.tensor([scale], dtype=torch.float32))


class ConvNet(nn.Module):
    """A conv torso (ReLU after each convolution), its linear layers and the output layer, ReLU
    between them, on channel-first observations of any dtype (uint8 frames: cast, then scaled)."""

    def __init__(self, obs_shape: tuple[int, int, int], num_outputs: int, torso: ConvTorso,
                 dueling: bool = False):  # fmt: skip
        super().__init__()
        self.input = ObservationInput(obs_shape, torso.scale)
        c, h, w = obs_shape
        convs = []
        for out, kernel, stride in torso.convs:
            convs.append(Conv(c, out, kernel, stride))
            c, h, w = out, (h - kernel) // stride + 1, (w - kernel) // stride + 1
        self.conv = nn.ModuleList(convs)
        sizes = [c * h * w, *torso.dense] + ([] if dueling else [num_outputs])
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.dueling = dueling
        if dueling:
            self.value, self.advantage = nn.Linear(sizes[-1], 1), nn.Linear(sizes[-1], num_outputs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() * self.input.scale
        for conv in self.conv:
            x = torch.relu(conv(x))
        x = x.flatten(1)  # (C, H, W) order, as the contract says
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = torch.relu(x)
            x = layer(x)
        return dueling_q(x, self.value, self.advantage) if self.dueling else x

    def get_weights(self) -> dict[str, np.ndarray]:
        """Numpy copies named `input.*`, `conv.{i}.*` and `layers.{i}.*`, what NumpyConvNet reads."""
        return state_arrays(self)


def pick_torso(obs_shape: tuple[int, ...], torso: Torso = "auto") -> str:
    """The torso `--torso` names; for `auto` the one the observation's shape calls for: a conv
    torso for channel-first (C, H, W) of its frame (nature: 84x84, minatar: 10x10), else mlp (any
    other shape, flattened). ValueError naming the flag if a conv torso cannot take the shape."""
    if torso == "auto":
        frames = {t.frame: name for name, t in CONV_TORSOS.items()}
        return frames.get(tuple(obs_shape[1:]), "mlp") if len(obs_shape) == 3 else "mlp"
    if torso == "mlp":
        return torso
    if torso not in CONV_TORSOS:
        raise ValueError(f"--torso must be auto, mlp, {' or '.join(CONV_TORSOS)}, got {torso!r}")
    if len(obs_shape) != 3:
        raise ValueError(f"--torso {torso} takes channel-first (C, H, W) observations, not "
                         f"shape {tuple(obs_shape)}")  # fmt: skip
    h, w = obs_shape[1:]
    for _, kernel, stride in CONV_TORSOS[torso].convs:
        if kernel > min(h, w):
            raise ValueError(f"--torso {torso}: its convolutions do not fit observations of "
                             f"shape {tuple(obs_shape)}")  # fmt: skip
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    return torso


def build_network(
    obs_shape: tuple[int, ...], num_outputs: int, torso: Torso, hidden: list[int],
    dueling: bool = False,
) -> MLP | ConvNet:  # fmt: skip
    """The network for observations of `obs_shape` with `num_outputs` outputs (one per action, or
    1 for a value), on the torso `pick_torso` chooses; `hidden` sizes the MLP's hidden layers (a
    conv torso has its own linear layer); `dueling`: Q-values from a dueling head."""
    kind = pick_torso(obs_shape, torso)
    if kind == "mlp":
        return MLP(math.prod(obs_shape), num_outputs, hidden, dueling)
    c, h, w = obs_shape
    return ConvNet((c, h, w), num_outputs, CONV_TORSOS[kind], dueling)


def weighted_layers(net: nn.Module) -> list[nn.Module]:
    """The layers with a weight and a bias, from input to output (convolutions, then linear)."""
    return [m for m in net.modules() if isinstance(m, (Conv, nn.Linear))]


# --- checkpoints ----------------------------------------------------------------------------------
def state_arrays(net: nn.Module) -> dict[str, np.ndarray]:
    """Numpy copies of a net's parameters and buffers, by their state_dict names."""
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


def network_arrays(nets: Mapping[str, nn.Module]) -> dict[str, np.ndarray]:
    """Copies of each net's parameters, named `{its key}.{parameter}`."""
    return {
        f"{prefix}.{k}": v for prefix, net in nets.items() for k, v in state_arrays(net).items()
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
