"""Frames found by their content: frame stacks in any order, from any envs, as each distinct frame once and an
index that rebuilds them.

``frames`` packs one env's steps by the shift of its stacks. Transitions of many envs, mixed together and n steps
apart (SEED's messages and its replay), have no such order; here each frame is keyed by a 128-bit XXH3 digest of
its bytes instead: two different frames of a million share a key with odds of about 10**-27, and XXH3 reads an
84x84 frame in 0.8 us (keyed BLAKE3: 5.7). Not a MAC, and not needed as one: what is hashed was verified first, or
is the hasher's own.

>>> frames = np.array([[[1, 1]], [[2, 2]], [[1, 1]]], np.uint8)  # three 1x2 frames, two alike
>>> found = unique_frames(frames, frames[1:])
>>> found.frames[:, 0].tolist(), found.frame_index.tolist()
([[1, 1], [2, 2]], [0, 1, 0, 1, 0])
>>> rebuild_stacks(found.frames, found.frame_index.reshape(5, 1))[:, 0].tolist()  # one-frame "stacks"
[[1, 1], [2, 2], [1, 1], [2, 2], [1, 1]]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import xxhash

from rqrl.engine.compression import MAX_DECOMPRESSED_BYTES
from rqrl.errors import RecordError

MAX_STACK = 32
"""An observation's first axis is a stack of frames if it has 2 to this many entries (frame stacks are 2-16
deep) and fewer than each of the next two (a frame's height and width); otherwise (a channels-last image, say)
the whole observation is one frame."""

__all__ = ["MAX_STACK", "UniqueFrames", "as_frames", "check_frame_index", "digests", "frame_shape", "rebuild_stacks",
           "stack_depth", "unique_frames"]


class UniqueFrames(NamedTuple):
    """``frames[frame_index]`` is the frames given; ``keys[u]`` is ``frames[u]``'s digest."""

    frames: np.ndarray
    frame_index: np.ndarray
    keys: list[bytes]


def stack_depth(obs_shape: tuple[int, ...]) -> int:
    """Frames per observation of ``obs_shape``: its first axis for a frame stack, else 1 (the whole observation).

    >>> stack_depth((4, 84, 84)), stack_depth((84, 84, 4)), stack_depth((84, 84)), stack_depth((3, 64, 64))
    (4, 1, 1, 3)
    """
    if len(obs_shape) >= 3 and 2 <= obs_shape[0] <= min(MAX_STACK, obs_shape[1] - 1, obs_shape[2] - 1):
        return int(obs_shape[0])
    return 1


def frame_shape(obs_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one frame of an observation of ``obs_shape`` (``stack_depth`` of them make one)."""
    return tuple(obs_shape[1:]) if stack_depth(obs_shape) > 1 else tuple(obs_shape)


def as_frames(observations: np.ndarray) -> np.ndarray:
    """Observations ``[N, *obs]`` as their frames ``[N * stack_depth, *frame]``, C-contiguous (a digest reads a
    frame's bytes)."""
    return np.ascontiguousarray(observations).reshape(-1, *frame_shape(observations.shape[1:]))


def digests(frames: np.ndarray) -> list[bytes]:
    """The digest of each frame of ``frames`` ``[N, *frame]``: the keys ``unique_frames`` gives the same frames."""
    contiguous = np.ascontiguousarray(frames)
    size = contiguous[0].nbytes if len(contiguous) else 0
    raw = contiguous.data.cast("B") if size else memoryview(b"")  # 1-D slices: cheaper than a view per row
    digest = xxhash.xxh3_128_digest
    return [digest(raw[row * size:(row + 1) * size]) for row in range(len(contiguous))]


def unique_frames(*parts: np.ndarray) -> UniqueFrames:
    """The frames of ``parts`` (each ``[N_i, *frame]``, one frame shape and dtype) as their distinct frames, in the
    order first seen, and the index ``[sum N_i]`` (int32) that rebuilds them, part after part."""
    first_of: dict[bytes, int] = {}
    index = np.empty(sum(len(part) for part in parts), np.int32)
    firsts: list[np.ndarray] = []  # per part, the rows whose frame no earlier row had
    position = 0
    for part in parts:
        rows: list[int] = []
        for row, key in enumerate(digests(part)):
            found = first_of.get(key)
            if found is None:
                found = first_of[key] = len(first_of)
                rows.append(row)
            index[position] = found
            position += 1
        firsts.append(part[rows])
    return UniqueFrames(np.concatenate(firsts), index, list(first_of))


def rebuild_stacks(frames: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The observations ``index`` ``[B, K]`` makes of ``frames`` ``[U, *frame]``: ``[B, K, *frame]`` stacks, or
    ``[B, *frame]`` where K is 1. RecordError if the index does not fit the frames (they came from the wire)."""
    check_frame_index(index, frames)
    stacks = frames[index]
    return stacks[:, 0] if index.shape[1] == 1 else stacks


def check_frame_index(index: np.ndarray, frames: np.ndarray, count: int | None = None) -> None:
    """RecordError unless ``index`` ``[B, K]`` makes observations of ``count`` frames shaped like ``frames``' rows
    (``count``: ``len(frames)`` by default) within a message's size; checked before anything is built from it."""
    count = len(frames) if count is None else count
    if index.dtype.kind not in "iu" or index.ndim != 2 or index.shape[1] < 1 or frames.ndim < 2 \
            or 0 in frames.shape[1:]:
        raise RecordError(f"a frame index {index.dtype}{list(index.shape)} over frames {frames.dtype}"
                          f"{list(frames.shape)} makes no observations: expected an integer [observations, depth >= 1] "
                          f"over frames of one or more pixels")
    if index.size and (int(index.min()) < 0 or int(index.max()) >= count):
        raise RecordError(f"a frame index points outside its {count} frames")
    rebuilt = index.size * math.prod(frames.shape[1:]) * frames.itemsize
    if rebuilt > MAX_DECOMPRESSED_BYTES:
        raise RecordError(f"a frame index would rebuild {rebuilt / 2**20:.0f} MB of observations, over the "
                          f"{MAX_DECOMPRESSED_BYTES / 2**20:.0f} MB a message may hold")
