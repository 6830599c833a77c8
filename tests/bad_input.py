"""Hypothesis strategies for wire input: valid chunk entries and entries broken in one known way.

Every `bad_entry` differs from a valid entry in exactly one place that the reader must refuse, so
a test can demand that each one is rejected (and none of its rows reaches replay).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from hypothesis import strategies as st

from clusterenv.pipeline.codec import ArraySpec, encode_chunk
from clusterenv.pipeline.keys import ARRAY_FIELD_PREFIX, FIELD_HEADER
from clusterenv.pipeline.spaces import DiscreteActions, SpaceSpecs

OBS_SHAPE = (4,)
NUM_ACTIONS = 2
SPACES = SpaceSpecs(ArraySpec("<f4", OBS_SHAPE), DiscreteActions(NUM_ACTIONS))
# Every obs value of an entry that must be rejected; a replay row holding it came from one.
POISON = np.float32(-1234.5)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


# Values of the fields a worker reports that the learner must refuse.
WORKER_REPORT_FAILS = {
    "env_steps": lambda v: not (type(v) is int and v >= 0),
    "episodes": lambda v: (
        not (
            isinstance(v, list)
            and all(
                isinstance(e, list) and len(e) == 2 and _number(e[0]) and type(e[1]) is int
                for e in v
            )
        )
    ),
    "sync": lambda v: not (isinstance(v, dict) and all(type(x) is int for x in v.values())),
    "divergence": lambda v: v is not None and not _number(v),
}
HEADER_CHECKS = {"v", "run", "chunk", "worker", "policy_version", "arrays", *WORKER_REPORT_FAILS}


def entry_arrays(rows: int, fill: float) -> dict[str, np.ndarray]:
    """The arrays of a CartPole-shaped chunk whose obs are all `fill`."""
    obs = np.full((rows, *OBS_SHAPE), fill, np.float32)
    return {
        "obs": obs,
        "action": np.arange(rows, dtype=np.int64) % NUM_ACTIONS,
        "reward": np.ones(rows, np.float32),
        "next_obs": obs.copy(),
        "terminated": np.zeros(rows, bool),
        "truncated": np.zeros(rows, bool),
        "env_index": np.zeros(rows, np.int32),
    }


def entry(run_id: str, chunk: int, rows: int, fill: float) -> dict[bytes, bytes]:
    header = {"run": run_id, "chunk": chunk, "worker": "w:1", "policy_version": 0}
    return encode_chunk(header, entry_arrays(rows, fill))


def _header(fields: dict[bytes, bytes]) -> dict[str, Any]:
    return json.loads(fields[FIELD_HEADER])


def _with_header(fields: dict[bytes, bytes], header: Any) -> dict[bytes, bytes]:
    return {**fields, FIELD_HEADER: json.dumps(header).encode()}


@st.composite
def bad_entry(draw: st.DrawFn, run_id: str, chunk: int) -> dict[bytes, bytes]:
    """A chunk entry (obs all POISON) broken in exactly one way the reader must refuse."""
    rows = draw(st.integers(1, 5))
    fields = entry(run_id, chunk, rows, float(POISON))
    header = _header(fields)
    name = draw(st.sampled_from(sorted(entry_arrays(1, 0.0))))
    kind = draw(st.sampled_from([
        "no header", "header bytes", "header deep", "header json", "header field", "header key gone",
        "array dtype", "array shape", "array description", "array bytes gone", "array length",
        "action range", "non-finite",
    ]))  # fmt: skip
    if kind == "no header":
        del fields[FIELD_HEADER]
    elif kind == "header bytes":  # never JSON: 0xff starts no UTF-8 text
        fields[FIELD_HEADER] = b"\xff" + draw(st.binary(max_size=40))
    elif kind == "header deep":  # deeper than Python's JSON parser recurses
        depth = draw(st.integers(5_000, 20_000))
        fields[FIELD_HEADER] = b'{"v":1,"x":' + b"[" * depth + b"]" * depth + b"}"
    elif kind == "header json":
        fields = _with_header(
            fields, draw(json_values.filter(lambda v: not isinstance(v, dict) or "arrays" not in v))
        )
    elif kind == "header field":
        key = draw(st.sampled_from(sorted(HEADER_CHECKS)))
        must_fail = {
            "v": lambda v: v != 1,
            "run": lambda v: v != run_id,
            "chunk": lambda v: not isinstance(v, int) or isinstance(v, bool),
            "policy_version": lambda v: not isinstance(v, int) or isinstance(v, bool),
            "worker": lambda v: not isinstance(v, str),
            "arrays": lambda v: v != header["arrays"],
            **WORKER_REPORT_FAILS,
        }[key]
        fields = _with_header(fields, {**header, key: draw(json_values.filter(must_fail))})
    elif kind == "header key gone":
        key = draw(st.sampled_from(["v", "run", "chunk", "worker", "policy_version", "arrays"]))
        fields = _with_header(fields, {k: v for k, v in header.items() if k != key})
    elif kind in ("array dtype", "array shape", "array description"):
        desc = header["arrays"][name]
        new = {
            "array dtype": lambda: {**desc, "dtype": draw(
                (st.sampled_from(["<f4", "<f8", "<i8", "|b1", "<i4", ">f4", "|O", "<U3"]) | json_values)
                .filter(lambda d: d != desc["dtype"]))},
            "array shape": lambda: {**desc, "shape": draw(
                (st.lists(st.integers(-2, 2**40), max_size=3) | json_values)
                .filter(lambda s: s != desc["shape"]))},
            "array description": lambda: draw(json_values.filter(lambda d: d != desc)),
        }[kind]()  # fmt: skip
        fields = _with_header(fields, {**header, "arrays": {**header["arrays"], name: new}})
    elif kind == "array bytes gone":
        del fields[ARRAY_FIELD_PREFIX + name.encode()]
    elif kind == "array length":
        raw = fields[ARRAY_FIELD_PREFIX + name.encode()]
        cut = draw(st.integers(1, len(raw)))
        extra = draw(st.binary(min_size=1, max_size=16))
        fields[ARRAY_FIELD_PREFIX + name.encode()] = (
            raw[:-cut] if draw(st.booleans()) else raw + extra
        )
    elif kind == "action range":
        arrays = entry_arrays(rows, float(POISON))
        bad = draw(st.integers(max_value=-1) | st.integers(min_value=NUM_ACTIONS))
        arrays["action"][draw(st.integers(0, rows - 1))] = max(min(bad, 2**62), -(2**62))
        fields = encode_chunk({k: v for k, v in header.items() if k not in ("v", "arrays")}, arrays)
    else:  # non-finite
        arrays = entry_arrays(rows, float(POISON))
        target = draw(st.sampled_from(["obs", "next_obs", "reward"]))
        arrays[target].reshape(-1)[draw(st.integers(0, rows - 1))] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf])
        )
        fields = encode_chunk({k: v for k, v in header.items() if k not in ("v", "arrays")}, arrays)
    return fields
