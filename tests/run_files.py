"""Readers of what a training run writes to its folder: the rows of metrics.csv, the TensorBoard events."""

from __future__ import annotations

import csv
import struct
from pathlib import Path

from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header (metrics.csv), as dicts of strings."""
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def tensorboard_events(run_dir: Path) -> list[event_pb2.Event]:
    """Every event of the run's TensorBoard files, read from the TFRecord framing with both CRCs checked."""
    events = []
    files = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert files, "no TensorBoard event file"
    for path in files:
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            header = data[offset:offset + 8]
            (length,) = struct.unpack("<Q", header)
            payload = data[offset + 12:offset + 12 + length]
            (header_crc,), (payload_crc,) = (struct.unpack("<I", data[offset + 8:offset + 12]),
                                             struct.unpack("<I", data[offset + 12 + length:offset + 16 + length]))
            assert (header_crc, payload_crc) == (masked_crc32c(header), masked_crc32c(payload)), f"bad CRC in {path}"
            events.append(event_pb2.Event.FromString(payload))
            offset += 12 + length + 4
    return events


def tensorboard_scalars(run_dir: Path) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in the run's event files."""
    return [(event.step, value.tag, value.simple_value) for event in tensorboard_events(run_dir)
            for value in event.summary.value]
