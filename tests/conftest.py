"""Shared fixtures: one private redis-server per test session (never the shared one on 6379),
flushed around every test, and real `rqrl worker` processes that are always cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from rqrl.server import EmbeddedRedis

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_SECRET = "rqrl-test-secret"
os.environ["RQRL_SECRET"] = TEST_SECRET  # learners in this process and every worker subprocess share it


@pytest.fixture(scope="session")
def redis_server():
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def connection(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def run_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env.pop("REDIS_URL", None)
    return env


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

    def start(self, name: str, queue: str = "rqrl", extra: list[str] | None = None) -> subprocess.Popen:
        command = [sys.executable, "-m", "rqrl", "worker", "--redis-url", self.redis_url, "--queue", queue,
                   "--name", name, "--log-level", "WARNING", *(extra or [])]
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        self.processes.append(process)
        return process

    def wait_registered(self, connection: redis.Redis, count: int, queue: str = "rqrl", timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if connection.scard(f"rq:workers:{queue}") >= count:
                return
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"worker exited early: {process.stderr.read().decode()}")
            time.sleep(0.05)
        raise AssertionError(f"{count} workers did not register within {timeout} s")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            stop_process(process)


@pytest.fixture
def workers(redis_url):
    pool = WorkerProcesses(redis_url)
    yield pool
    pool.stop_all()


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
