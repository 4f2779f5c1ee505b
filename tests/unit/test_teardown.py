"""A learner's tear-down in Redis: a short window for an outage, then a warning instead of an error."""

from __future__ import annotations

import logging
import math
import time

import pytest
import redis

from rqrl.engine import teardown
from rqrl.engine.connection import connect, riding_out_briefly
from rqrl.engine.teardown import tearing_down
from tests.children import free_port

GRACE = 0.3


@pytest.fixture
def gone():
    """A client of ``connect`` (a 60 s outage window) for a port where nothing listens, and its URL."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = connect(url, outage_seconds=60)
    yield client, url
    client.close()


def window_end(client: redis.Redis) -> float:
    return client.connection_pool.connection_kwargs["retry"].give_up.at


def test_a_tear_down_rides_out_a_gone_redis_for_its_grace_then_warns_what_is_left(gone, monkeypatch, caplog):
    client, url = gone
    monkeypatch.setattr(teardown, "SHUTDOWN_REDIS_GRACE_SECONDS", GRACE)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "rqrl.engine.teardown"), tearing_down(client, url, "run-a"):
        client.set("rqrl:run-a:stopped", 1)
        pytest.fail("the command should have failed")
    assert time.monotonic() - started < GRACE + 3, "gave up after the tear-down's grace, not the 60 s window"
    [record] = [record for record in caplog.records if record.name == "rqrl.engine.teardown"]
    message = record.getMessage()
    assert "run run-a:" in message and "keys and queued jobs are left there" in message
    assert "`rqrl stop run-a --redis-url URL`" in message and url in message
    assert window_end(client) == math.inf, "after the tear-down the client rides out outages again"


def test_the_learners_own_redis_gone_says_nothing_is_left(gone, monkeypatch, caplog):
    client, url = gone
    monkeypatch.setattr(teardown, "SHUTDOWN_REDIS_GRACE_SECONDS", GRACE)
    with caplog.at_level(logging.WARNING, "rqrl.engine.teardown"), tearing_down(client, url, "run-b", embedded=True):
        client.get("anything")
    assert "nothing of the run is left" in caplog.text and "rqrl stop" not in caplog.text


@pytest.mark.parametrize("error", [redis.ResponseError("WRONGTYPE Operation against a key"),
                                   redis.AuthenticationError("invalid username-password pair"), ValueError("bug")])
def test_errors_that_are_no_outage_reach_the_caller(gone, error, caplog):
    client, url = gone
    with pytest.raises(type(error)), tearing_down(client, url, "run-c"):
        raise error
    assert "left there" not in caplog.text
    assert window_end(client) == math.inf


def test_a_brief_window_ends_with_its_block_even_on_an_error(gone):
    client, _ = gone
    with pytest.raises(KeyboardInterrupt), riding_out_briefly(client, 5.0):
        assert window_end(client) < time.monotonic() + 5.1
        raise KeyboardInterrupt
    assert window_end(client) == math.inf

