"""The acting side of a published network: numpy forwards of the weight-name contract, and the
ways workers act with them.

Workers act with numpy, not torch: the worker install has no torch, and for CartPole-sized nets
numpy is faster per step anyway. The outputs are Q-values (DQN: act ε-greedily), logits (PPO on
Discrete actions: sample the categorical policy) or a Gaussian's means and log-stds (PPO on Box
actions: sample it and squash with tanh); which one a chunk uses is its behaviour value
(pipeline/behaviour.py).

The weight-name contract, in this one place. A network the workers act with (what the learner's
`get_weights()` publishes: MLP or ConvNet of learner/core/networks.py; a weights blob;
best.safetensors; a checkpoint's acting network under its prefix) is a flat dict of arrays that
describes it alone:

    input.shape        int (3,)                 conv nets only: (C, H, W) of one observation,
                                                channel-first
    input.scale        float (1,)               conv nets only: observations are multiplied by it
                                                first (1/255 for uint8 frames, 1 for 0/1 planes)
    conv.{i}.weight    float (out, in, kh, kw)  i = 0, 1, ...: valid (unpadded) convolutions,
    conv.{i}.bias      float (out,)             ReLU after each
    conv.{i}.stride    int (1,)                 its stride, the same along H and W
    layers.{i}.weight  float (out, in)          i = 0, 1, ...: linear layers, ReLU between them;
    layers.{i}.bias    float (out,)             the last one's outputs are Q-values or logits
    value.weight       float (1, in)            dueling nets only (Wang et al. 2016): after a ReLU
    value.bias         float (1,)               on the last layer's outputs, the state's value V
    advantage.weight   float (A, in)            and the A advantages; the outputs are the
    advantage.bias     float (A,)               Q-values V + A - mean(A)
    sde.log_std        float (F, d)             gSDE actors only (Raffin et al. 2022; MLPs, no
                                                dueling head): log σ of the exploration noise;
                                                the last layer's d outputs are the means

Without `input.*` and `conv.*` the arrays are an MLP on flattened observations (NumpyMLP). With
`sde.log_std` the MLP is a gSDE actor: its outputs are a squashed Gaussian's 2d (means clipped to
±SDE_MEAN_CLIP, then log-stds) where the std of action dimension k at a state is
sqrt(Σ_j z_j² σ_jk² + SDE_VAR_EPS), z the F features the last layer takes (SB3's `use_sde` with
`full_std`); `forward` gives z too, which the workers' noise is made of (pipeline/behaviour.py). With
them a conv net (NumpyConvNet): each convolution takes the previous one's channels and its kernel
fits the previous one's output, and the last output, flattened in (C, H, W) order, is `layers.0`'s
input. Either may end in the dueling head (`value.*` and `advantage.*`, both or neither). No other
name may appear. Floats may be float16, 32 or 64 (the forward runs in float32);
the integers stay integers. `numpy_policy(arrays)` and `load_policy(blob)` return whichever network
the arrays describe, or raise a ValueError naming the first array that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from clusterenv.pipeline.codec import decode_weights

# Every name of the contract starts with one of these (what a file of an acting network holds).
NETWORK_PREFIXES = ("input.", "conv.", "layers.", "value.", "advantage.", "sde.")
# (weight transposed, bias) of a linear layer as the forwards hold it.
Dense = tuple[np.ndarray, np.ndarray]
# A gSDE actor's means are clipped to this (SB3's clip_mean: with tanh(2) = 0.96 the means stay
# off tanh's flat ends, where the noise could no longer move the action), and its variances get
# this added (SB3's epsilon) so a state of zero features has a finite log-std.
SDE_MEAN_CLIP, SDE_VAR_EPS = 2.0, 1e-6


class NumpyMLP:
    """Linear layers with ReLU between them, on flattened observations; the last layer's outputs
    are Q-values or logits."""

    def __init__(self, weights: Mapping[str, np.ndarray]):
        """Layers from `layers.{i}.weight` / `.bias` (and a dueling head from `value.*` and
        `advantage.*`, or a gSDE actor's `sde.log_std`); ValueError names the first array that
        does not fit."""
        self.layers = _dense_layers(weights)
        self.head = _dueling_head(weights, self.layers[-1][1].shape[0])
        # σ of a gSDE actor's noise, (F, d); None for every other net.
        self.sde_std = _sde_std(weights, self.layers[-1][0], self.head is not None)
        _refuse_others(weights, 0, len(self.layers), self.head is not None,
                       self.sde_std is not None)  # fmt: skip

    @property
    def num_inputs(self) -> int:
        return self.layers[0][0].shape[0]

    @property
    def num_outputs(self) -> int:
        return _outputs(self.layers, self.head) * (1 if self.sde_std is None else 2)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.num_inputs,)

    def takes(self, obs_shape: tuple[int, ...]) -> bool:
        """Whether observations of `obs_shape` fit: any shape of `num_inputs` values."""
        return math.prod(obs_shape) == self.num_inputs

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if self.sde_std is not None:
            return self.forward(obs)[0]
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        return _dense_forward(x, self.layers, self.head)

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A gSDE actor's outputs and the features z its noise is made of (what the last layer
        takes, (N, F)); ValueError for any other net."""
        if self.sde_std is None:
            raise ValueError("only a gSDE actor (sde.log_std) has noise features")
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        z = _hidden_forward(x, self.layers[:-1])
        w_t, b = self.layers[-1]
        mean = np.clip(z @ w_t + b, -SDE_MEAN_CLIP, SDE_MEAN_CLIP)
        log_std = 0.5 * np.log((z * z) @ (self.sde_std * self.sde_std) + SDE_VAR_EPS)
        return np.concatenate([mean, log_std], axis=1), z


# Observations one conv forward takes at once (more are taken in slices of this many).
CONV_ROWS = 32


class NumpyConvNet:
    """Valid convolutions with ReLU after each, then linear layers with ReLU between them, on
    channel-first observations of `input_shape`; the last layer's outputs are Q-values or logits.

    Convolutions are im2col + one matrix product each, activations kept (N, H, W, C) so each row
    of the im2col matrix copies whole channel vectors: for a batch of 8 observations that measured
    faster than `einsum` / `tensordot` over sliding windows in (N, C, H, W) (bench/conv_forward.py).
    """

    def __init__(self, weights: Mapping[str, np.ndarray]):
        """Layers from `input.*`, `conv.{i}.*` and `layers.{i}.*`, their shapes chained from the
        observation's; ValueError names the first array that does not fit."""
        shape = _ints(weights, "input.shape", 3, "3 positive integers (C, H, W)")
        scale = _floats(weights, "input.scale", 1)
        if scale.shape != (1,):
            raise ValueError(f"input.scale: {scale.shape} is not one value")
        count = _count(weights, "conv")
        if count == 0:
            raise ValueError("weights hold no 'conv.0.weight' (input.* makes a conv net)")
        self.input_shape: tuple[int, ...] = shape
        self.scale = np.float32(scale[0])
        self.convs: list[tuple[np.ndarray, np.ndarray, int, int, int]] = []
        c, h, w = shape
        for i in range(count):
            kernel = _floats(weights, f"conv.{i}.weight", 4)
            bias = _floats(weights, f"conv.{i}.bias", 1)
            (stride,) = _ints(weights, f"conv.{i}.stride", 1, "one positive integer")
            out, inp, kh, kw = kernel.shape
            if bias.shape[0] != out:
                raise ValueError(f"conv.{i}.bias has {bias.shape[0]} values for {out} channels")
            source = "input.shape" if i == 0 else f"conv.{i - 1}"
            if inp != c:
                raise ValueError(f"conv.{i}.weight takes {inp} channels, {source} gives {c}")
            if kh > h or kw > w:
                raise ValueError(
                    f"conv.{i}.weight: its {kh}x{kw} kernel does not fit the {h}x{w} that "
                    f"{source} gives"
                )
            c, h, w = out, (h - kh) // stride + 1, (w - kw) // stride + 1
            # Rows in (kh, kw, C) order, as the im2col matrix's columns.
            matrix = kernel.transpose(2, 3, 1, 0).reshape(kh * kw * inp, out)
            self.convs.append((np.ascontiguousarray(matrix, dtype=np.float32),
                               np.asarray(bias, dtype=np.float32), stride, kh, kw))  # fmt: skip
        self.layers = _dense_layers(weights)
        w0, b0 = self.layers[0]
        if w0.shape[0] != c * h * w:
            raise ValueError(
                f"layers.0.weight takes {w0.shape[0]} inputs, conv.{count - 1} gives "
                f"{c}x{h}x{w} = {c * h * w}"
            )
        self.head = _dueling_head(weights, self.layers[-1][1].shape[0])
        _refuse_others(weights, count, len(self.layers), self.head is not None)
        # layers.0 reads features in (C, H, W) order, the forward has them in (H, W, C): its rows
        # are reordered once here instead of the features at every call.
        w0 = w0.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(c * h * w, -1)
        self.layers[0] = (np.ascontiguousarray(w0), b0)

    @property
    def num_inputs(self) -> int:
        return math.prod(self.input_shape)

    @property
    def num_outputs(self) -> int:
        return _outputs(self.layers, self.head)

    def takes(self, obs_shape: tuple[int, ...]) -> bool:
        """Whether observations of `obs_shape` fit: `input_shape` exactly."""
        return tuple(obs_shape) == self.input_shape

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        if obs.shape[1:] != self.input_shape:
            raise ValueError(f"observations of shape {obs.shape[1:]} for a {self.input_shape} net")
        if len(obs) <= CONV_ROWS:
            return self._forward(obs)
        # In slices: the im2col copy of 256 Atari observations at once is ~100 MB; a probe's
        # forward on them took 87-1,298 ms at once (5 runs, alone) against 59-62 ms in slices.
        return np.concatenate([self._forward(obs[i : i + CONV_ROWS])
                               for i in range(0, len(obs), CONV_ROWS)])  # fmt: skip

    def _forward(self, obs: np.ndarray) -> np.ndarray:
        x = obs.astype(np.float32)
        x *= self.scale
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # (N, H, W, C)
        n = len(x)
        for matrix, bias, stride, kh, kw in self.convs:
            windows = sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
            h, w = windows.shape[1:3]
            # im2col: one row per output pixel, its window in (kh, kw, C) order (a copy).
            rows = windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * h * w, matrix.shape[0])
            y = rows @ matrix
            y += bias
            np.maximum(y, 0.0, out=y)
            x = y.reshape(n, h, w, -1)
        return _dense_forward(x.reshape(n, -1), self.layers, self.head)


NumpyPolicy = NumpyMLP | NumpyConvNet


def numpy_policy(weights: Mapping[str, np.ndarray]) -> NumpyPolicy:
    """The network the arrays describe: a conv net if any name starts `input.` or `conv.`, else an
    MLP; ValueError names the first array that does not fit."""
    if any(name.startswith(("input.", "conv.")) for name in weights):
        return NumpyConvNet(weights)
    return NumpyMLP(weights)


def load_policy(blob: bytes) -> NumpyPolicy:
    """The policy in a safetensors blob; ValueError (CodecError for the bytes) names what is wrong."""
    return numpy_policy(decode_weights(blob))


def _hidden_forward(x: np.ndarray, layers: list[Dense]) -> np.ndarray:
    """`layers` with a ReLU after each."""
    for w_t, b in layers:
        x = x @ w_t
        x += b
        np.maximum(x, 0.0, out=x)
    return x


def _dense_forward(
    x: np.ndarray, layers: list[Dense], head: tuple[Dense, Dense] | None = None
) -> np.ndarray:
    if head is None:
        w_t, b = layers[-1]
        x = _hidden_forward(x, layers[:-1]) @ w_t
        x += b
        return x
    x = _hidden_forward(x, layers)
    (wv, bv), (wa, ba) = head
    advantage = x @ wa + ba
    return (x @ wv + bv) + advantage - advantage.mean(axis=1, keepdims=True)


def _outputs(layers: list[Dense], head: tuple[Dense, Dense] | None) -> int:
    return (head[1] if head is not None else layers[-1])[1].shape[0]


def _dueling_head(weights: Mapping[str, np.ndarray], features: int) -> tuple[Dense, Dense] | None:
    """(value, advantage) of a dueling net taking `features` inputs, or None without `value.*`
    and `advantage.*`; ValueError for half a head or a shape that does not fit."""
    present = [name for name in ("value", "advantage") if f"{name}.weight" in weights]
    if not present:
        return None
    if len(present) == 1:
        other = "advantage" if present == ["value"] else "value"
        raise ValueError(f"{present[0]}.weight without {other}.weight: a dueling head needs both")
    head = []
    for name in ("value", "advantage"):
        w = _floats(weights, f"{name}.weight", 2)
        b = _floats(weights, f"{name}.bias", 1)
        if w.shape[1] != features or b.shape[0] != w.shape[0]:
            raise ValueError(f"{name}: weight {w.shape}, bias {b.shape} do not fit the "
                             f"{features} outputs of the last linear layer")  # fmt: skip
        head.append((np.ascontiguousarray(w.T, dtype=np.float32), np.asarray(b, np.float32)))
    if head[0][1].shape[0] != 1:
        raise ValueError(f"value.weight: {head[0][0].shape[1]} outputs, a state value is one")
    return head[0], head[1]


def _sde_std(
    weights: Mapping[str, np.ndarray], last_layer: np.ndarray, dueling: bool
) -> np.ndarray | None:
    """exp(`sde.log_std`), checked against the last layer (`last_layer`: its weight transposed,
    (F, d)), or None without it."""
    if "sde.log_std" not in weights:
        return None
    if dueling:
        raise ValueError("sde.log_std with a dueling head: a gSDE actor outputs means")
    log_std = _floats(weights, "sde.log_std", 2)
    if log_std.shape != last_layer.shape:
        raise ValueError(f"sde.log_std: {log_std.shape} does not fit the last layer's "
                         f"{last_layer.shape[0]} inputs and {last_layer.shape[1]} means")  # fmt: skip
    return np.exp(log_std.astype(np.float32))


def _count(weights: Mapping[str, np.ndarray], group: str) -> int:
    """How many `{group}.{i}.weight` there are for i = 0, 1, ... without a gap."""
    count = 0
    while f"{group}.{count}.weight" in weights:
        count += 1
    return count


def _dense_layers(weights: Mapping[str, np.ndarray]) -> list[Dense]:
    """(weight transposed, bias) of each `layers.{i}`, checked: finite floats, (out, in) matrices,
    (out,) biases, each taking what the one before gives."""
    count = _count(weights, "layers")
    if count == 0:
        raise ValueError("weights hold no 'layers.0.weight'")
    layers: list[Dense] = []
    for i in range(count):
        w = _floats(weights, f"layers.{i}.weight", 2)
        b = _floats(weights, f"layers.{i}.bias", 1)
        if b.shape[0] != w.shape[0]:
            raise ValueError(f"layers.{i}.bias has {b.shape[0]} values for {w.shape[0]} outputs")
        if i > 0 and w.shape[1] != layers[-1][1].shape[0]:
            raise ValueError(f"layers.{i}.weight takes {w.shape[1]} inputs, "
                             f"layers.{i - 1} gives {layers[-1][1].shape[0]}")  # fmt: skip
        layers.append(
            (np.ascontiguousarray(w.T, dtype=np.float32), np.asarray(b, dtype=np.float32))
        )
    return layers


def _floats(weights: Mapping[str, np.ndarray], name: str, ndim: int) -> np.ndarray:
    """The array `name`, checked: present, non-empty, finite floats of `ndim` dimensions."""
    a = weights.get(name)
    if a is None:
        raise ValueError(f"{name} is missing")
    if a.dtype.kind != "f" or a.ndim != ndim or 0 in a.shape:
        raise ValueError(f"{name}: {a.dtype} {a.shape} is not a non-empty {ndim}-d float array")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} has non-finite values")
    return a


def _ints(weights: Mapping[str, np.ndarray], name: str, size: int, what: str) -> tuple[int, ...]:
    """The `size` positive integers of the array `name`; ValueError saying `what` it must be."""
    a = weights.get(name)
    if a is None:
        raise ValueError(f"{name} is missing")
    if a.dtype.kind not in "iu" or a.shape != (size,):
        raise ValueError(f"{name}: {a.dtype} {a.shape} is not {what}")
    if (a < 1).any():
        raise ValueError(f"{name}: {a.tolist()} is not {what}")
    return tuple(int(v) for v in a)


def _refuse_others(
    weights: Mapping[str, np.ndarray],
    convs: int,
    layers: int,
    dueling: bool = False,
    sde: bool = False,
) -> None:
    """ValueError for the first name that is not part of a net of `convs` convolutions and
    `layers` linear layers (the input's two arrays come with convolutions; `dueling`: the head's
    four; `sde`: a gSDE actor's log σ)."""
    names = {f"layers.{i}.{part}" for i in range(layers) for part in ("weight", "bias")}
    if sde:
        names.add("sde.log_std")
    if dueling:
        names |= {
            f"{head}.{part}" for head in ("value", "advantage") for part in ("weight", "bias")
        }
    if convs:
        names |= {"input.shape", "input.scale"}
        names |= {f"conv.{i}.{part}" for i in range(convs) for part in ("weight", "bias", "stride")}
    for name in weights:
        if name not in names:
            raise ValueError(
                f"{name!r} is no part of a network of {convs} convolutions and {layers} linear "
                "layers"
            )


def epsilon_greedy(
    q_values: np.ndarray, epsilon: float | np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Greedy actions, each replaced by a uniform one with probability epsilon (one for every
    row, or an array with one per row)."""
    actions = q_values.argmax(axis=1)
    if np.any(np.asarray(epsilon) > 0.0):
        explore = rng.random(len(actions)) < epsilon
        if explore.any():
            actions[explore] = rng.integers(q_values.shape[1], size=int(explore.sum()))
    return actions


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of the categorical policy of each row of logits (float64, stable)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def sample_categorical(
    logits: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One action per row drawn from softmax(logits), and its log-probability (the behaviour
    log-prob PPO's ratio is taken against)."""
    logp = log_softmax(logits)
    cdf = np.exp(logp).cumsum(axis=1)
    u = rng.random((len(cdf), 1)) * cdf[:, -1:]  # scaled by the row sum: rounding never overshoots
    actions = (cdf <= u).sum(axis=1).clip(max=logp.shape[1] - 1)
    return actions.astype(np.int64), logp[np.arange(len(actions)), actions].astype(np.float32)


# A squashed Gaussian's log-std range (SAC's): wide enough for a sure policy, finite for a new one.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
LOG_2PI = math.log(2.0 * math.pi)


def gaussian_params(outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian policy's outputs (2d per row: d means, then d log-stds) as (mean, log_std),
    the log-stds clipped to [LOG_STD_MIN, LOG_STD_MAX] (the learner clips the same way)."""
    d = outputs.shape[1] // 2
    return outputs[:, :d], np.clip(outputs[:, d:], LOG_STD_MIN, LOG_STD_MAX)


def squash_log_det(u: np.ndarray) -> np.ndarray:
    """log |d tanh(u) / du| = log(1 - tanh(u)^2), summed over a row's dimensions, in the form
    that stays finite for large |u|: 2 (log 2 - u - softplus(-2u))."""
    return (2.0 * (math.log(2.0) - u - np.logaddexp(0.0, -2.0 * u))).sum(axis=1)


def sample_squashed_gaussian(
    outputs: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One action per row from tanh(N(mean, std)): the squashed values in [-1, 1], their
    log-probability (the Gaussian's at the pre-squash sample u, less the squash's log-det; the
    affine scaling to the env's bounds is left out: a constant that cancels in every ratio), and
    u itself (what PPO's learner takes its log-probs at: atanh of a float32 action near +-1
    would not give it back)."""
    mean, log_std = gaussian_params(outputs.astype(np.float64))
    noise = rng.standard_normal(mean.shape)
    u = mean + np.exp(log_std) * noise
    logp = (-0.5 * noise**2 - log_std - 0.5 * LOG_2PI).sum(axis=1) - squash_log_det(u)
    return np.tanh(u), logp.astype(np.float32), u.astype(np.float32)
