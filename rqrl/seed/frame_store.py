"""The replay's observations: whole arrays, or, for images, their unique frames held once however many
transitions share them.

An Atari transition holds two 4 x 84 x 84 frame stacks (its observation and the one it bootstraps from),
56 KB, though an env step adds one new frame: each stack is the previous one shifted by a frame, and an
n-step transition's next observation is the observation of the transition n steps later. ``FrameStore``
keeps each frame once, keyed by its digest (``rqrl.engine.unique_frames``) and counted: a frame lives while
a stored transition holds it, so a replay of Atari transitions needs about 7 KB each (an eighth), and gives
back every observation bit for bit. Nothing is assumed about the env: a frame no other transition holds (a
reset, a stack of another kind) is simply stored once more.

>>> frames = np.arange(5, dtype=np.uint8)[:, None, None] + np.zeros((5, 3, 3), np.uint8)
>>> obs = np.stack([frames[t:t + 2] for t in range(4)])  # 4 steps of 2-frame stacks
>>> store = FrameStore(capacity=4, obs_shape=(2, 3, 3), dtype=np.uint8)
>>> store.put(np.arange(3), obs[:3], obs[1:])
>>> store.frames_held  # frames 0 to 4, however many of the six stacks hold each
5
>>> bool((store.get(np.array([2]))[1] == obs[3]).all())
True
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import numpy as np

from rqrl.engine.unique_frames import as_frames, digests, frame_shape, stack_depth, unique_frames

MIN_FRAME_BYTES = 1024
"""Smaller frames stay whole arrays: a frame held once costs about 150 bytes of bookkeeping (its holders, its key
in a dict), more than a small frame saves."""
FRAME_OVERHEAD_BYTES = 150
"""About what each pool slot costs beyond its frame: a holder count, a 16-byte key (a bytes object) in a list and in
a dict with its slot (an int object)."""
_FIRST_POOL_FRAMES = 1024

__all__ = ["ArrayStore", "FrameStore", "ObservationStore", "TransitionFrames", "observation_store"]


class TransitionFrames(NamedTuple):
    """Transitions' observations as their distinct frames ``[U, *frame]`` and the index ``[2, N, depth]`` (obs, then
    next obs) that rebuilds them, as SEED's messages carry them: a FrameStore keeps them without looking for
    repeats among every frame of every stack again."""

    frames: np.ndarray
    frame_index: np.ndarray

    def tail(self, start: int) -> TransitionFrames:
        """The frames of the transitions from ``start`` on."""
        return TransitionFrames(self.frames, self.frame_index[:, start:])


class ObservationStore(Protocol):
    """Where the replay keeps each transition's observation and next observation, row by row."""

    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        """Bytes the stored observations take (what the replay's memory grows with)."""

    def put(self, rows: np.ndarray, obs: np.ndarray, next_obs: np.ndarray,
            frames: TransitionFrames | None = None) -> None:
        """Store ``obs[i]`` and ``next_obs[i]`` at row ``rows[i]`` (distinct rows), replacing what was there;
        ``frames``, where given, are the same observations as distinct frames (a store may keep those instead)."""

    def get(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(obs, next_obs)`` of ``rows`` (rows may repeat), as new arrays."""


def observation_store(capacity: int, obs_shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> ObservationStore:
    """A FrameStore for images (uint8 observations of two or more axes whose frames hold MIN_FRAME_BYTES or more),
    an ArrayStore for anything else (vectors are small, and their floats rarely repeat)."""
    dtype = np.dtype(dtype)
    if dtype == np.uint8 and len(obs_shape) >= 2 and math.prod(frame_shape(tuple(obs_shape))) >= MIN_FRAME_BYTES:
        return FrameStore(capacity, obs_shape, dtype)
    return ArrayStore(capacity, obs_shape, dtype)


class ArrayStore:
    """Observations and next observations as two arrays of ``capacity`` rows."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], dtype: np.dtype[Any] | type):
        self.dtype = np.dtype(dtype)
        self.obs = np.zeros((capacity, *obs_shape), self.dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), self.dtype)

    @property
    def nbytes(self) -> int:
        return self.obs.nbytes + self.next_obs.nbytes

    def put(self, rows: np.ndarray, obs: np.ndarray, next_obs: np.ndarray,
            frames: TransitionFrames | None = None) -> None:
        self.obs[rows] = obs
        self.next_obs[rows] = next_obs

    def get(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.obs[rows], self.next_obs[rows]


class FrameStore:
    """Each row's observation and next observation as indices into a pool of unique frames that grows as
    needed; a frame whose last holder is replaced is freed for the next new frame."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], dtype: np.dtype[Any] | type):
        self.dtype = np.dtype(dtype)
        self.obs_shape = tuple(obs_shape)
        self.depth = stack_depth(self.obs_shape)
        self.frame_shape = frame_shape(self.obs_shape)
        self.max_frames = 2 * self.depth * capacity  # no frame shared by any two observations
        index_dtype = np.int32 if self.max_frames < 2**31 else np.int64
        self.obs_frames = np.full((capacity, self.depth), -1, index_dtype)  # -1: an empty row
        self.next_frames = np.full((capacity, self.depth), -1, index_dtype)
        first = min(self.max_frames, _FIRST_POOL_FRAMES)
        self.pool = np.zeros((first, *self.frame_shape), self.dtype)
        self.holders = np.zeros(first, np.int64)
        self.digests: list[bytes | None] = [None] * first
        self.slot_of: dict[bytes, int] = {}
        self.free: list[int] = []
        self.used = 0  # pool slots ever handed out; the free ones among them are in self.free

    @property
    def frames_held(self) -> int:
        """Unique frames the stored observations hold."""
        return len(self.slot_of)

    @property
    def nbytes(self) -> int:
        """The pool's slots handed out so far (freed ones are reused, not returned), with their bookkeeping, and the
        rows' indices."""
        frame_bytes = self.pool.itemsize * int(np.prod(self.frame_shape))
        return self.used * (frame_bytes + FRAME_OVERHEAD_BYTES) + self.obs_frames.nbytes + self.next_frames.nbytes

    def put(self, rows: np.ndarray, obs: np.ndarray, next_obs: np.ndarray,
            frames: TransitionFrames | None = None) -> None:
        """As ObservationStore.put; ``frames`` that fit (this store's frame shape, dtype and depth) are held as they
        are, only their distinct frames looked up, where ``obs`` and ``next_obs`` would be split and every frame
        looked up."""
        shapes_fit = obs.shape[1:] == next_obs.shape[1:] == self.obs_shape
        if not (len(rows) == len(obs) == len(next_obs) and shapes_fit):
            raise ValueError(f"expected {len(rows)} observations and next ones of shape {self.obs_shape}, got "
                             f"{obs.shape} and {next_obs.shape}")  # before anything changes: the store stays whole
        replaced = np.concatenate([self.obs_frames[rows].ravel(), self.next_frames[rows].ravel()])
        self._release(replaced[replaced >= 0])  # first: the pool then never holds more than max_frames
        count = len(rows)
        if frames is not None and self._fits(frames, count):
            used, index = np.unique(frames.frame_index.ravel(), return_inverse=True)  # a frame none holds is not kept
            distinct = frames.frames[used]
            slots = self._hold_distinct(distinct, digests(distinct), index)
        else:
            found = unique_frames(as_frames(np.asarray(obs, self.dtype)), as_frames(np.asarray(next_obs, self.dtype)))
            slots = self._hold_distinct(found.frames, found.keys, found.frame_index)
        self.obs_frames[rows] = slots[:count * self.depth].reshape(count, self.depth)
        self.next_frames[rows] = slots[count * self.depth:].reshape(count, self.depth)

    def _fits(self, frames: TransitionFrames, count: int) -> bool:
        """Whether ``frames`` are ``count`` transitions' frames of this store's kind, their index within them."""
        index = frames.frame_index
        return (frames.frames.dtype == self.dtype and frames.frames.shape[1:] == self.frame_shape
                and index.shape == (2, count, self.depth) and index.dtype.kind in "iu"
                and (index.size == 0 or (int(index.min()) >= 0 and int(index.max()) < len(frames.frames))))

    def get(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shape = (len(rows), *self.obs_shape)
        return self.pool[self.obs_frames[rows]].reshape(shape), self.pool[self.next_frames[rows]].reshape(shape)

    def _hold_distinct(self, frames: np.ndarray, keys: list[bytes], index: np.ndarray) -> np.ndarray:
        """The pool slot of each frame ``frames[index]``, storing those the pool lacks (found by ``keys``, the
        frames' digests); each slot gains a holder per entry of ``index``."""
        unique_slots = np.empty(len(keys), np.int64)
        for position, digest in enumerate(keys):
            slot = self.slot_of.get(digest)
            if slot is None:
                slot = self._allocate()
                self.pool[slot] = frames[position]
                self.slot_of[digest] = slot
                self.digests[slot] = digest
            unique_slots[position] = slot
        slots = unique_slots[index]
        np.add.at(self.holders, slots, 1)
        return slots

    def _release(self, slots: np.ndarray) -> None:
        """Each slot loses a holder per entry; frames left with none are freed."""
        if not len(slots):
            return
        np.subtract.at(self.holders, slots, 1)
        for slot in np.unique(slots[self.holders[slots] == 0]).tolist():
            digest = self.digests[slot]
            assert digest is not None
            del self.slot_of[digest]
            self.digests[slot] = None
            self.free.append(slot)

    def _allocate(self) -> int:
        if self.free:
            return self.free.pop()
        if self.used == len(self.pool):
            self._grow()
        self.used += 1
        return self.used - 1

    def _grow(self) -> None:
        """Half as many slots again (at most ``max_frames``): a pool sized for the worst case would take the
        memory the store saves. The copy needs the old pool and the new one at once, for a moment (a 1M Atari
        replay's last growth: about 4 GB and 6 GB, and a second or two), until the pool stops growing."""
        size = min(self.max_frames, max(len(self.pool) + 1, len(self.pool) * 3 // 2))
        pool = np.empty((size, *self.frame_shape), self.dtype)
        pool[:len(self.pool)] = self.pool
        holders = np.zeros(size, np.int64)
        holders[:len(self.holders)] = self.holders
        self.pool, self.holders = pool, holders
        self.digests.extend([None] * (size - len(self.digests)))
