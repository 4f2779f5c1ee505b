"""Redis clients' outage window, cut short for a process asked to stop."""

from __future__ import annotations

import time

import pytest

from rqrl.engine import connection
from rqrl.engine.connection import (
    connect,
    riding_out_briefly,
    riding_out_briefly_in_process,
    stop_riding_out_in_process,
)
from tests.children import free_port


@pytest.fixture
def own_process_window(monkeypatch):
    """This test's process-wide window, so the test session's clients keep theirs."""
    monkeypatch.setattr(connection, "_PROCESS_GIVE_UP", connection._GiveUp())


def test_a_process_asked_to_stop_cuts_every_clients_outage_window_short(own_process_window):
    made_before = connect(f"redis://127.0.0.1:{free_port()}/0", outage_seconds=60)
    stop_riding_out_in_process(0.3)
    made_after = connect(f"redis://127.0.0.1:{free_port()}/0", outage_seconds=60)
    for client in (made_before, made_after):
        started = time.monotonic()
        with pytest.raises(connection.redis.ConnectionError):
            client.ping()
        assert time.monotonic() - started < 3, "gave up within the process's grace, not the 60 s window"
        client.close()


def test_a_tear_down_after_the_process_was_asked_to_stop_still_gets_its_grace(own_process_window):
    client = connect(f"redis://127.0.0.1:{free_port()}/0", outage_seconds=60)
    stop_riding_out_in_process(0.0)  # the signal came first: on their own, commands now fail at once
    asked_at = connection._PROCESS_GIVE_UP.at
    started = time.monotonic()
    with pytest.raises(connection.redis.ConnectionError), riding_out_briefly(client, 1.0):
        client.ping()
    assert 0.5 < time.monotonic() - started < 4, "rode out about the tear-down's grace"
    assert connection._PROCESS_GIVE_UP.at == asked_at, "and the process's window is as the signal left it"
    client.close()


def test_a_learner_stopping_in_a_process_that_goes_on_cuts_the_window_for_the_block_only(own_process_window):
    client = connect(f"redis://127.0.0.1:{free_port()}/0", outage_seconds=60)
    started = time.monotonic()
    with pytest.raises(connection.redis.ConnectionError), riding_out_briefly_in_process(0.5):
        client.ping()  # as a sampler's call in flight on another thread would
    assert time.monotonic() - started < 3, "gave up within the block's grace, not the 60 s window"
    assert connection._PROCESS_GIVE_UP.at == float("inf"), "and the next run in this process rides out outages again"
    client.close()


def test_a_signal_inside_the_block_keeps_the_process_stopping(own_process_window):
    with riding_out_briefly_in_process(30):
        stop_riding_out_in_process(0.0)  # SIGTERM while the learner waited for its threads
    assert connection._PROCESS_GIVE_UP.at < time.monotonic(), "the signal's cut stands after the block"
