"""Shared fixtures: one private redis-server per test session (never the shared one on 6379),
flushed around every test, real `rqrl worker` processes that are always cleaned up, an environment
a developer's shell cannot redirect, and the gate of the ``slow`` marker (tests/slow_gate.py)."""

from __future__ import annotations

import os
import signal
import uuid

import pytest
import redis
import torch

from rqrl.server import EmbeddedRedis
from tests.processes import (  # noqa: F401 - re-exported: test files import these from here
    REPO_ROOT,
    WorkerProcesses,
    alive,
    descendants,
    processes_with_marker,
    stop_process,
    worker_env,
)
from tests.slow_gate import pytest_addoption, pytest_collection_modifyitems  # noqa: F401 - the plugin's hooks

# A shell without job control (a script's `cmd &`, nohup) starts its background commands with SIGINT ignored, and
# an ignored signal stays ignored across exec: the learners and workers the Ctrl-C tests start would never see
# their SIGINT. A handler in this process is reset to the default at exec, so they get Python's usual one.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TEST_SECRET = "rqrl-test-secret"
# what a developer's shell may set that would point tests (and the workers they start) elsewhere
CLEARED_VARIABLES = ("REDIS_URL", "RQRL_QUEUE")
CLEARED_PREFIXES = ("RQ_DASHBOARD_",)


def isolate_environment(patch: pytest.MonkeyPatch) -> None:
    """No REDIS_URL, RQRL_QUEUE or RQ_DASHBOARD_* from the shell; RQRL_SECRET is the test secret, which
    worker subprocesses and in-process RolloutWorkers read (learners take ``secret=``, see tests.factories).
    Tests that need other values set them."""
    for name in list(os.environ):
        if name in CLEARED_VARIABLES or name.startswith(CLEARED_PREFIXES):
            patch.delenv(name)
    patch.setenv("RQRL_SECRET", TEST_SECRET)


@pytest.fixture(scope="session", autouse=True)
def isolated_session_environment():
    """The isolated environment for session and module fixtures too (they start servers and workers)."""
    with pytest.MonkeyPatch.context() as patch:
        isolate_environment(patch)
        yield


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch):
    """The isolated environment again for each test, whatever an earlier test left in os.environ."""
    isolate_environment(monkeypatch)


@pytest.fixture
def one_torch_thread():
    """For tests of tiny models: one torch thread is as fast and leaves the machine's other cores alone."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


@pytest.fixture
def workers(redis_url):
    pool = WorkerProcesses(redis_url)
    yield pool
    pool.stop_all()
