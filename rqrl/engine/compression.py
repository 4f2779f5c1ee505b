"""Rollout payloads compressed with zstd, where it pays: image observations.

Chosen by measurement (``benchmarks/frame_bytes.py``): on Pong's 84x84 frames zstd at level 1 shrinks the
unique frames 190x at about 1 us of worker CPU per frame, against lz4's 77x at 0.5 us; an Atari step costs
the env about 330 us. Vector observations (CartPole's four floats) gain little and are sent as they are.

Noise does not compress: a payload whose middle 32 KB do not shrink by a tenth goes raw, for the cost of
compressing those 32 KB (random 84x84 frames, ``benchmarks/image_obs.py``, would pay zstd's CPU for nothing).

A compressed payload is ``COMPRESSED_MAGIC`` and one zstd frame that records its decompressed size; the
signature covers the compressed bytes, so a payload is verified before it is decompressed, and a size over
the reader's limit is refused before any memory is taken for it.

>>> payload = compress(b"frame" * 1000)
>>> len(payload) < 100, bytes(decompress(payload, limit=10_000)) == b"frame" * 1000
(True, True)
>>> import os
>>> noise = os.urandom(100_000)  # does not shrink: sent as it is
>>> compress(noise) == noise
True
>>> bytes(decompress(b"not compressed", limit=10))
b'not compressed'
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
import zstandard

from rqrl.errors import RecordError

COMPRESSED_MAGIC = b"RQRLZST1"
"""Starts a compressed payload. A safetensors buffer never does: its first 8 bytes are a header size under 16 MB."""
LEVEL = 1
MAX_DECOMPRESSED_BYTES = 512 * 2**20
"""The largest payload a reader decompresses (Redis's own limit on one value)."""

__all__ = ["COMPRESSED_MAGIC", "compress", "decompress", "holds_images", "worth_compressing"]

MIN_SAVING = 0.1
"""A payload is sent compressed only if that makes it at least this much smaller."""
PROBE_BYTES = 32 * 1024
"""How much of a payload is compressed first to see whether the whole is worth it."""

_per_thread = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor: a ZstdCompressor is not thread-safe, and it lets go of the GIL while it works, so
    threads compressing at once through one (a SEED actor's threads) corrupted it and crashed the process."""
    compressor = getattr(_per_thread, "compressor", None)
    if compressor is None:
        compressor = _per_thread.compressor = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True)
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor (not thread-safe either)."""
    decompressor = getattr(_per_thread, "decompressor", None)
    if decompressor is None:
        decompressor = _per_thread.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def compress(blob: bytes) -> bytes:
    """``blob`` as a compressed payload, or as it is when compressing does not pay: when ``PROBE_BYTES`` from its
    middle (where the observations lie) shrink by less than ``MIN_SAVING`` (noise-like images), or the whole does."""
    middle = len(blob) // 2
    probe = blob[max(0, middle - PROBE_BYTES // 2): middle + PROBE_BYTES // 2]
    compressor = _compressor()
    if len(compressor.compress(probe)) > (1 - MIN_SAVING) * len(probe):
        return blob
    payload = COMPRESSED_MAGIC + compressor.compress(blob)
    return payload if len(payload) <= (1 - MIN_SAVING) * len(blob) else blob


def decompress(payload: bytes | memoryview, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes | memoryview:
    """The bytes ``compress`` was given, or ``payload`` itself if it is not compressed; RecordError if it is
    malformed or would decompress to more than ``limit`` bytes."""
    view = memoryview(payload)
    if view[: len(COMPRESSED_MAGIC)] != COMPRESSED_MAGIC:
        return payload
    body = view[len(COMPRESSED_MAGIC):]
    try:
        size = zstandard.frame_content_size(body)
    except zstandard.ZstdError as error:
        raise RecordError(f"compressed payload has no valid zstd frame header: {error}") from error
    if not 0 <= size <= limit:
        raise RecordError(f"compressed payload would decompress to {size} bytes (-1: unknown); the limit is {limit}")
    try:
        return _decompressor().decompress(body)
    except zstandard.ZstdError as error:
        raise RecordError(f"compressed payload is corrupt: {error}") from error


def holds_images(array: np.ndarray, leading_axes: int = 1) -> bool:
    """Whether ``array`` holds images: uint8 observations of two or more axes after its ``leading_axes`` (what is
    worth compressing, and what SEED sends as frames)."""
    return array.dtype == np.uint8 and array.ndim - leading_axes >= 2


def worth_compressing(observations: Iterable[np.ndarray], leading_axes: int) -> bool:
    """Whether a payload holding these observation arrays (``leading_axes`` before each observation) is worth
    compressing: it holds images."""
    return any(holds_images(array, leading_axes) for array in observations)
