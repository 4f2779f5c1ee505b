"""The embedded Redis's private temp folder: held by its learner with a lock, swept once the learner is gone.

A learner killed with SIGKILL cannot remove its folder (nor, when it started Redis from a thread other than the
main one, stop its redis-server). The next embedded Redis on the machine finds such folders by their lock, which
the kernel freed with the learner, shuts down any Redis still answering in one, and removes it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

PREFIX = "rqrl-redis-"
SOCKET_NAME = "redis.sock"
LOCK_NAME = "owner.lock"
UNLOCKED_GRACE_SECONDS = 600.0
"""A folder without a lock file (an older rqrl's, or one being made this instant) is left alone this long."""


class ServerFolder:
    """A new ``rqrl-redis-*`` folder in the temp folder, locked for as long as this object holds it."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX))
        self._lock: int | None = _locked_file(self.path)

    @property
    def socket_path(self) -> str:
        return str(self.path / SOCKET_NAME)

    def remove(self) -> None:
        """Delete the folder, then let go of its lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _locked_file(folder: Path) -> int:
    """Take the lock under a temporary name and rename it into place, so a sweeper never sees it unlocked."""
    staging = folder / f"{LOCK_NAME}.new"
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(descriptor, str(os.getpid()).encode())
        os.rename(staging, folder / LOCK_NAME)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def sweep_abandoned_folders(directory: str | None = None) -> list[Path]:
    """Remove this user's embedded-Redis folders whose learner has died; returns those removed."""
    removed = []
    parent = Path(directory or tempfile.gettempdir())
    for folder in parent.glob(f"{PREFIX}*"):
        try:
            if folder.is_dir() and folder.stat().st_uid == os.getuid() and _sweep(folder):
                removed.append(folder)
        except Exception as error:  # raced with its owner or another sweeper, a Redis that answers oddly: others'
            log.debug("left %s: %s", folder, error)  # leftovers never keep a new embedded Redis from starting
    return removed


def _sweep(folder: Path) -> bool:
    lock_path = folder / LOCK_NAME
    if not lock_path.exists():
        return _sweep_unlocked(folder)
    descriptor = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its learner is alive
        if not _shut_down(folder / SOCKET_NAME):
            return False  # a Redis there that does not answer: removing its socket would leave it unreachable
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(descriptor)
    log.info("removed %s, left by a learner that was killed", folder)
    return True


def _sweep_unlocked(folder: Path) -> bool:
    """An older rqrl's folder: removed once it is old and its Redis no longer answers."""
    if time.time() - folder.stat().st_mtime < UNLOCKED_GRACE_SECONDS or answers(folder / SOCKET_NAME):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _client(socket_path: Path) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(socket_path), retry=Retry(NoBackoff(), 0), socket_timeout=1.0)


def answers(socket_path: Path) -> bool:
    """One PING without retries: True only when a Redis is listening on ``socket_path``."""
    if not socket_path.exists():
        return False
    with _client(socket_path) as client:
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False


def _shut_down(socket_path: Path) -> bool:
    """Stop a redis-server that outlived its learner (one started from a thread other than the main one); False if
    one listens there but does not answer in time (busy: a later sweep tries again)."""
    if not socket_path.exists():
        return True
    with _client(socket_path) as client:
        try:
            client.ping()
        except redis.TimeoutError:
            return False
        except (redis.ConnectionError, OSError):  # refused: a socket file with no server behind it
            return True
        try:
            client.shutdown(nosave=True)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass  # it went down, which closes the connection
    log.info("stopped the redis-server on %s, left running by a learner that was killed", socket_path)
    return True
