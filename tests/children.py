"""Child processes of the tests: `rqrl` commands and workers that are always cleaned up, and what is
left of them in /proc (zombies count as gone)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import redis

from tests.polling import wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]


def worker_env(**overrides: str) -> dict[str, str]:
    """The test process's environment for a child: the repo on its path, no REDIS_URL, plus ``overrides``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env.pop("REDIS_URL", None)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a child that dies of a signal (SIGSEGV) prints its threads' stacks
    env.update(overrides)
    return env


def run_rqrl(*arguments: str, env: dict[str, str] | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    """Run ``python -m rqrl ARGUMENTS`` to its end (``env`` defaults to worker_env()); text output captured."""
    return subprocess.run([sys.executable, "-m", "rqrl", *arguments], cwd=REPO_ROOT,
                          env=worker_env() if env is None else env, capture_output=True, text=True, timeout=timeout)


def stop_process(process: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM (a worker's warm shutdown), then SIGKILL if it is still there after ``timeout``."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


class WorkerProcesses:
    """Starts `rqrl worker` subprocesses and guarantees they are gone after the test."""

    def __init__(self, redis_url: str):
        self.redis_url = redis_url
        self.processes: list[subprocess.Popen] = []

    def start(self, name: str, queue: str = "rqrl", extra: list[str] | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """`rqrl worker --name NAME` on ``queue``; ``env`` overrides variables of worker_env()."""
        command = [sys.executable, "-m", "rqrl", "worker", "--redis-url", self.redis_url, "--queue", queue,
                   "--name", name, "--log-level", "WARNING", *(extra or [])]
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(**(env or {})), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        self.processes.append(process)
        return process

    def wait_registered(self, connection: redis.Redis, count: int, queue: str = "rqrl", timeout: float = 30) -> None:
        """Wait until RQ lists ``count`` workers on ``queue``; a worker that exits meanwhile fails the test."""

        def registered() -> bool:
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"worker exited early: {process.stderr.read().decode()}")
            return connection.scard(f"rq:workers:{queue}") >= count

        wait_until(registered, timeout, message=f"{count} workers to register on queue {queue}")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            stop_process(process)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (callers retry if it is taken since)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(url: str, process: subprocess.Popen | None = None, log_file: Path | None = None,
             timeout: float = 45) -> dict:
    """GET ``url`` once its server answers and return the JSON of a 200 reply; an HTTP error, or the server
    ``process`` exiting, fails at once (with the end of ``log_file``)."""

    def log() -> str:
        return log_file.read_text(errors="replace")[-3000:] if log_file is not None and log_file.exists() else ""

    def answer() -> dict | None:
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                assert reply.status == 200
                assert reply.headers.get_content_type() == "application/json"
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{url}: HTTP {error.code}; server log:\n{log()}") from error
        except (urllib.error.URLError, ConnectionError):
            if process is not None and process.poll() is not None:
                raise AssertionError(f"the server of {url} exited with {process.returncode}:\n{log()}") from None
            return None

    return wait_until(answer, timeout, interval=0.2, message=lambda: f"an answer from {url}; server log:\n{log()}")


def processes_with_marker(marker: str) -> list[int]:
    """Pids of live processes whose environment holds RQRL_TEST_MARKER=marker (children inherit it)."""
    needle = f"RQRL_TEST_MARKER={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().split(")")[1].split()[0]
                if state != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def descendants(pid: int) -> list[int]:
    """Pids of all live descendants of ``pid`` (children, grandchildren, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().split(")")[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def stop_from_outside(learner: subprocess.Popen, run_name: str, redis_url: str,
                      ready: Callable[[], object], what: str) -> tuple[subprocess.CompletedProcess, str, str]:
    """Once ``ready()`` (the learner ``learner`` shows ``what``), run `rqrl stop RUN_NAME` and wait for the learner
    to exit; returns the stop command's result and the learner's stdout and stderr. The learner never outlives it."""
    try:
        wait_until(ready, 120, interval=0.2, message=what)
        stop = run_rqrl("stop", run_name, "--redis-url", redis_url, timeout=90)
        stdout, stderr = communicate_or_show_stacks(learner, 60)
    finally:
        stop_process(learner)
    return stop, stdout, stderr


def communicate_or_show_stacks(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``process.communicate(timeout)``; should it still run then, fail with what it was doing: `rqrl train` and
    `rqrl demo` print every thread's stack on SIGUSR1, and the message lists what still holds its pipes. Fails
    too when the shutdown watchdog had to end it (rqrl.engine.process): its clean-up hung, and stderr has the stacks."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        exited = process.poll()
        left = {pid: _command_line(pid) for pid in descendants(process.pid)}
        if exited is None:
            process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            process.kill()
        stdout, stderr = process.communicate(timeout=10)
        raise AssertionError(
            f"{process.args[:4]}... still ran {timeout:.0f} s later (exit code {exited}); its descendants: {left}\n"
            f"stdout (tail): {stdout[-2000:]}\nstderr (tail, with the stacks): {stderr[-12000:]}") from None
    assert "did not finish" not in stderr, "the clean-up hung: " + stderr[-12000:]
    return stdout, stderr


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def start_dashboard(redis_url: str, port: int, log_file: Path) -> subprocess.Popen:
    """`rqrl dashboard` on ``redis_url`` and ``port`` (default bind), its output in ``log_file``."""
    with open(log_file, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "rqrl", "dashboard", "--redis-url", redis_url, "--port",
                                 str(port)], cwd=REPO_ROOT, env=worker_env(), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
