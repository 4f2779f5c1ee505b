"""The GIL switch interval of actor processes and their transition messages (the actor threads themselves:
tests/integration/test_seed_actor.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rqrl.engine.screen import MAX_ENTRY_BYTES
from rqrl.errors import RecordError
from rqrl.seed.actor import (
    SWITCH_INTERVAL,
    TRANSITIONS_PER_MESSAGE,
    check_message_size,
    decode_transitions,
    encode_transitions,
    short_switch_interval,
    transitions_per_message,
)
from rqrl.seed.nstep import TransitionBatch
from rqrl.seed.store import seal, unseal


def test_the_switch_interval_is_short_while_any_actor_runs_and_restored_after_the_last():
    before = sys.getswitchinterval()
    with short_switch_interval():
        with short_switch_interval():  # a second Actor in the same process
            assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL)
        assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL)  # the first still runs
    assert sys.getswitchinterval() == before


def test_messages_of_large_observations_hold_fewer_transitions_and_one_too_large_is_refused():
    atari = 4 * 84 * 84
    assert transitions_per_message(atari) == TRANSITIONS_PER_MESSAGE
    assert transitions_per_message(4 * 2**20) == MAX_ENTRY_BYTES // (12 * 2**20)  # 5 of 4 MB observations
    assert transitions_per_message(64 * 2**20) == 1
    check_message_size(b"x" * MAX_ENTRY_BYTES, 1)
    with pytest.raises(RecordError, match=r"a message of 1 transition\(s\) is 64.0 MB, over the 64 MB the trainer"):
        check_message_size(b"x" * (MAX_ENTRY_BYTES + 1), 1)


KEY = b"k" * 32


def frame_stack_transitions(steps=12, depth=4, n=3, seed=0):
    """One env's ``steps`` n-step transitions of ``depth``-frame stacks of random 6x5 frames."""
    frames = np.random.default_rng(seed).integers(0, 256, (steps + n + depth, 6, 5), dtype=np.uint8)
    stacks = np.stack([frames[t:t + depth] for t in range(steps + n)])
    return TransitionBatch(stacks[:steps], np.arange(steps), np.ones(steps, np.float32), np.ones(steps, np.float32),
                           stacks[n:n + steps], np.ones((steps, 2), bool))


def test_a_message_of_frame_stacks_carries_each_frame_once_and_decodes_bit_for_bit():
    batch = frame_stack_transitions()
    blob = encode_transitions(batch, KEY, [1.5], sender="a", sequence=7)
    arrays, _ = unseal(blob, KEY)
    assert "obs" not in arrays and arrays["frames"].shape == (12 + 3 + 3, 6, 5)  # 18 distinct of 96 frames
    message = decode_transitions(blob, KEY)
    for name in TransitionBatch._fields:
        np.testing.assert_array_equal(getattr(message.batch, name), getattr(batch, name))
    assert message.batch.obs.dtype == np.uint8 and message.sequence == 7 and message.episode_returns.tolist() == [1.5]
    assert message.frames is not None and len(message.frames.frames) == 18  # what the replay keeps as they are
    np.testing.assert_array_equal(message.frames.frames[message.frames.frame_index[1]], batch.next_obs)
    vectors = batch._replace(obs=np.zeros((12, 4), np.float32), next_obs=np.ones((12, 4), np.float32))
    assert decode_transitions(encode_transitions(vectors, KEY), KEY).frames is None


@pytest.mark.parametrize("obs_shape", [(6, 5), (6, 5, 3)])
def test_single_frame_images_go_as_frames_too_and_vectors_as_they_are(obs_shape):
    random = np.random.default_rng(1)
    images = random.integers(0, 256, (4, *obs_shape), dtype=np.uint8)
    batch = TransitionBatch(images[:3], np.arange(3), np.ones(3, np.float32), np.ones(3, np.float32), images[1:],
                            np.ones((3, 2), bool))
    assert len(unseal(encode_transitions(batch, KEY), KEY)[0]["frames"]) == 4  # obs and next obs share three
    np.testing.assert_array_equal(decode_transitions(encode_transitions(batch, KEY), KEY).batch.next_obs, images[1:])
    vectors = batch._replace(obs=np.zeros((3, 4), np.float32), next_obs=np.ones((3, 4), np.float32))
    assert "obs" in unseal(encode_transitions(vectors, KEY), KEY)[0]


def test_a_message_whose_frame_index_does_not_fit_is_refused():
    arrays, metadata = unseal(encode_transitions(frame_stack_transitions(), KEY), KEY)
    for index in (arrays["frame_index"] + 100, arrays["frame_index"][0], arrays["frame_index"].astype(np.float32)):
        blob = seal({**arrays, "frame_index": index}, metadata, KEY)
        with pytest.raises(RecordError, match="frame index"):
            decode_transitions(blob, KEY)
    missing = seal({name: array for name, array in arrays.items() if name != "actions"}, metadata, KEY)
    with pytest.raises(RecordError, match=r"lacks its \['actions'\] arrays"):
        decode_transitions(missing, KEY)
    short = seal({**arrays, "rewards": arrays["rewards"][:-1]}, metadata, KEY)
    with pytest.raises(RecordError, match="arrays differ in length"):
        decode_transitions(short, KEY)
    index = arrays["frame_index"]
    fewer = seal({**arrays, "frame_index": index[:, :-1]}, metadata, KEY)  # stacks for 11 of 12 transitions
    with pytest.raises(RecordError, match=r"expected \[2, 12 transitions"):
        decode_transitions(fewer, KEY)


def test_a_message_that_would_rebuild_more_than_a_message_may_hold_is_refused():
    frames = np.zeros((1, 84, 84), np.uint8)
    index = np.zeros((2, 20_000, 4), np.int8)  # a few hundred bytes on the wire, 538 MB per stack rebuilt
    batch = {"actions": np.zeros(20_000, np.int64), "rewards": np.zeros(20_000, np.float32),
             "discounts": np.zeros(20_000, np.float32), "next_masks": np.ones((20_000, 2), bool),
             "episode_returns": np.zeros(0), "frames": frames, "frame_index": index}
    with pytest.raises(RecordError, match="would rebuild 538 MB of observations, over the 512 MB"):
        decode_transitions(seal(batch, {}, KEY), KEY)
