"""Cost of the workers' numpy conv forward: NumpyConvNet (im2col in (N, H, W, C) + one matrix
product per convolution) against sliding windows in (N, C, H, W) with `einsum` or `tensordot`, and
torch on one thread for scale, on a batch of observations (--batch, default 8).

Nature DQN on (4, 84, 84) uint8 frames and MinAtar's net on (6, 10, 10) 0/1 planes, the weights
of a fresh learner network (every form checked against NumpyConvNet's outputs first); interleaved
repeats, medians reported. Run it with OPENBLAS_NUM_THREADS=1, the workers' setting (tasks/ sets
it before numpy loads; here numpy has loaded before any clusterenv module could).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from bench.common import mark_start, table, write_results
from clusterenv.learner.core.networks import build_network
from clusterenv.pipeline.policy import NumpyConvNet

NETS = {  # name: (observation shape, its values in [0, high), torso)
    "nature (4, 84, 84)": ((4, 84, 84), 256, "nature"),
    "minatar (6, 10, 10)": ((6, 10, 10), 2, "minatar"),
}


def windows_forward(w: dict[str, np.ndarray], contract: str) -> Callable[[np.ndarray], np.ndarray]:
    """The forward over (N, C, H, W) sliding windows, each convolution one `einsum` (optimized:
    BLAS) or one `tensordot`; the dense part as NumpyConvNet's."""
    convs, i = [], 0
    while f"conv.{i}.weight" in w:
        convs.append((w[f"conv.{i}.weight"], w[f"conv.{i}.bias"], int(w[f"conv.{i}.stride"][0])))
        i += 1
    dense, j = [], 0
    while f"layers.{j}.weight" in w:
        dense.append((np.ascontiguousarray(w[f"layers.{j}.weight"].T), w[f"layers.{j}.bias"]))
        j += 1
    scale = np.float32(w["input.scale"][0])

    def forward(obs: np.ndarray) -> np.ndarray:
        x = obs.astype(np.float32)
        x *= scale
        for kernel, bias, stride in convs:
            win = sliding_window_view(x, kernel.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
            if contract == "einsum":
                y = np.einsum("nchwij,ocij->nohw", win, kernel, optimize=True)
            else:  # (N, H', W', O), back to channel-first
                y = np.tensordot(win, kernel, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
            y += bias[:, None, None]
            x = np.maximum(y, 0.0)
        x = x.reshape(len(x), -1)
        for k, (w_t, b) in enumerate(dense):
            x = (np.maximum(x, 0.0) if k else x) @ w_t + b
        return x

    return forward


def torch_forward(net: torch.nn.Module) -> Callable[[np.ndarray], np.ndarray]:
    def forward(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return net(torch.from_numpy(obs)).numpy()

    return forward


def ms_per_call(forward: Callable[[np.ndarray], np.ndarray], obs: np.ndarray, calls: int) -> float:
    forward(obs)
    t0 = time.perf_counter()
    for _ in range(calls):
        forward(obs)
    return 1e3 * (time.perf_counter() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.conv_forward", description=__doc__.split("\n")[0]
    )
    p.add_argument("--batch", type=int, default=8, help="observations per forward")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians reported")
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default: bench/results/conv_forward.json)")  # fmt: skip
    args = p.parse_args(argv)
    mark_start()
    openblas = os.environ.get("OPENBLAS_NUM_THREADS")
    if openblas != "1":
        print(f"OPENBLAS_NUM_THREADS={openblas}: the workers run with 1")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows, runs = [], {}
    for name, (shape, high, torso) in NETS.items():
        net = build_network(shape, 6, torso, [])
        w = net.get_weights()
        obs = np.random.default_rng(1).integers(0, high, (args.batch, *shape), dtype=np.uint8)
        forms = {"NumpyConvNet (im2col, NHWC)": NumpyConvNet(w),
                 "einsum over windows (NCHW)": windows_forward(w, "einsum"),
                 "tensordot over windows (NCHW)": windows_forward(w, "tensordot"),
                 "torch, 1 thread": torch_forward(net)}  # fmt: skip
        want = forms["NumpyConvNet (im2col, NHWC)"](obs)
        for form, forward in forms.items():
            np.testing.assert_allclose(forward(obs), want, rtol=1e-4, atol=1e-4, err_msg=form)
        calls = max(10, int(200 / ms_per_call(forms["einsum over windows (NCHW)"], obs, 3)))
        times: dict[str, list[float]] = {form: [] for form in forms}
        for _ in range(args.repeats):  # interleaved, so a load change hits all
            for form, forward in forms.items():
                times[form].append(ms_per_call(forward, obs, calls))
        runs[name] = times
        rows += [{"net": name, "forward": form, f"ms per batch of {args.batch}": float(np.median(ms))}
                 for form, ms in times.items()]  # fmt: skip
    print(table(rows, list(rows[0])))
    payload = {"args": vars(args) | {"out": str(args.out)}, "openblas_threads": openblas}
    path = write_results("conv_forward", payload | {"runs": runs}, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
