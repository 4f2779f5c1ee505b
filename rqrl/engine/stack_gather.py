"""Frame-stack rollouts batched on an accelerator from their frames: a batch of Atari rollouts crosses to the GPU as a
quarter of its bytes, and the learner's CPU lays nothing out.

A rollout decoded from packed frames (``rqrl.engine.frames.series_view``) holds its ``[T, K, *frame]`` stacks as a
view whose stacks overlap: step t's K frames begin one frame after step t - 1's, so the rollout is T + K - 1 frames
back to back. ``gather_series_to`` moves each such rollout's frames once and gathers the time-major
``[T, B, K, *frame]`` batch on the device, bit for bit what ``np.stack(series, axis=1)`` gives. Measured on the
device machine (14 workers of 84x84 stacks, BENCHMARKS.md): ``np.stack`` of 28 KB per step was a quarter of the
learner's CPU, and the copy to the GPU moved 4x the bytes.

>>> frames = np.arange(5, dtype=np.uint8)[:, None, None] * np.ones((5, 2, 2), np.uint8)
>>> series = np.lib.stride_tricks.as_strided(frames, (3, 3, 2, 2), (4, 4, 2, 1))  # 3 steps of 3-frame stacks
>>> overlapping_frames(series).shape
(5, 2, 2)
>>> batch = gather_series_to([series, np.ascontiguousarray(series)], "cpu")
>>> batch.shape, bool((batch.numpy() == np.stack([series, series], axis=1)).all())
(torch.Size([3, 2, 3, 2, 2]), True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

MIN_SERIES_DIMS = 4
"""``[T, K, height, width]`` at the least: a series of stacks of frames with two axes or more."""

__all__ = ["gather_series_to", "overlapping_frames"]


def overlapping_frames(series: np.ndarray) -> np.ndarray | None:
    """The ``[T + K - 1, *frame]`` frames that ``series`` ``[T, K, *frame]`` views, read-only, when its stacks overlap
    one frame apart (each frame C-contiguous); None for any other layout (a contiguous array, a channels-last
    view)."""
    if series.ndim < MIN_SERIES_DIMS or series.shape[0] == 0 or series.shape[1] < 2:
        return None
    steps, depth, *frame = series.shape
    frame_bytes = math.prod(frame) * series.itemsize
    if series.strides[:2] != (frame_bytes, frame_bytes) or not series[0, 0].flags.c_contiguous:
        return None
    return np.lib.stride_tricks.as_strided(series, (steps + depth - 1, *frame), (frame_bytes, *series.strides[2:]),
                                           writeable=False)


def gather_series_to(series: Sequence[np.ndarray], device: torch.device | str) -> torch.Tensor | None:
    """``np.stack(series, axis=1)`` as a tensor on ``device``, moved as the frames of the rollouts whose stacks
    overlap (``overlapping_frames``) and the whole stacks of the others, then gathered there; None when no rollout
    overlaps or the rollouts differ in shape or dtype (the caller stacks them as they are)."""
    first = series[0] if series else None
    if (not isinstance(first, np.ndarray) or first.ndim < MIN_SERIES_DIMS
            or any(not isinstance(array, np.ndarray) or array.shape != first.shape or array.dtype != first.dtype
                   for array in series)):
        return None
    frames = [overlapping_frames(array) for array in series]
    if all(found is None for found in frames):
        return None
    steps, depth, *frame = first.shape
    blocks = [found if found is not None else array.reshape(steps * depth, *frame)
              for array, found in zip(series, frames, strict=True)]
    moved = torch.from_numpy(np.concatenate(blocks)).to(device)
    starts = np.cumsum([0] + [len(block) for block in blocks[:-1]])
    step_stride = np.array([1 if found is not None else depth for found in frames])
    index = (torch.as_tensor(starts, device=moved.device)[None, :, None]
             + torch.arange(steps, device=moved.device)[:, None, None]
             * torch.as_tensor(step_stride, device=moved.device)[None, :, None]
             + torch.arange(depth, device=moved.device)[None, None, :])
    return moved.index_select(0, index.reshape(-1)).reshape(steps, len(series), depth, *frame)
