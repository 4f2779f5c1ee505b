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
    obs, next_obs = atari_like_transitions(steps=200, episode=200, frame=(32, 32))
    frame_store, array_store = FrameStore(600, (4, 32, 32), np.uint8), ArrayStore(600, (4, 32, 32), np.uint8)
    fill(frame_store, obs, next_obs, capacity=600)
    fill(array_store, obs, next_obs, capacity=600)
    unique = len({frame.tobytes() for frame in np.concatenate([obs, next_obs]).reshape(-1, 32, 32)})
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
    ((4, 10, 10), np.uint8, ArrayStore), ((4, 32, 32), np.uint8, FrameStore),  # frames under 1 KB are not worth it
])
def test_images_get_a_frame_store_and_everything_else_arrays(shape, dtype, kind):
    assert type(observation_store(4, shape, dtype)) is kind


def check_holders(store):
    """Every slot's holder count is the rows pointing at it; no held slot is free, none handed out twice."""
    held = np.concatenate([store.obs_frames.ravel(), store.next_frames.ravel()])
    counts = np.bincount(held[held >= 0], minlength=len(store.holders))
    np.testing.assert_array_equal(store.holders, counts)
    assert not set(store.free) & set(np.flatnonzero(counts).tolist()) and len(set(store.free)) == len(store.free)
    assert len(store.slot_of) + len(store.free) == store.used <= store.max_frames


@pytest.mark.parametrize("seed", range(8))
def test_a_pool_that_keeps_growing_while_the_ring_wraps_keeps_every_row(monkeypatch, seed):
    from rqrl.seed import frame_store

    monkeypatch.setattr(frame_store, "_FIRST_POOL_FRAMES", 2)  # grows again and again
    random = np.random.default_rng(seed)
    capacity, shape = int(random.integers(1, 12)), [(2, 3, 3), (1, 3, 3), (3, 3, 2), (3, 4), (4, 5, 5)][seed % 5]
    store, truth = FrameStore(capacity, shape, np.uint8), ArrayStore(capacity, shape, np.uint8)
    palette = random.integers(0, 256, (6, *shape), dtype=np.uint8)  # few distinct values: frames repeat often
    cursor = 0
    for _ in range(60):
        count = int(random.integers(0, capacity + 1))
        obs, next_obs = palette[random.integers(0, 6, count)], palette[random.integers(0, 6, count)]
        obs[::2] = random.integers(0, 256, obs[::2].shape, dtype=np.uint8)  # and some never seen before
        rows = (cursor + np.arange(count)) % capacity
        store.put(rows, obs, next_obs)
        truth.put(rows, obs, next_obs)
        cursor = (cursor + count) % capacity
        check_holders(store)
    filled = np.flatnonzero(store.obs_frames[:, 0] >= 0)
    for got, want in zip(store.get(filled), truth.get(filled), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_put_that_does_not_fit_is_refused_before_anything_changes():
    obs, next_obs = atari_like_transitions(steps=8, envs=1, episode=8)
    store = FrameStore(8, (4, 6, 5), np.uint8)
    store.put(np.arange(8), obs, next_obs)
    with pytest.raises(ValueError, match="expected 2 observations and next ones of shape"):
        store.put(np.arange(2), obs[:3], next_obs[:3])
    check_holders(store)
    got_obs, got_next = store.get(np.arange(8))
    np.testing.assert_array_equal(got_obs, obs)
    np.testing.assert_array_equal(got_next, next_obs)


def message_frames(obs, next_obs):
    """The batch as a SEED message carries it: distinct frames and the [2, N, depth] index."""
    from rqrl.engine.unique_frames import as_frames, unique_frames
    from rqrl.seed.frame_store import TransitionFrames

    found = unique_frames(as_frames(obs), as_frames(next_obs))
    return TransitionFrames(found.frames, found.frame_index.reshape(2, len(obs), -1))


def test_a_messages_frames_are_held_as_its_stacks_would_be():
    """Filled from the messages' distinct frames or from their stacks, two stores hold the same frames and give
    back the same rows, bit for bit, after the ring wraps."""
    obs, next_obs = atari_like_transitions(steps=200)
    from_stacks, from_frames = FrameStore(150, obs.shape[1:], np.uint8), FrameStore(150, obs.shape[1:], np.uint8)
    fill(from_stacks, obs, next_obs, capacity=150)
    cursor = 0
    for start in range(0, len(obs), 17):
        part = slice(start, start + 17)
        rows = (cursor + np.arange(len(obs[part]))) % 150
        from_frames.put(rows, obs[part], next_obs[part], message_frames(obs[part], next_obs[part]))
        cursor = int((cursor + len(rows)) % 150)
    assert from_frames.frames_held == from_stacks.frames_held
    rows = np.arange(150)
    for got, expected in zip(from_frames.get(rows), from_stacks.get(rows), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_frame_no_transition_holds_is_not_kept():
    obs, next_obs = (part[:4] for part in atari_like_transitions(steps=4, envs=1))
    frames = message_frames(obs, next_obs)
    spare = np.full((1, *frames.frames.shape[1:]), 7, np.uint8)  # listed, pointed at by no index entry
    store = FrameStore(4, obs.shape[1:], np.uint8)
    store.put(np.arange(4), obs, next_obs, frames._replace(frames=np.concatenate([frames.frames, spare])))
    held = store.frames_held
    assert held == len(frames.frames)
    store.put(np.arange(4), np.zeros_like(obs), np.zeros_like(next_obs))  # replaced: every frame freed
    assert store.frames_held == 1  # the blank one


@pytest.mark.parametrize("damage", ["index too short", "index outside", "another frame shape"])
def test_frames_that_do_not_fit_are_ignored_and_the_stacks_held(damage):
    obs, next_obs = (part[:4] for part in atari_like_transitions(steps=4, envs=1))
    frames = message_frames(obs, next_obs)
    if damage == "index too short":
        frames = frames._replace(frame_index=frames.frame_index[:, 1:])
    elif damage == "index outside":
        frames = frames._replace(frame_index=frames.frame_index + len(frames.frames))
    else:
        frames = frames._replace(frames=frames.frames[:, :, :-1])
    store = FrameStore(4, obs.shape[1:], np.uint8)
    store.put(np.arange(4), obs, next_obs, frames)
    got_obs, got_next = store.get(np.arange(4))
    np.testing.assert_array_equal(got_obs, obs)
    np.testing.assert_array_equal(got_next, next_obs)
