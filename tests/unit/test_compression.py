"""Compressed payloads: round trips, and what a reader refuses before it takes memory for it."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

from rqrl.engine.compression import COMPRESSED_MAGIC, compress, decompress, worth_compressing
from rqrl.errors import RecordError


def test_a_payload_round_trips_and_repetitive_frames_shrink():
    frame = np.zeros((84, 84), np.uint8)
    frame[40:44, 10:12] = 255  # a Pong-like frame: mostly background
    blob = np.stack([np.roll(frame, shift, axis=0) for shift in range(64)]).tobytes()
    payload = compress(blob)
    assert payload.startswith(COMPRESSED_MAGIC) and len(payload) < len(blob) / 20
    assert bytes(decompress(payload, limit=len(blob))) == blob


def test_a_payload_that_is_not_compressed_passes_through_untouched():
    blob = b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + bytes(6)  # a safetensors buffer starts with its header size
    assert decompress(blob) is blob


def test_a_payload_over_the_limit_is_refused_before_it_is_decompressed():
    payload = compress(bytes(10_000))
    with pytest.raises(RecordError, match="10000 bytes"):
        decompress(payload, limit=9_999)


def test_a_frame_that_does_not_say_its_size_is_refused():
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(1000))
    with pytest.raises(RecordError, match="unknown"):
        decompress(COMPRESSED_MAGIC + unsized)


@pytest.mark.parametrize("body", [b"", b"junk that is no zstd frame", None])
def test_a_corrupt_payload_is_a_record_error(body):
    if body is None:  # a real frame, cut short
        body = compress(np.random.default_rng(0).bytes(5000))[len(COMPRESSED_MAGIC):-100]
    with pytest.raises(RecordError):
        decompress(COMPRESSED_MAGIC + body)


@pytest.mark.parametrize("arrays,leading,expected", [
    ([np.zeros((3, 8, 4, 84, 84), np.uint8)], 2, True),
    ([np.zeros((3, 8, 84, 84), np.uint8)], 2, True),
    ([np.zeros((3, 8, 4), np.float32), np.zeros((3, 8, 6, 6), np.uint8)], 2, True),
    ([np.zeros((3, 8, 4), np.float32)], 2, False),
    ([np.zeros((3, 8, 4), np.uint8)], 2, False),
    ([np.zeros((3, 8, 84, 84), np.float32)], 2, False),
])
def test_only_payloads_with_images_are_worth_compressing(arrays, leading, expected):
    assert worth_compressing(arrays, leading) is expected


def test_noise_is_sent_as_it_is():
    noise = np.random.default_rng(1).bytes(200_000)
    assert compress(noise) == noise


def test_a_payload_whose_middle_is_noise_is_not_tried_whole():
    blob = bytes(100_000) + np.random.default_rng(2).bytes(100_000) + bytes(100_000)
    assert compress(blob) == blob, "the middle, where the observations lie, decides"
