"""The replay: ring storage, uniform and prioritized sampling, importance weights."""

from __future__ import annotations

import numpy as np
import pytest

from rqrl.errors import ConfigError
from rqrl.seed.nstep import TransitionBatch
from rqrl.seed.replay import ReplayBuffer, SumTree


def batch(values):
    values = np.asarray(values, np.float32)
    size = len(values)
    return TransitionBatch(values[:, None], np.arange(size), values, np.ones(size, np.float32), values[:, None],
                           np.ones((size, 2), bool))


def test_sum_tree_sums_and_finds():
    tree = SumTree(5)
    tree.set(np.arange(5), np.array([1.0, 2.0, 3.0, 0.0, 4.0]))
    assert tree.total == 10
    assert tree.find(np.array([0.0, 0.99, 1.0, 2.5, 3.0, 5.99, 6.0, 9.99])).tolist() == [0, 0, 1, 1, 2, 2, 4, 4]


def test_ring_overwrites_the_oldest():
    buffer = ReplayBuffer(3, (1,), 2, prioritized=False, seed=0)
    buffer.add(batch([1, 2]))
    buffer.add(batch([3, 4]))
    assert len(buffer) == 3 and buffer.added == 4
    assert sorted(buffer.rewards.tolist()) == [2, 3, 4]
    buffer.add(batch([5, 6, 7, 8]))
    assert sorted(buffer.rewards.tolist()) == [6, 7, 8]


def test_uniform_sampling_only_from_what_is_stored():
    buffer = ReplayBuffer(10, (1,), 2, prioritized=False, seed=0)
    buffer.add(batch([1, 2, 3]))
    sampled, indices, weights = buffer.sample(64)
    assert set(sampled.rewards.tolist()) <= {1, 2, 3} and (weights == 1).all() and indices.max() < 3


def test_prioritized_sampling_follows_priorities_and_weights_the_rare():
    buffer = ReplayBuffer(4, (1,), 2, prioritized=True, alpha=1.0, seed=0)
    buffer.add(batch([0, 1, 2, 3]))
    buffer.update_priorities(np.arange(4), np.array([1.0, 1.0, 1.0, 97.0]))
    sampled, indices, weights = buffer.sample(1000, beta=1.0)
    share = np.mean(indices == 3)
    assert 0.9 < share < 1.0
    assert weights[indices == 3].max() < weights[indices != 3].min()
    assert weights.max() == pytest.approx(1.0)


def test_new_transitions_get_the_largest_priority_and_nan_means_unknown():
    buffer = ReplayBuffer(4, (1,), 2, prioritized=True, alpha=1.0, seed=0)
    buffer.add(batch([0]), priorities=np.array([5.0]))
    buffer.add(batch([1, 2]), priorities=np.array([np.nan, 2.0]))
    assert buffer.tree.leaves(np.arange(3)).tolist() == [5.0, 5.0, 2.0]


def test_empty_replay_refuses_to_sample():
    from rqrl.errors import ConfigError

    with pytest.raises(ConfigError):
        ReplayBuffer(4, (1,), 2).sample(1)


def test_transitions_of_another_shape_are_refused_with_the_fix():
    from rqrl.errors import ConfigError

    buffer = ReplayBuffer(4, (2,), 2)
    with pytest.raises(ConfigError, match=r"obs of shape \(1,\) do not fit the replay's \(2,\).*state_shape"):
        buffer.add(batch([1.0]))


def image_batch(size, value, dtype=np.uint8):
    frames = np.full((size, 4, 8, 8), value, dtype)
    return TransitionBatch(frames, np.zeros(size, np.int64), np.ones(size, np.float32), np.ones(size, np.float32),
                           frames.copy(), np.ones((size, 2), bool))


def test_a_uint8_replay_stores_images_in_a_quarter_of_the_bytes_and_samples_them_as_they_came():
    images = ReplayBuffer(10, (4, 8, 8), 2, prioritized=False, seed=0, obs_dtype=np.uint8)
    floats = ReplayBuffer(10, (4, 8, 8), 2, prioritized=False, seed=0)
    images.add(image_batch(3, 200))
    floats.add(image_batch(3, 200.0, np.float32))
    assert images.observations.nbytes * 4 == floats.observations.nbytes  # 8x8 frames are kept whole
    sampled, _, _ = images.sample(5)
    assert sampled.obs.dtype == sampled.next_obs.dtype == np.uint8 and (sampled.obs == 200).all()


def test_a_replay_of_frame_stacks_holds_each_frame_once_and_samples_them_bit_for_bit():
    frames = np.random.default_rng(0).integers(0, 256, (40, 32, 32), dtype=np.uint8)
    stacks = np.stack([frames[t:t + 4] for t in range(37)])  # one env's 4-frame stacks
    transitions = TransitionBatch(stacks[:-3], np.arange(34), np.arange(34, dtype=np.float32), np.ones(34, np.float32),
                                  stacks[3:], np.ones((34, 2), bool))  # 3-step transitions
    replay = ReplayBuffer(20, (4, 32, 32), 2, prioritized=True, seed=0, obs_dtype=np.uint8)
    for start in range(0, 34, 5):
        replay.add(TransitionBatch(*(field[start:start + 5] for field in transitions)))
    sampled, indices, _ = replay.sample(64)
    steps = sampled.actions  # the action is the step the transition started at
    np.testing.assert_array_equal(sampled.obs, stacks[steps])
    np.testing.assert_array_equal(sampled.next_obs, stacks[steps + 3])
    assert set(steps.tolist()) <= set(range(14, 34))  # the newest 20
    assert replay.observations.frames_held == 26  # frames 14-39: stacks 14-33, and 17-36 three steps on


def test_a_uint8_replay_refuses_float_observations_and_names_the_setting():
    images = ReplayBuffer(10, (4, 8, 8), 2, prioritized=False, seed=0, obs_dtype=np.uint8)
    with pytest.raises(ConfigError, match="float32 observations do not fit a uint8 replay.*state_dtype"):
        images.add(image_batch(2, 0.5, np.float32))
    assert len(images) == 0
