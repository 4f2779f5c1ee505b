"""The GIL switch interval of actor processes (the actor threads themselves: tests/integration/test_seed_actor.py)."""

from __future__ import annotations

import sys

from rqrl.seed.actor import SWITCH_INTERVAL, short_switch_interval


def test_the_switch_interval_is_short_while_any_actor_runs_and_restored_after_the_last():
    before = sys.getswitchinterval()
    with short_switch_interval():
        with short_switch_interval():  # a second Actor in the same process
            assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL)
        assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL)  # the first still runs
    assert sys.getswitchinterval() == before
