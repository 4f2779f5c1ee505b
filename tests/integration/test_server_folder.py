"""ServerFolder and sweep_abandoned_folders: an embedded Redis's folder outlives no learner.

A learner killed with SIGKILL is played here by closing a folder's lock without removing the folder: the kernel
does the same for a killed process. The test that kills a real learner is in tests/processes/test_server.py.
"""

from __future__ import annotations

import os
import time

import pytest
import redis

from rqrl.engine import server_folder
from rqrl.engine.server import EmbeddedRedis
from rqrl.engine.server_folder import LOCK_NAME, ServerFolder, sweep_abandoned_folders
from tests.children import alive
from tests.integration.test_server import needs_redis_server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path


def abandon(folder: ServerFolder) -> None:
    """What a SIGKILL does to the learner holding ``folder``: its lock goes, its files stay."""
    os.close(folder._lock)
    folder._lock = None


def test_a_folder_whose_learner_is_alive_is_kept(temp_dir):
    held = ServerFolder()
    try:
        assert (held.path / LOCK_NAME).read_text() == str(os.getpid())
        assert sweep_abandoned_folders() == []
        assert held.path.is_dir()
    finally:
        held.remove()
    assert not held.path.exists()


def test_a_folder_whose_learner_died_is_removed_and_only_that_one(temp_dir):
    held, left = ServerFolder(), ServerFolder()
    abandon(left)
    (left.path / "redis.log").write_text("a log")
    try:
        assert sweep_abandoned_folders() == [left.path]
        assert not left.path.exists() and held.path.is_dir()
    finally:
        held.remove()


def test_other_folders_in_the_temp_folder_are_not_touched(temp_dir):
    (temp_dir / "rqrl-redis-file").write_text("not a folder")
    (temp_dir / "someone-else").mkdir()
    assert sweep_abandoned_folders() == []
    assert sorted(path.name for path in temp_dir.iterdir()) == ["rqrl-redis-file", "someone-else"]


def test_an_old_unlocked_folder_goes_and_a_young_one_stays(temp_dir):
    old, young = temp_dir / "rqrl-redis-old", temp_dir / "rqrl-redis-young"
    old.mkdir()
    young.mkdir()
    long_ago = time.time() - server_folder.UNLOCKED_GRACE_SECONDS - 60
    os.utime(old, (long_ago, long_ago))
    assert sweep_abandoned_folders() == [old]
    assert young.is_dir()


@needs_redis_server
def test_an_old_unlocked_folder_whose_redis_answers_stays(temp_dir, monkeypatch):
    with EmbeddedRedis() as server:
        (server.directory / LOCK_NAME).unlink()  # as an older rqrl left it: no lock file
        monkeypatch.setattr(server_folder, "UNLOCKED_GRACE_SECONDS", 0.0)
        assert sweep_abandoned_folders() == []
        assert redis.Redis.from_url(server.url).ping()


@needs_redis_server
def test_a_redis_left_running_in_an_abandoned_folder_is_shut_down(temp_dir):
    server = EmbeddedRedis().start()
    pid, folder = server.process.pid, server.directory
    try:
        abandon(server.folder)
        assert sweep_abandoned_folders() == [folder]
        server.process.wait(timeout=10)
        assert not alive(pid) and not folder.exists()
    finally:
        server.stop()


@needs_redis_server
def test_starting_an_embedded_redis_sweeps_first(temp_dir):
    left = ServerFolder()
    abandon(left)
    with EmbeddedRedis() as server:
        assert not left.path.exists()
        assert server.directory.is_dir()


def test_an_abandoned_folder_whose_server_does_not_answer_is_left_for_a_later_sweep(temp_dir):
    import socket

    left = ServerFolder()
    abandon(left)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(left.socket_path)  # listens, never answers: a redis-server too busy to reply in time
        listener.listen()
        assert sweep_abandoned_folders() == []
        assert left.path.is_dir(), "its socket went: the server behind it could never be reached again"
    assert sweep_abandoned_folders() == [left.path]  # nothing listens now: a socket file only
