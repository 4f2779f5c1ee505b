"""EmbeddedRedis: a private redis-server on a unix socket that leaves nothing behind.

The tests here start processes; the in-process ones are in tests/integration/test_server.py.
"""

from __future__ import annotations

import shutil

import pytest
import redis

from rqrl.engine.server import EmbeddedRedis, find_redis_server
from rqrl.errors import RedisServerNotFoundError
from tests.integration.test_server import REDIS_SERVER, needs_redis_server  # noqa: F401 - shared with the in-process tests

pytestmark = pytest.mark.timeout(60)


def test_a_binary_that_exits_at_start_is_reported_and_cleaned_up(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(RedisServerNotFoundError, match="exited at start"):
        EmbeddedRedis(executable="/bin/false").start()
    assert list(tmp_path.iterdir()) == []


def test_a_binary_that_exits_after_a_moment_is_reported_within_the_startup_timeout(tmp_path):
    # the startup loop's PING must not retry: redis-py's default backoff (seconds) outlasted short timeouts
    late_exit = tmp_path / "late-exit"
    late_exit.write_text("#!/bin/sh\nsleep 0.3\necho 'bad config' >&2\nexit 1\n")
    late_exit.chmod(0o755)
    with pytest.raises(RedisServerNotFoundError, match="exited at start: bad config"):
        EmbeddedRedis(executable=str(late_exit), startup_timeout=2.0).start()


@needs_redis_server
def test_an_explicit_redis_server_path_is_used(tmp_path):
    copy = tmp_path / "my-redis-server"
    shutil.copy(REDIS_SERVER, copy)
    copy.chmod(0o755)
    assert find_redis_server(str(copy)) == str(copy)
    with EmbeddedRedis(str(copy)) as server, redis.Redis.from_url(server.url) as client:
        assert server.executable == str(copy)
        assert client.ping()
