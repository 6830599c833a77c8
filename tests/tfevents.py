"""Reads TensorBoard event files back (TFRecord framing, tensorboardX's protobuf classes)."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag over every event file in `run_dir`."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(run_dir.glob("events.out.tfevents.*"))
    assert files, f"no event file in {run_dir}"
    for path in files:
        data = path.read_bytes()
        at = 0
        while at < len(data):
            # A record: u64 length, u32 CRC of the length, payload, u32 CRC of the payload.
            (length,) = struct.unpack_from("<Q", data, at)
            payload = data[at + 12 : at + 12 + length]
            assert len(payload) == length, f"truncated record in {path}"
            at += 12 + length + 4
            event = Event.FromString(payload)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
