"""The GIL switch interval of actor processes (the actor threads themselves: tests/integration/test_seed_actor.py)."""

from __future__ import annotations

import sys

import pytest

from rqrl.engine.screen import MAX_ENTRY_BYTES
from rqrl.errors import RecordError
from rqrl.seed.actor import (
    SWITCH_INTERVAL,
    TRANSITIONS_PER_MESSAGE,
    check_message_size,
    short_switch_interval,
    transitions_per_message,
)


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
