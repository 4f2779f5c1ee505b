"""Redis restarted mid-run: learner and workers ride it out; a Redis that stays away is a clear error.

The tests here run in-process; those that start processes are in tests/processes/test_connection.py.
"""

from __future__ import annotations

import time

import pytest
import redis

from rqrl import ConfigError, RedisOutOfMemoryError, RedisUnavailableError
from rqrl.engine.connection import check_redis_url, connect, first_contact, redis_errors
from rqrl.engine.server import EmbeddedRedis
from tests.children import free_port
from tests.factories import redis_actors
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def restartable(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))  # on a fixed unix socket: one URL across restarts
    yield server.start()
    server.stop()


def test_a_redis_that_stays_away_ends_the_run_with_a_clear_error(restartable, run_name, caplog):
    actors = redis_actors(restartable.url, run_name, n_local_workers=0, redis_outage_seconds=1)
    actors.start()
    actors.broadcast_updated_policy(actors.policy.state_dict())
    restartable.kill()
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match="stayed unreachable for about 1 s"):
        actors.collect_outputs("cpu")
    assert time.monotonic() - started < 20
    with pytest.raises(RedisUnavailableError):
        actors.broadcast_updated_policy(actors.policy.state_dict())
    actors.stop(timeout=1)  # a warning of what is left, not an error over the one that stopped the run
    assert f"`rqrl stop {run_name} --redis-url URL` deletes them" in caplog.text
    with pytest.raises(RedisUnavailableError) as raised:  # no raw redis error
        actors.queue_size()
    assert isinstance(raised.value.__cause__, redis.ConnectionError)


def test_first_contact_returns_once_redis_answers(redis_url):
    started = time.monotonic()
    first_contact(redis_url, seconds=5)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(("url", "said"), [("localhost:6379", "no scheme"), ("http://localhost:6379", "the scheme http://"),
                                           ("", "no scheme")])
def test_a_url_that_is_no_redis_url_says_what_one_looks_like(url, said):
    with pytest.raises(ConfigError, match=f"has {said}.*use redis://HOST:6379/0"):
        connect(url)
    assert check_redis_url("rediss://:pw@host:6380/1") == "rediss://:pw@host:6380/1"


def test_a_redis_that_stays_full_is_named_as_out_of_memory_with_the_fix(run_name, caplog):
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        patient = connect(server.url, outage_seconds=2)
        started = time.monotonic()
        with pytest.raises(RedisOutOfMemoryError) as raised, redis_errors(server.url, 2):
            patient.set("key", "value")
        assert time.monotonic() - started < 10, "a full Redis is refused after the outage window, not later"
        assert "is out of memory" in str(raised.value) and "maxmemory" in str(raised.value)
        assert sum("is out of memory" in record.getMessage() for record in caplog.records) == 1, "said once, at once"
        client.config_set("maxmemory", 0)
        assert patient.set("key", "value"), "memory is back: writes go through"


@pytest.mark.parametrize("outage_seconds", [1.5, 3.0])
def test_a_command_rides_out_the_window_it_was_given_no_less_and_no_more(restartable, outage_seconds):
    client = connect(restartable.url, outage_seconds=outage_seconds)
    assert client.ping()
    restartable.kill()  # under a live connection: redis-py retries the reconnect inside the command's retry
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.blpop(["nothing"], timeout=1)
    waited = time.monotonic() - started
    assert outage_seconds <= waited < outage_seconds + 2, f"rode out {waited:.1f} s of a {outage_seconds} s window"
    client.close()


def test_a_client_with_nothing_to_reach_rides_out_its_window_too():
    client = connect(f"redis://127.0.0.1:{free_port()}/0", outage_seconds=2)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert 2 <= time.monotonic() - started < 4  # a count of retries made it 0.1-0.5 s


def test_a_service_that_is_no_redis_at_the_url_is_named_as_such():
    """An HTTP server at the URL's port gave "refused a command ... check the URL's user against the ACL rules"."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_as_http() -> None:
        with listener:
            while True:
                try:
                    client, _ = listener.accept()
                except OSError:
                    return
                with client:
                    client.recv(1024)
                    client.sendall(b"<html>not redis</html>\r\n")

    threading.Thread(target=answer_as_http, daemon=True).start()
    url = f"redis://127.0.0.1:{port}/0"
    try:
        with pytest.raises(RedisUnavailableError, match="answered in something other than Redis's protocol"), \
                redis_errors(url, 1):
            redis.Redis.from_url(url, socket_timeout=5).ping()
    finally:
        listener.close()
