"""Frame-stack rollouts gathered on the device from their frames: the same batch, bit for bit, as np.stack."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from rqrl.engine.codec import records_key
from rqrl.engine.frames import series_view
from rqrl.engine.observations import stack_to
from rqrl.engine.policy import make_act_function
from rqrl.engine.stack_gather import gather_series_to, overlapping_frames
from rqrl.maze.group_records import decode_signed_entry, encode_signed_steps
from rqrl.maze.inbox import probe_spec
from rqrl.maze.records import batch_records
from rqrl.maze.rollout import ActorGroup
from tests import fixtures

RUN = "run-a"
KEY = records_key("secret", RUN)


def streams_of_frames(streams: int, steps: int, depth: int, frame: tuple[int, ...] = (6, 5), seed: int = 0):
    """``[streams, steps, depth, *frame]`` read-only overlapping views, as the learner decodes packed frames."""
    run = steps + depth - 1
    frames = np.random.default_rng(seed).integers(0, 256, (streams * run, *frame), dtype=np.uint8)
    index = np.arange(streams)[:, None, None] * run + np.arange(steps)[:, None] + np.arange(depth)
    view = series_view(frames, index, 0)
    assert view is not None
    return view


def test_an_overlapping_series_is_its_frames_back_to_back():
    view = streams_of_frames(2, 7, 4)
    frames = overlapping_frames(view[1])
    assert frames is not None and frames.shape == (10, 6, 5) and not frames.flags.writeable
    assert all((frames[t:t + 4] == view[1, t]).all() for t in range(7))


@pytest.mark.parametrize("make", [
    lambda view: np.ascontiguousarray(view[0]),  # a stack of its own per step
    lambda view: np.moveaxis(view[0], 1, -1),  # channels last
    lambda view: view[0, :, :1],  # one-frame "stacks"
    lambda view: view[0, :, :, :, ::2],  # frames not contiguous
    lambda view: view[0, ::2],  # every other step: stacks two frames apart
])
def test_other_layouts_are_not_taken_for_overlapping_frames(make):
    assert overlapping_frames(make(streams_of_frames(1, 8, 4))) is None


@pytest.mark.parametrize("mixed", [False, True])
def test_the_gathered_batch_is_np_stack_bit_for_bit(mixed):
    view = streams_of_frames(5, 9, 4)
    series = [view[i] if not (mixed and i % 2) else np.ascontiguousarray(view[i]) for i in range(5)]
    gathered = gather_series_to(series, "cpu")
    assert gathered is not None and gathered.dtype == torch.uint8
    expected = np.stack(series, axis=1)
    assert gathered.shape == expected.shape and np.array_equal(gathered.numpy(), expected)


@pytest.mark.parametrize("series", [
    [np.zeros((9, 4, 6, 5), np.uint8)] * 2,  # nothing overlaps: stacked as they are
    [np.zeros((9, 4), np.float32)] * 2,  # not frame stacks
    [],
    [[[[1]]]] * 2,  # not arrays
])
def test_series_without_overlapping_frames_are_left_to_np_stack(series):
    assert gather_series_to(series, "cpu") is None


def test_series_of_different_shapes_are_left_to_np_stack():
    view = streams_of_frames(2, 9, 4)
    assert gather_series_to([view[0], view[1, :8]], "cpu") is None


def test_stack_to_on_the_cpu_stacks_overlapping_views_as_np_stack_does():
    view = streams_of_frames(3, 9, 4)
    stacked = stack_to([view[0], view[1], view[2]], 1, "cpu")
    assert np.array_equal(stacked.numpy(), np.stack(list(view), axis=1))


def frame_stack_records(episode_steps: int, rollout_id: int = 1):
    """A real group of frame-stack envs whose episodes are ``episode_steps`` long, sent as unique frames and decoded
    as the learner decodes it."""
    make_env = functools.partial(fixtures.make_frame_stack_env, episode_steps, episode_steps=episode_steps)
    group = ActorGroup(make_env, [2, 3, 4], [5, 6, 7], [8, 9, 10], 16)
    act = make_act_function(fixtures.FramePolicy(), group.action_space)
    for earlier in range(rollout_id):
        group.run(act, earlier, 1, cut_at_end=False)
    rollout = group.run_group(act, rollout_id, 4, cut_at_end=False, worker="w7")
    records = rollout.records()
    continues = [record.continues_previous for record in records]
    blob = encode_signed_steps(rollout.steps, rollout.actor_ids, continues, 4, rollout_id, "w7", RUN, KEY)
    spec = probe_spec(make_env(), act, n_steps=16, n_actors=11)
    entry = decode_signed_entry(blob, RUN, KEY, spec)
    assert entry.problem is None
    return entry.records


def test_rollouts_with_resets_inside_come_as_whole_stacks():
    records = frame_stack_records(episode_steps=7)
    assert all(overlapping_frames(record.obs) is None for record in records)
    assert gather_series_to([record.obs for record in records], "cpu") is None


def test_decoded_rollouts_of_frame_stacks_are_gathered_from_their_frames():
    records = frame_stack_records(episode_steps=100)  # no reset inside the rollouts: the learner's common case
    assert all(overlapping_frames(record.obs) is not None for record in records)
    gathered = gather_series_to([record.obs for record in records], "cpu")
    assert gathered is not None
    assert np.array_equal(gathered.numpy(), np.stack([record.obs for record in records], axis=1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("episode_steps", [100, 7])  # 7: resets inside every rollout, stacks sent whole
def test_cuda_batches_of_decoded_frame_stacks_equal_the_cpu_batch(episode_steps):
    records = frame_stack_records(episode_steps)
    on_gpu, on_cpu = batch_records(records, "cuda"), batch_records(records, "cpu")
    assert on_gpu.obs.device.type == "cuda"
    assert torch.equal(on_gpu.obs.cpu(), on_cpu.obs)
    assert torch.equal(on_gpu.next_obs.cpu(), on_cpu.next_obs)
