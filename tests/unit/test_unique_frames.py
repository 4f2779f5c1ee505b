"""Frames found by their content: distinct frames once, an index that rebuilds them, refusals of a bad index."""

from __future__ import annotations

import numpy as np
import pytest

from rqrl.engine.unique_frames import as_frames, frame_shape, rebuild_stacks, stack_depth, unique_frames
from rqrl.errors import RecordError


def test_parts_share_one_set_of_frames_and_the_index_rebuilds_each_part():
    random = np.random.default_rng(0)
    frames = random.integers(0, 256, (5, 7, 7), dtype=np.uint8)
    first, second = frames[[0, 1, 2, 1]], frames[[2, 3, 4, 0, 4]]
    wide = np.zeros((5, 7, 9), np.uint8)
    wide[:, :, :7] = second
    found = unique_frames(first, wide[:, :, :7])  # a non-contiguous view is read as its frames
    assert not wide[:, :, :7].flags.c_contiguous
    assert len(found.frames) == len(found.keys) == 5
    np.testing.assert_array_equal(found.frames[found.frame_index[:4]], first)
    np.testing.assert_array_equal(found.frames[found.frame_index[4:]], second)
    assert found.frame_index.dtype == np.int32


def test_observations_are_split_into_frames_by_their_stack_depth():
    stacks = np.arange(2 * 4 * 8 * 8, dtype=np.uint8).reshape(2, 4, 8, 8)
    np.testing.assert_array_equal(as_frames(stacks), stacks.reshape(8, 8, 8))
    images = np.zeros((3, 8, 8, 4), np.uint8)  # channels last: each observation one frame
    assert as_frames(images).shape == (3, 8, 8, 4) and frame_shape((8, 8, 4)) == (8, 8, 4)


def test_no_frames_give_an_empty_set_of_their_shape():
    found = unique_frames(np.empty((0, 3, 3), np.uint8))
    assert found.frames.shape == (0, 3, 3) and found.frames.dtype == np.uint8 and len(found.frame_index) == 0


def test_stacks_are_rebuilt_as_stacks_and_single_frames_as_observations():
    frames = np.arange(3 * 4, dtype=np.uint8).reshape(3, 2, 2)
    assert rebuild_stacks(frames, np.array([[0, 1], [1, 2]])).shape == (2, 2, 2, 2)
    np.testing.assert_array_equal(rebuild_stacks(frames, np.array([[2], [0]])), frames[[2, 0]])


@pytest.mark.parametrize("index", [np.array([[0, 3]]), np.array([[-1, 0]]), np.array([0, 1]),
                                   np.array([[0.0, 1.0]])])
def test_an_index_that_does_not_fit_its_frames_is_refused(index):
    with pytest.raises(RecordError, match="frame index"):
        rebuild_stacks(np.zeros((3, 2, 2), np.uint8), index)


@pytest.mark.parametrize(("shape", "depth"), [((4, 84, 84), 4), ((16, 84, 84), 16), ((84, 84, 4), 1),
                                              ((7, 7, 3), 1), ((84, 84), 1), ((33, 84, 84), 1), ((1, 84, 84), 1)])
def test_a_first_axis_shallower_than_the_frame_is_its_stack(shape, depth):
    assert stack_depth(shape) == depth
