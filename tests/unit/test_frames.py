"""Frame stacks as their unique frames: bit-exact round trips, and what the wire may not hold."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rqrl.engine.frames import (
    FRAMES_METADATA,
    pack_frames,
    pack_series,
    packed_names,
    series_view,
    unpack_frames,
    unpack_series,
)
from rqrl.errors import RecordError


def stacked_series(frames: np.ndarray, depth: int, resets: set[int], stack_axis: int) -> np.ndarray:
    """Observations as a frame-stack wrapper makes them from ``frames`` (one new frame per step, oldest first),
    restarting the stack (every slot the new frame) at the steps in ``resets``."""
    stack = np.repeat(frames[:1], depth, axis=0)
    series = []
    for step, frame in enumerate(frames):
        stack = np.repeat(frame[None], depth, axis=0) if step in resets else np.concatenate([stack[1:], frame[None]])
        series.append(stack if stack_axis == 0 else np.moveaxis(stack, 0, -1))
    return np.stack(series)


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(2, 40), streams=st.integers(1, 3), depth=st.integers(2, 6), height=st.integers(2, 9),
       width=st.integers(2, 9), stack_axis=st.sampled_from([0, -1]), resets=st.sets(st.integers(1, 39), max_size=4),
       seed=st.integers(0, 99))
def test_a_frame_stack_series_round_trips_bit_for_bit(steps, streams, depth, height, width, stack_axis, resets, seed):
    rng = np.random.default_rng(seed)
    inside = {reset for reset in resets if reset < steps}
    series = np.stack([stacked_series(rng.integers(0, 256, (steps, height, width), dtype=np.uint8), depth,
                                      inside, stack_axis) for _ in range(streams)], axis=1)  # [S, L, *obs]
    packed = pack_frames(series)
    if packed is None:  # too few shifted steps: only when resets leave under a quarter shifted
        assert steps - 1 - len(inside) < 0.25 * steps
        return
    assert packed.stack_axis == stack_axis or depth == height == width  # a cube may read as either axis
    assert packed.frame_index.shape == (steps, streams, depth)
    restored = unpack_frames(packed.frames, packed.frame_index, packed.stack_axis)
    assert restored.dtype == series.dtype and restored.flags.c_contiguous
    np.testing.assert_array_equal(restored, series)
    assert len(packed.frames) <= streams * (steps + depth * (1 + len(inside))), "one frame per shifted step"
    view = series_view(packed.frames, np.swapaxes(packed.frame_index, 0, 1), packed.stack_axis)
    if view is not None:  # no reset: every stream's stacks read straight from its frames
        np.testing.assert_array_equal(view, np.swapaxes(series, 0, 1))
    else:
        assert inside or depth == height == width, "a series without resets is viewed"


@pytest.mark.parametrize("stack_axis", [0, -1])
def test_a_series_without_resets_reads_as_a_view_of_its_frames(stack_axis):
    frames = np.random.default_rng(4).integers(0, 256, (2, 12, 7, 5), dtype=np.uint8)
    obs = np.stack([stacked_series(actor, 4, set(), stack_axis) for actor in frames], axis=1)  # [12, 2, *obs]
    arrays: dict[str, np.ndarray] = {}
    metadata = pack_series(arrays, {"obs": obs})
    packed = arrays["obs@frames"]
    assert unpack_series(arrays, metadata, views=True) == ["obs"]
    view = arrays["obs"]
    np.testing.assert_array_equal(view, np.swapaxes(obs, 0, 1))
    assert np.shares_memory(view, packed) and not view.flags.writeable, "no copy, and nobody writes through it"


def test_a_series_with_a_reset_is_gathered_even_where_views_are_asked_for():
    frames = np.random.default_rng(5).integers(0, 256, (2, 12, 6, 6), dtype=np.uint8)
    obs = np.stack([stacked_series(frames[0], 4, set(), 0), stacked_series(frames[1], 4, {5}, 0)], axis=1)
    arrays: dict[str, np.ndarray] = {}
    metadata = pack_series(arrays, {"obs": obs})
    packed = arrays["obs@frames"]
    unpack_series(arrays, metadata, views=True)
    np.testing.assert_array_equal(arrays["obs"], np.swapaxes(obs, 0, 1))
    assert not np.shares_memory(arrays["obs"], packed) and arrays["obs"].flags.c_contiguous


def test_an_atari_sized_series_sends_one_frame_per_step():
    frames = np.random.default_rng(0).integers(0, 256, (65, 84, 84), dtype=np.uint8)
    series = stacked_series(frames, 4, set(), 0)[:, None]
    packed = pack_frames(series)
    assert packed is not None and packed.frames.shape == (68, 84, 84)  # the first stack's 4, then one per step
    assert packed.frames.nbytes / series.nbytes < 0.27


@pytest.mark.parametrize("shape", [(10, 1, 4), (10, 1, 4, 3), (1, 1, 4, 8, 8)])
def test_what_is_no_frame_stack_series_is_not_packed(shape):
    assert pack_frames(np.zeros(shape, np.uint8)) is None  # vectors, single frames, a one-step series


def test_stacks_that_do_not_shift_are_not_packed():
    assert pack_frames(np.random.default_rng(1).integers(0, 256, (20, 2, 4, 8, 8), dtype=np.uint8)) is None


def test_float_frames_round_trip_too():
    frames = np.random.default_rng(2).random((12, 5, 5)).astype(np.float32)  # 100-byte frames: compared bytewise
    series = stacked_series(frames, 3, {6}, 0)[:, None]
    packed = pack_frames(series)
    assert packed is not None
    np.testing.assert_array_equal(unpack_frames(packed.frames, packed.frame_index, 0), series)


@pytest.mark.parametrize("index,axis", [(np.array([[0, 9]]), 0), (np.array([[-1, 0]]), 0),
                                        (np.array([[0.0, 1.0]]), 0), (np.array([0, 1]), 0),
                                        (np.array([[0, 1]]), 1)])
def test_an_index_that_does_not_fit_its_frames_is_a_record_error(index, axis):
    with pytest.raises(RecordError):
        unpack_frames(np.zeros((2, 3, 3), np.uint8), index, axis)


def test_packed_series_come_back_under_their_names_and_plain_ones_are_left_to_the_caller():
    frames = np.random.default_rng(3).integers(0, 256, (2, 9, 6, 6), dtype=np.uint8)
    obs = np.stack([stacked_series(actor, 4, set(), -1) for actor in frames], axis=1)  # [steps, actors, 6, 6, 4]
    vectors = np.zeros((9, 2, 3), np.float32)
    arrays: dict[str, np.ndarray] = {}
    metadata = pack_series(arrays, {"obs/pixels": obs, "obs/state": vectors})
    assert sorted(arrays) == ["obs/pixels@frames", "obs/pixels@index"] and packed_names(metadata) == ["obs/pixels"]
    assert arrays["obs/pixels@index"].shape == (2, 9, 4)
    assert unpack_series(arrays, metadata) == ["obs/pixels"]
    assert list(arrays) == ["obs/pixels"]
    np.testing.assert_array_equal(arrays["obs/pixels"], np.swapaxes(obs, 0, 1))  # each actor's steps back to back


@pytest.mark.parametrize("metadata", [{FRAMES_METADATA: "[1"}, {FRAMES_METADATA: "[1, 2]"},
                                      {FRAMES_METADATA: json.dumps({"missing": 0})},
                                      {FRAMES_METADATA: json.dumps({"obs": "first"})}])
def test_malformed_packing_metadata_is_a_record_error(metadata):
    arrays = {"obs@frames": np.zeros((2, 3, 3), np.uint8), "obs@index": np.zeros((1, 2), np.int32)}
    with pytest.raises(RecordError):
        unpack_series(arrays, metadata)


def test_a_series_sent_both_packed_and_plain_is_a_record_error():
    arrays = {"obs": np.zeros((1, 2, 3, 3), np.uint8), "obs@frames": np.zeros((2, 3, 3), np.uint8),
              "obs@index": np.zeros((1, 2), np.int32)}
    with pytest.raises(RecordError, match="both packed"):
        unpack_series(arrays, {FRAMES_METADATA: json.dumps({"obs": 0})})
