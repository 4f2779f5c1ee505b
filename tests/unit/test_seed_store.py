"""rqrl.seed.store's sealed messages: signed, and compressed when they carry images."""

from __future__ import annotations

import numpy as np
import pytest

from rqrl.engine.codec import TAG_SIZE
from rqrl.engine.compression import COMPRESSED_MAGIC
from rqrl.errors import SignatureError
from rqrl.seed.store import seal, unseal

KEY = b"k" * 32


def test_a_request_of_frame_stacks_is_compressed_and_round_trips():
    frame = np.zeros((84, 84), np.uint8)
    frame[30:40, 5:8] = 200
    obs = np.stack([np.stack([np.roll(frame, row + shift, axis=0) for shift in range(4)]) for row in range(8)])
    blob = seal({"obs": obs}, {"id": "3"}, KEY)
    assert blob[TAG_SIZE:].startswith(COMPRESSED_MAGIC) and len(blob) < obs.nbytes / 20
    arrays, metadata = unseal(blob, KEY)
    np.testing.assert_array_equal(arrays["obs"], obs)
    assert metadata == {"id": "3"}


def test_vector_observations_go_as_they_are():
    obs = np.random.default_rng(0).random((8, 4)).astype(np.float32)
    blob = seal({"obs": obs}, {}, KEY)
    assert not blob[TAG_SIZE:].startswith(COMPRESSED_MAGIC)
    np.testing.assert_array_equal(unseal(blob, KEY)[0]["obs"], obs)


def test_a_compressed_message_is_verified_before_it_is_decompressed():
    blob = bytearray(seal({"obs": np.zeros((2, 4, 84, 84), np.uint8)}, {}, KEY))
    blob[-3] ^= 1
    with pytest.raises(SignatureError):
        unseal(bytes(blob), KEY)
