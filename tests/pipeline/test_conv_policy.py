"""The workers' numpy conv net (pipeline/policy.py), without torch: its forward against a plain
loop over output pixels, the contract's checks by name, and which network a blob makes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from clusterenv.pipeline.codec import encode_weights
from clusterenv.pipeline.policy import NumpyConvNet, NumpyMLP, load_policy, numpy_policy
from tests.fakes import MINATAR, NATURE, conv_weights, net


def loop_forward(w: dict[str, np.ndarray], obs: np.ndarray) -> np.ndarray:
    """The same net, one output pixel at a time in float64: what NumpyConvNet must compute."""
    x = obs.astype(np.float64) * float(w["input.scale"][0])
    i = 0
    while f"conv.{i}.weight" in w:
        k, b, s = w[f"conv.{i}.weight"], w[f"conv.{i}.bias"], int(w[f"conv.{i}.stride"][0])
        kh, kw = k.shape[2:]
        h, wd = (x.shape[2] - kh) // s + 1, (x.shape[3] - kw) // s + 1
        y = np.empty((len(x), len(k), h, wd))
        for r in range(h):
            for c in range(wd):
                patch = x[:, :, r * s : r * s + kh, c * s : c * s + kw]
                y[:, :, r, c] = np.einsum("nchw,ochw->no", patch, k) + b
        x, i = np.maximum(y, 0.0), i + 1
    x = x.reshape(len(x), -1)
    j = 0
    while f"layers.{j}.weight" in w:
        if j > 0:
            x = np.maximum(x, 0.0)
        x = x @ w[f"layers.{j}.weight"].T.astype(np.float64) + w[f"layers.{j}.bias"]
        j += 1
    return x


def frames(shape: tuple[int, ...], n: int = 8, high: int = 256, seed: int = 1) -> np.ndarray:
    """uint8 observations: random frames (high 256) or 0/1 planes (high 2)."""
    return np.random.default_rng(seed).integers(0, high, size=(n, *shape), dtype=np.uint8)


@pytest.mark.parametrize(
    ("shape", "convs", "dense", "scale", "high"),
    [
        ((4, 84, 84), NATURE, (512,), 1 / 255, 256),  # Atari frames
        ((6, 10, 10), MINATAR, (128,), 1.0, 2),  # MinAtar planes
        ((2, 13, 9), ((5, 3, 2), (7, 2, 1)), (), 0.5, 256),  # odd sizes, no hidden layer
    ],
)
def test_the_conv_forward_is_the_loop_over_output_pixels(shape, convs, dense, scale, high):
    w = conv_weights(shape, convs, dense, scale=scale)
    obs = frames(shape, high=high)
    policy = numpy_policy(w)
    assert isinstance(policy, NumpyConvNet)
    assert policy.input_shape == shape and policy.num_outputs == 3
    out = policy(obs)
    assert out.dtype == np.float32 and out.shape == (8, 3)
    np.testing.assert_allclose(out, loop_forward(w, obs), rtol=1e-4, atol=1e-4)


def test_a_blob_makes_whichever_network_its_arrays_describe():
    conv = conv_weights((6, 10, 10))
    policy = load_policy(encode_weights(conv))
    assert isinstance(policy, NumpyConvNet)
    obs = frames((6, 10, 10), high=2)
    np.testing.assert_array_equal(policy(obs), NumpyConvNet(conv)(obs))
    assert isinstance(load_policy(encode_weights(net(0))), NumpyMLP)


def test_float16_weights_act_in_float32():
    w = {k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in conv_weights((6, 10, 10)).items()}  # fmt: skip
    out = numpy_policy(w)(frames((6, 10, 10), high=2))
    assert out.dtype == np.float32 and np.isfinite(out).all()


def test_a_conv_net_takes_its_shape_and_an_mlp_any_shape_of_its_size():
    conv, mlp = numpy_policy(conv_weights((6, 10, 10))), NumpyMLP(net(0))
    assert conv.takes((6, 10, 10)) and not conv.takes((10, 10, 6)) and not conv.takes((600,))
    assert conv.num_inputs == 600
    assert mlp.takes((4,)) and mlp.takes((2, 2)) and not mlp.takes((5,))
    assert mlp.input_shape == (4,)
    with pytest.raises(ValueError, match=r"observations of shape \(10, 10, 6\)"):
        conv(np.zeros((1, 10, 10, 6), np.uint8))


Change = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def _set(name: str, value: np.ndarray) -> Change:
    return lambda w: {**w, name: value}


def _drop(name: str) -> Change:
    return lambda w: {k: v for k, v in w.items() if k != name}


F32, I64 = np.float32, np.int64
# (what is done to MinAtar-shaped weights (6, 10, 10) -> 16 x 8 x 8 -> 128 -> 3, the message).
BAD = [
    (_drop("input.shape"), "input.shape is missing"),
    (_set("input.shape", np.array([6, 10, 10], F32)), r"input.shape: float32 \(3,\) is not 3 positive"),
    (_set("input.shape", np.array([6, 100], I64)), r"input.shape: int64 \(2,\) is not 3 positive"),
    (_set("input.shape", np.array([6, 0, 10], I64)), r"input.shape: \[6, 0, 10\] is not 3 positive"),
    (_drop("input.scale"), "input.scale is missing"),
    (_set("input.scale", np.array([np.nan], F32)), "input.scale has non-finite values"),
    (_set("input.scale", np.ones(2, F32)), r"input.scale: \(2,\) is not one value"),
    (_drop("conv.0.stride"), "conv.0.stride is missing"),
    (_set("conv.0.stride", np.array([1.0], F32)), r"conv.0.stride: float32 \(1,\) is not one positive integer"),
    (_set("conv.0.stride", np.array([0], I64)), r"conv.0.stride: \[0\] is not one positive integer"),
    (_set("conv.0.stride", np.array([1, 1], I64)), r"conv.0.stride: int64 \(2,\)"),
    (_set("conv.0.weight", np.ones((16, 6, 3), F32)), r"conv.0.weight: float32 \(16, 6, 3\) is not a non-empty 4-d"),
    (_set("conv.0.weight", np.ones((16, 6, 3, 3), I64)), r"conv.0.weight: int64 .* is not a non-empty 4-d float"),
    (_set("conv.0.weight", np.full((16, 6, 3, 3), np.inf, F32)), "conv.0.weight has non-finite values"),
    (_drop("conv.0.bias"), "conv.0.bias is missing"),
    (_set("conv.0.bias", np.zeros(8, F32)), "conv.0.bias has 8 values for 16 channels"),
    (_set("input.shape", np.array([5, 10, 10], I64)), "conv.0.weight takes 6 channels, input.shape gives 5"),
    (_set("input.shape", np.array([6, 2, 10], I64)), "conv.0.weight: its 3x3 kernel does not fit the 2x10"),
    (_set("input.shape", np.array([6, 11, 10], I64)), r"layers.0.weight takes 1024 inputs, conv.0 gives 16x9x8 = 1152"),
    (_set("input.shape", np.array([6, 10, 10], I64)), None),  # the same values: it loads
    (_drop("conv.0.weight"), "weights hold no 'conv.0.weight'"),
    (_set("conv.1.bias", np.zeros(4, F32)), "'conv.1.bias' is no part of a network of 1 convolutions"),
    (_set("layers.3.weight", np.zeros((3, 3), F32)), "'layers.3.weight' is no part"),
    (_set("x", np.zeros(1, F32)), "'x' is no part"),
    (_drop("layers.1.bias"), "layers.1.bias is missing"),
    (_set("layers.1.weight", np.zeros((3, 64), F32)), "layers.1.weight takes 64 inputs, layers.0 gives 128"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_conv_weights_are_refused_by_name(change, message):
    weights = change(conv_weights((6, 10, 10)))
    if message is None:
        assert numpy_policy(weights).num_outputs == 3
        return
    with pytest.raises(ValueError, match=message):
        numpy_policy(weights)
    with pytest.raises(ValueError, match=message):  # through a blob, as a worker reads it
        load_policy(encode_weights(weights))


def test_a_conv_chain_refused_at_its_second_convolution():
    w = conv_weights((4, 84, 84), NATURE, (512,))
    with pytest.raises(ValueError, match="conv.1.weight takes 16 channels, conv.0 gives 32"):
        numpy_policy({**w, "conv.1.weight": np.ones((64, 16, 4, 4), F32)})
    with pytest.raises(ValueError, match="conv.2.weight: its 10x10 kernel does not fit the 9x9 "
                                         "that conv.1 gives"):  # fmt: skip
        numpy_policy({**w, "conv.2.weight": np.ones((64, 64, 10, 10), F32)})


def test_mlp_weights_with_a_stray_name_are_refused():
    # layers.0 and .1, then no layers.2: layers.3 would be silently left out of the forward.
    with pytest.raises(ValueError, match="'layers.3.weight' is no part of a network of 0 conv"):
        NumpyMLP({**net(0), "layers.3.weight": np.ones((2, 2), F32)})
    with pytest.raises(ValueError, match="'x' is no part"):
        numpy_policy({**net(0), "x": np.ones(1, F32)})
