"""The one wire codec: transition chunks as raw numpy bytes with a JSON header, weights as safetensors.

A chunk is a Redis Stream entry with two kinds of field:
  b"header"   JSON: {"v": 1, "run": ..., "chunk": ..., "arrays": {name: {"dtype", "shape"}}, ...}
  b"a:<name>" the C-contiguous bytes of one array, exactly prod(shape) * itemsize long.
Nothing is pickled; a decoder trusts no field it has not checked.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from clusterenv.pipeline.keys import ARRAY_FIELD_PREFIX, FIELD_HEADER

CODEC_VERSION = 1

# Only plain little-endian numeric dtypes ever travel; anything else is refused.
ALLOWED_DTYPES = frozenset(
    {"|b1", "|u1", "|i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"}
)


class CodecError(ValueError):
    """A message that cannot be decoded into what its header promises."""


@dataclass(frozen=True)
class ArraySpec:
    """What the learner expects of one array: dtype, and the shape after the leading row axis.
    Arrays of one `group` share their row count (transitions: ""; a chunk's frames: "frames")."""

    dtype: str
    row_shape: tuple[int, ...]
    group: str = ""


def wire_dtype(dtype: Any) -> str:
    """The dtype string values of `dtype` travel as: its little-endian form (which ALLOWED_DTYPES
    may still refuse)."""
    dt = np.dtype(dtype)
    return (dt.newbyteorder("<") if dt.byteorder == ">" else dt).str


def encode_chunk(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> dict[bytes, bytes]:
    """Fields for XADD: the header (with array dtypes/shapes filled in) and raw array bytes."""
    fields: dict[bytes, bytes] = {}
    described: dict[str, dict[str, Any]] = {}
    for name, array in arrays.items():
        a = np.ascontiguousarray(array)
        dtype = wire_dtype(a.dtype)
        if dtype not in ALLOWED_DTYPES:
            raise CodecError(f"array {name!r}: dtype {a.dtype} cannot travel")
        described[name] = {"dtype": dtype, "shape": list(a.shape)}
        fields[ARRAY_FIELD_PREFIX + name.encode()] = a.astype(dtype, copy=False).tobytes()
    full = {"v": CODEC_VERSION, **header, "arrays": described}
    fields[FIELD_HEADER] = json.dumps(full, separators=(",", ":")).encode()
    return fields


def decode_header(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """The JSON header of a stream entry, checked for form (not yet for content)."""
    raw = fields.get(FIELD_HEADER)
    if raw is None:
        raise CodecError("missing header field")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"header is not JSON: {exc}") from None
    except RecursionError:  # JSON nested deeper than Python's parser goes
        raise CodecError("header is nested too deeply") from None
    if not isinstance(header, dict):
        raise CodecError("header is not a JSON object")
    if header.get("v") != CODEC_VERSION:
        raise CodecError(f"codec version {header.get('v')!r}, expected {CODEC_VERSION}")
    if not isinstance(header.get("arrays"), dict):
        raise CodecError("header has no 'arrays' table")
    return header


def _described_array(name: str, desc: Any) -> tuple[np.dtype, list[int]]:
    """dtype and shape of one header `arrays` entry: an allowed dtype, non-negative int dims."""
    if not isinstance(desc, dict):
        raise CodecError(f"array {name!r}: description is not an object")
    dtype, shape = desc.get("dtype"), desc.get("shape")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:  # a list is not even hashable
        raise CodecError(f"array {name!r}: dtype {dtype!r} cannot travel")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CodecError(f"array {name!r}: bad shape {shape!r}")
    return np.dtype(dtype), shape


def decode_chunk(
    fields: Mapping[bytes, bytes], expected: Mapping[str, ArraySpec]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of one entry; every array must match `expected`, and the arrays of one
    row group share one row count."""
    header = decode_header(fields)
    return header, decode_arrays(fields, header, expected)


def decode_arrays(
    fields: Mapping[bytes, bytes], header: Mapping[str, Any], expected: Mapping[str, ArraySpec]
) -> dict[str, np.ndarray]:
    """The arrays of an entry whose header (`decode_header`) is already read: decode_chunk's
    checks, without parsing the header again."""
    described = header["arrays"]
    missing = sorted(set(expected) - set(described))
    if missing:
        raise CodecError(f"missing arrays: {', '.join(missing)}")
    arrays: dict[str, np.ndarray] = {}
    group_rows: dict[str, int] = {}
    for name, spec in expected.items():
        np_dtype, shape = _described_array(name, described[name])
        if np_dtype.str != spec.dtype:
            raise CodecError(f"array {name!r}: dtype {np_dtype.str!r}, expected {spec.dtype!r}")
        if not shape:
            raise CodecError(f"array {name!r}: bad shape {shape!r}")
        if tuple(shape[1:]) != spec.row_shape:
            raise CodecError(
                f"array {name!r}: shape {tuple(shape)}, expected (rows, {', '.join(map(str, spec.row_shape))})"
                if spec.row_shape
                else f"array {name!r}: shape {tuple(shape)}, expected (rows,)"
            )
        rows = group_rows.setdefault(spec.group, shape[0])
        if shape[0] != rows:
            raise CodecError(f"array {name!r}: {shape[0]} rows, others have {rows}")
        raw = fields.get(ARRAY_FIELD_PREFIX + name.encode())
        if raw is None:
            raise CodecError(f"array {name!r}: bytes missing")
        want = math.prod(shape) * np_dtype.itemsize
        if len(raw) != want:
            raise CodecError(f"array {name!r}: {len(raw)} bytes, header promises {want}")
        arrays[name] = np.frombuffer(raw, dtype=np_dtype).reshape(shape)
    return arrays


def encode_weights(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> bytes:
    """Safetensors bytes of named float arrays."""
    return st_save(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()},
        metadata=dict(metadata) if metadata else None,
    )


def decode_weights(blob: bytes) -> dict[str, np.ndarray]:
    """Named arrays from safetensors bytes; a damaged blob raises CodecError."""
    try:
        return st_load(blob)
    except Exception as exc:  # safetensors raises its own error types for any damage
        raise CodecError(f"weights blob is not valid safetensors: {exc}") from None


# --- One-value messages (Redis lists) and JSON trees with arrays, for the remote env ---

_FRAME_LEN = struct.Struct("<I")


def pack_message(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """One bytes value with what `encode_chunk` writes: u32 header length, header, array bytes."""
    fields = encode_chunk(header, arrays)
    head = fields.pop(FIELD_HEADER)
    return _FRAME_LEN.pack(len(head)) + head + b"".join(fields.values())


def unpack_message(blob: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of a packed message; every length and dtype is checked before use."""
    if len(blob) < _FRAME_LEN.size:
        raise CodecError(f"message of {len(blob)} bytes has no header length")
    (head_len,) = _FRAME_LEN.unpack_from(blob)
    offset = _FRAME_LEN.size + head_len
    if offset > len(blob):
        raise CodecError(f"header length {head_len} runs past the {len(blob)}-byte message")
    header = decode_header({FIELD_HEADER: blob[_FRAME_LEN.size : offset]})
    view = memoryview(blob)
    arrays: dict[str, np.ndarray] = {}
    for name, desc in header["arrays"].items():
        np_dtype, shape = _described_array(name, desc)
        size = math.prod(shape) * np_dtype.itemsize
        if offset + size > len(blob):
            raise CodecError(f"array {name!r}: {size} bytes promised, message too short")
        arrays[name] = np.frombuffer(view[offset : offset + size], dtype=np_dtype).reshape(shape)
        offset += size
    if offset != len(blob):
        raise CodecError(f"{len(blob) - offset} stray bytes after the last array")
    return header, arrays


# Tags of the JSON tree form; a plain dict may not use them as keys.
_ND, _TUPLE, _REPR = "$nd", "$tuple", "$repr"


def encode_tree(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    """JSON form of an info/options value; numpy arrays and scalars go into `arrays` (dtype kept).

    Values that are neither JSON, numpy nor dict/list/tuple travel as their repr() string.
    """
    if (
        isinstance(obj, np.ndarray | np.generic)
        and wire_dtype(np.asarray(obj).dtype) in ALLOWED_DTYPES
    ):
        name = f"t{len(arrays)}"
        arrays[name] = a = np.asarray(obj)
        # The shape rides in the tree too: the chunk encoder turns 0-d arrays into shape (1,).
        return {_ND: name, "shape": list(a.shape), "scalar": isinstance(obj, np.generic)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        if {_ND, _TUPLE, _REPR} & obj.keys():
            return {_REPR: repr(obj)}
        return {k: encode_tree(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode_tree(v, arrays) for v in obj]
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_tree(v, arrays) for v in obj]}
    return {_REPR: repr(obj)}


def decode_tree(tree: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """Inverse of `encode_tree`; arrays come back writable, scalars as numpy scalars."""
    if isinstance(tree, list):
        return [decode_tree(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if _ND in tree:
        if not isinstance(tree[_ND], str) or tree[_ND] not in arrays:
            raise CodecError(f"tree refers to missing array {tree[_ND]!r}")
        a = arrays[tree[_ND]]
        shape = tree.get("shape")
        if (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or math.prod(shape) != a.size
        ):
            raise CodecError(f"tree array {tree[_ND]!r}: shape {shape!r} does not fit {a.shape}")
        a = a.reshape(shape)
        return a[()] if tree.get("scalar") else a.copy()
    if _TUPLE in tree:
        if not isinstance(tree[_TUPLE], list):
            raise CodecError(f"tree tuple is {type(tree[_TUPLE]).__name__}, not a list")
        return tuple(decode_tree(v, arrays) for v in tree[_TUPLE])
    if _REPR in tree:
        return tree[_REPR]
    return {k: decode_tree(v, arrays) for k, v in tree.items()}
