"""Redis clients' outage window, cut short for a process asked to stop."""

from __future__ import annotations

import time
import types

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


def outage_retry(outage_seconds):
    """The retry a client of ``connect`` gives each of its connections (nothing is reached: the calls are ours)."""
    return connect(f"redis://127.0.0.1:{free_port()}/0", outage_seconds=outage_seconds).connection_pool \
        .connection_kwargs["retry"]


def down():
    raise connection.redis.ConnectionError("down")


@pytest.mark.timeout(30)  # windows that each retry reopened would retry the command forever
def test_a_retry_nested_in_a_commands_retry_ends_with_the_commands_window(own_process_window):
    retry, commands = outage_retry(0.5), []

    def command():  # as redis-py's retried command, which retries a health check's PING inside it
        commands.append(time.monotonic())
        return retry.call_with_retry(down, lambda error: None)

    with pytest.raises(connection.redis.ConnectionError):
        retry.call_with_retry(command, lambda error: None)
    assert len(commands) == 1, "the command gave up with its PING's window, not after a window of its own"
    assert connection._CALL_WINDOW.depth == 0 and connection._CALL_WINDOW.ends_at is None


@pytest.mark.timeout(30)  # a window the reconnect reopened would retry the command forever
def test_a_nested_retry_that_gets_through_keeps_the_commands_window_open(own_process_window):
    retry, commands = outage_retry(0.5), []

    def reconnect():
        return "connected"  # Redis answers again, and still refuses the command (out of memory, say)

    def command():
        commands.append(1)
        retry.call_with_retry(reconnect, lambda error: None)
        down()

    with pytest.raises(connection.redis.ConnectionError):
        retry.call_with_retry(command, lambda error: None)
    assert 2 <= len(commands) < 100, "retried within the command's window, which the reconnect did not reopen"
    assert connection._CALL_WINDOW.ends_at is None, "closed once the command gave up: the next one gets its own"


def test_a_window_of_an_hour_ends_in_a_redis_error_not_an_overflow(own_process_window, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(connection, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(connection.redis.retry, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    retry, failures = outage_retry(3600), []
    with pytest.raises(connection.redis.ConnectionError):
        retry.call_with_retry(down, lambda error: failures.append(error))
    assert len(failures) > 2000 and clock[0] - 1000 >= 3600  # redis-py's 2**failures overflowed at 1,024


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "unix:///nonexistent/redis.sock"])
def test_a_client_sends_large_values_as_they_are_and_small_ones_packed(url):
    """connect's clients pack commands with redis-py's Python packer, whatever hiredis is installed: a large value is
    sent as the very buffer given (hiredis's packer copies it, about 2.3 ms per MB), a small command as one buffer."""
    client = connection.connect(url)
    pooled = client.connection_pool.make_connection()  # made, not connected: packing needs no server
    large = bytes(connection.LARGE_VALUE_BYTES + 1)
    chunks = pooled.pack_command("RPUSH", "queue", large, "é")
    assert any(chunk is large for chunk in chunks), "the large value was copied"
    assert b"".join(chunks) == (b"*4\r\n$5\r\nRPUSH\r\n$5\r\nqueue\r\n$%d\r\n" % len(large) + large
                                + b"\r\n$2\r\n\xc3\xa9\r\n")
    assert len(pooled.pack_command("SET", "key", b"small")) == 1
    batch = pooled.pack_commands([("SET", "a", large), ("GET", "a")])
    assert any(chunk is large for chunk in batch), "a pipeline's large value was copied"
