"""EmbeddedRedis: a private redis-server on a unix socket that leaves nothing behind.

The tests here start processes; the in-process ones are in tests/integration/test_server.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from rqrl.engine.server import EmbeddedRedis, find_redis_server
from rqrl.errors import RedisServerNotFoundError
from tests.children import REPO_ROOT, alive, worker_env
from tests.integration.test_server import REDIS_SERVER, needs_redis_server  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until

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


KILLED_LEARNER = """
import sys, threading
from rqrl.engine.server import EmbeddedRedis
servers = []
starter = threading.Thread(target=lambda: servers.append(EmbeddedRedis().start()))  # no parent-death signal
starter.start()
starter.join()
print(servers[0].process.pid, servers[0].directory, flush=True)
sys.stdin.read()
"""


@needs_redis_server
def test_a_killed_learner_s_folder_and_redis_go_at_the_next_start(tmp_path, monkeypatch):
    environment = worker_env(TMPDIR=str(tmp_path))
    learner = subprocess.Popen([sys.executable, "-c", KILLED_LEARNER], env=environment, cwd=REPO_ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid, folder = learner.stdout.readline().split()
    finally:
        learner.kill()
        learner.wait(10)
        learner.stdin.close()
        learner.stdout.close()
    try:
        assert alive(int(pid)) and Path(folder).is_dir(), "the redis-server should outlive its learner here"
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
        with EmbeddedRedis() as server:
            assert server.directory.parent == tmp_path
        wait_until(lambda: not alive(int(pid)), 10, message="the orphaned redis-server to shut down")
        assert not Path(folder).exists()
    finally:
        if alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
