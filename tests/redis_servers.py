"""Private redis-servers that a test starts, stops and starts again (never the shared one on 6379)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rqrl.engine.server import find_redis_server
from tests.children import free_port, stop_process


class RedisServer:
    """A redis-server child without persistence, in ``directory``: on a unix socket there, or with ``tcp``
    on a free port of 127.0.0.1 (TLS-only with ``tls``); ``admin`` reaches it with ``admin_options``."""

    def __init__(self, directory: Path, extra: list[str] | None = None, admin_options: dict | None = None, *,
                 tcp: bool = False, tls: bool = False):
        self.directory, self.extra, self.admin_options = directory, list(extra or []), dict(admin_options or {})
        self.tcp, self.tls = tcp or tls, tls
        self.socket = str(directory / "redis.sock")
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.admin: redis.Redis | None = None
        self.ca_file: Path | None = None  # TLS servers: the CA that signed the server's certificate

    @property
    def url(self) -> str:
        """The URL without credentials (TLS servers need more: see the tests that start one)."""
        return f"redis://127.0.0.1:{self.port}/0" if self.tcp else f"unix://{self.socket}?db=0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until ``admin`` gets its PONG; a TCP port taken meanwhile is retried."""
        errors = []
        for _ in range(3 if self.tcp else 1):
            self._launch()
            if self._answers(timeout):
                return self
            errors.append(self._output())
            self.stop()
        raise RuntimeError(f"redis-server did not start: {errors}")

    def _launch(self) -> None:
        if self.tcp:
            self.port = free_port()
            listen = ["--port", "0", "--tls-port", str(self.port)] if self.tls else ["--port", str(self.port)]
            listen += ["--bind", "127.0.0.1"]
            self._address = {"host": "127.0.0.1", "port": self.port}
        else:
            listen = ["--port", "0", "--unixsocket", self.socket]
            self._address = {"unix_socket_path": self.socket}
        self.admin = redis.Redis(**self._address, socket_connect_timeout=2, **self.admin_options)
        command = [find_redis_server(), *listen, "--save", "", "--appendonly", "no", "--dir", str(self.directory),
                   "--daemonize", "no", "--loglevel", "warning", "--logfile", str(self.directory / "redis.log"),
                   *self.extra]
        with open(self.directory / "stderr.log", "wb") as stderr:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=stderr)

    def _answers(self, timeout: float) -> bool:
        """Ping until the server answers: one try per ping (redis-py's default retries with backoff made a ping
        on a socket not there yet take seconds), a second at most each."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            probe = redis.Redis(**self._address, socket_connect_timeout=1, socket_timeout=1,
                                retry=Retry(NoBackoff(), 0), **self.admin_options)
            try:
                return bool(probe.ping())
            except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                time.sleep(0.05)
            finally:
                probe.close()
        return False

    def _output(self) -> str:
        return "".join(path.read_text(errors="replace") for path in (self.directory / "stderr.log",
                                                                     self.directory / "redis.log") if path.exists())

    def kill(self) -> None:
        """SIGKILL, as a crash or an out-of-memory kill would: no shutdown, and (no persistence) no data kept."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.stop()

    def stop(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        if self.process is not None:
            stop_process(self.process)
        self.process = None
