"""The replay's observation stores: image frames held once, given back bit for bit, freed with their last holder."""

from __future__ import annotations

import numpy as np
import pytest

from rqrl.seed.frame_store import ArrayStore, FrameStore, observation_store


def atari_like_transitions(steps, envs=3, depth=4, n=3, episode=40, frame=(6, 5), seed=0):
    """``(obs, next_obs)`` of n-step transitions of ``envs`` interleaved envs stepping random frames, each a
    ``depth`` stack that shifts by one frame a step and starts over (all frames the first) at every reset."""
    random = np.random.default_rng(seed)
    obs, next_obs = [], []
    for _ in range(envs):
        stacks = []
        for _ in range(-(-steps // episode)):  # whole episodes
            frames = random.integers(0, 256, (episode + 1, *frame), dtype=np.uint8)
            padded = np.concatenate([np.repeat(frames[:1], depth - 1, 0), frames])
            stacks += [[padded[t:t + depth] for t in range(episode + 1)]]
        for episode_stacks in stacks:
            for t in range(len(episode_stacks) - 1):
                obs.append(episode_stacks[t])
                next_obs.append(episode_stacks[min(t + n, len(episode_stacks) - 1)])
    order = np.argsort(np.arange(len(obs)) % (len(obs) // envs), kind="stable")  # interleave the envs
    return np.stack(obs)[order], np.stack(next_obs)[order]


def fill(store, obs, next_obs, capacity, batch=17):
    """Put the transitions in batches into a ring of ``capacity`` rows; the rows' last obs and next obs."""
    held_obs = np.zeros((capacity, *obs.shape[1:]), obs.dtype)
    held_next = np.zeros_like(held_obs)
    cursor = 0
    for start in range(0, len(obs), batch):
        rows = (cursor + np.arange(len(obs[start:start + batch]))) % capacity
        store.put(rows, obs[start:start + batch], next_obs[start:start + batch])
        held_obs[rows], held_next[rows] = obs[start:start + batch], next_obs[start:start + batch]
        cursor = int((cursor + len(rows)) % capacity)
    return held_obs, held_next


def test_a_frame_store_gives_back_every_row_bit_for_bit_after_the_ring_wraps():
    obs, next_obs = atari_like_transitions(steps=200)
    store = FrameStore(150, obs.shape[1:], np.uint8)
    held_obs, held_next = fill(store, obs, next_obs, capacity=150)
    rows = np.random.default_rng(1).integers(0, 150, 500)
    got_obs, got_next = store.get(rows)
    np.testing.assert_array_equal(got_obs, held_obs[rows])
    np.testing.assert_array_equal(got_next, held_next[rows])
    assert got_obs.dtype == np.uint8 and got_obs.shape == (500, 4, 6, 5)


def test_each_frame_is_held_once_however_many_stacks_hold_it():
    obs, next_obs = atari_like_transitions(steps=200, episode=200, frame=(12, 10))
    frame_store, array_store = FrameStore(600, (4, 12, 10), np.uint8), ArrayStore(600, (4, 12, 10), np.uint8)
    fill(frame_store, obs, next_obs, capacity=600)
    fill(array_store, obs, next_obs, capacity=600)
    unique = len({frame.tobytes() for frame in np.concatenate([obs, next_obs]).reshape(-1, 12, 10)})
    assert frame_store.frames_held == unique <= len(obs) + 3 * 4  # one new frame a step, plus each env's end
    assert frame_store.nbytes * 6 < array_store.nbytes  # 8x for the frames, less the rows' indices


def test_frames_are_freed_with_their_last_holder_and_the_pool_stops_growing():
    obs, next_obs = atari_like_transitions(steps=2000, episode=50, seed=2)
    store = FrameStore(300, (4, 6, 5), np.uint8)
    fill(store, obs[:3000], next_obs[:3000], capacity=300)
    pool_after_first = store.used
    fill(store, obs[3000:], next_obs[3000:], capacity=300)
    assert store.used <= pool_after_first + 4 * 3  # slots are reused, not added, as the ring wraps
    rows = np.arange(300)
    live = np.unique(np.concatenate([store.obs_frames[rows].ravel(), store.next_frames[rows].ravel()]))
    assert store.frames_held == len(live)  # nothing held beyond the stored rows' frames
    assert (store.holders[live] > 0).all() and store.holders.sum() == 2 * 4 * 300


def test_a_pool_grows_past_its_first_slots_and_keeps_what_it_held():
    obs, next_obs = atari_like_transitions(steps=800, envs=2, episode=400, seed=3)
    store = FrameStore(len(obs), (4, 6, 5), np.uint8)
    held_obs, held_next = fill(store, obs, next_obs, capacity=len(obs), batch=300)
    assert len(store.pool) > 1024
    got_obs, got_next = store.get(np.arange(len(obs)))
    np.testing.assert_array_equal(got_obs, held_obs)
    np.testing.assert_array_equal(got_next, held_next)


def test_a_channels_last_image_is_one_frame_shared_by_obs_and_next_obs():
    frames = np.random.default_rng(4).integers(0, 256, (11, 7, 7, 3), dtype=np.uint8)
    store = FrameStore(10, (7, 7, 3), np.uint8)
    assert store.depth == 1
    store.put(np.arange(10), frames[:-1], frames[1:])
    assert store.frames_held == 11
    got_obs, got_next = store.get(np.arange(10))
    np.testing.assert_array_equal(got_obs, frames[:-1])
    np.testing.assert_array_equal(got_next, frames[1:])


@pytest.mark.parametrize(("shape", "dtype", "kind"), [
    ((4, 84, 84), np.uint8, FrameStore), ((84, 84), np.uint8, FrameStore), ((8,), np.uint8, ArrayStore),
    ((4, 84, 84), np.float32, ArrayStore), ((4,), np.float32, ArrayStore),
])
def test_images_get_a_frame_store_and_everything_else_arrays(shape, dtype, kind):
    assert type(observation_store(4, shape, dtype)) is kind
