"""Codec round trips, and rejection of every kind of damaged message."""

import json

import numpy as np
import pytest

from clusterenv.pipeline.codec import (
    ArraySpec,
    CodecError,
    decode_chunk,
    decode_weights,
    encode_chunk,
    encode_weights,
)

SPECS = {
    "obs": ArraySpec("<f4", (4,)),
    "action": ArraySpec("<i8", ()),
    "done": ArraySpec("|b1", ()),
}


def good_arrays(rows: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "action": rng.integers(2, size=rows),
        "done": rng.random(rows) < 0.5,
    }


@pytest.mark.parametrize("rows", [0, 1, 1024])
def test_round_trip(rows):
    arrays = good_arrays(rows)
    header, out = decode_chunk(encode_chunk({"run": "r", "chunk": 3}, arrays), SPECS)
    assert header["run"] == "r" and header["chunk"] == 3
    for name, a in arrays.items():
        assert out[name].dtype == a.dtype and np.array_equal(out[name], a)


def _set_header(fields, **changes):
    h = json.loads(fields[b"header"])
    h.update(changes)
    fields[b"header"] = json.dumps(h).encode()


def _damage_desc(fields, name, **changes):
    h = json.loads(fields[b"header"])
    h["arrays"][name].update(changes)
    fields[b"header"] = json.dumps(h).encode()


DAMAGE = [
    (
        "truncated bytes",
        lambda f: f.__setitem__(b"a:obs", f[b"a:obs"][:-3]),
        "bytes, header promises",
    ),
    (
        "extra bytes",
        lambda f: f.__setitem__(b"a:obs", f[b"a:obs"] + b"\0"),
        "bytes, header promises",
    ),
    ("wrong dtype", lambda f: _damage_desc(f, "obs", dtype="<f8"), "dtype '<f8', expected '<f4'"),
    ("pickle dtype", lambda f: _damage_desc(f, "obs", dtype="|O"), "dtype '|O'"),
    ("wrong row shape", lambda f: _damage_desc(f, "obs", shape=[5, 3]), "shape (5, 3)"),
    ("negative dim", lambda f: _damage_desc(f, "obs", shape=[-5, 4]), "bad shape"),
    ("row mismatch", lambda f: _damage_desc(f, "action", shape=[4]), "4 rows, others have 5"),
    ("missing array bytes", lambda f: f.pop(b"a:done"), "array 'done': bytes missing"),
    ("missing array entry", lambda f: _set_header(f, arrays={}), "missing arrays"),
    ("missing header", lambda f: f.pop(b"header"), "missing header"),
    ("header not json", lambda f: f.__setitem__(b"header", b"\x80nope"), "not JSON"),
    ("header not object", lambda f: f.__setitem__(b"header", b"[1]"), "not a JSON object"),
    ("codec version", lambda f: _set_header(f, v=99), "codec version 99"),
]


@pytest.mark.parametrize("name,damage,message", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_messages_are_rejected_with_a_reason(name, damage, message):
    fields = encode_chunk({"run": "r"}, good_arrays())
    damage(fields)
    with pytest.raises(CodecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        decode_chunk(fields, SPECS)


def test_object_arrays_cannot_be_encoded():
    with pytest.raises(CodecError, match="cannot travel"):
        encode_chunk({}, {"x": np.array([object()])})


def test_weights_round_trip_and_damage():
    w = {"layers.0.weight": np.ones((3, 2), np.float32), "layers.0.bias": np.zeros(3, np.float32)}
    blob = encode_weights(w, {"version": "7"})
    back = decode_weights(blob)
    assert set(back) == set(w) and all(np.array_equal(back[k], w[k]) for k in w)
    with pytest.raises(CodecError, match="not valid safetensors"):
        decode_weights(blob[:20])
