"""Shared fixtures: one private redis-server per test session (never the shared one on 6379),
flushed around every test, real `rqrl worker` processes that are always cleaned up, an environment
a developer's shell cannot redirect, the gate of the ``slow`` marker (tests/slow_gate.py), the tiers
by folder (tests/tiers.py), and protocol timings ten times faster than production's (RQRL_TIME_SCALE,
rqrl/engine/timings.py) in the tests and every process they start."""

from __future__ import annotations

import os
import signal
import uuid

import pytest
import redis
import torch

from rqrl.engine.server import EmbeddedRedis
from rqrl.engine.timings import TIME_SCALE_VARIABLE
from tests.children import (  # noqa: F401 - re-exported: test files import these from here
    REPO_ROOT,
    WorkerProcesses,
    alive,
    descendants,
    processes_with_marker,
    stop_process,
    worker_env,
)

pytest_plugins = ["tests.slow_gate", "tests.tiers"]  # the slow marker's gate; the tiers by folder

# A shell without job control (a script's `cmd &`, nohup) starts its background commands with SIGINT ignored, and
# an ignored signal stays ignored across exec: the learners and workers the Ctrl-C tests start would never see
# their SIGINT. A handler in this process is reset to the default at exec, so they get Python's usual one.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TEST_SECRET = "rqrl-test-secret"
TEST_TIME_SCALE = "0.1"
"""Heartbeats, liveness and sideline windows ten times faster than production's, in the tests and their workers."""
# what a developer's shell may set that would point tests (and the workers they start) elsewhere
CLEARED_VARIABLES = ("REDIS_URL", "RQRL_QUEUE")
CLEARED_PREFIXES = ("RQ_DASHBOARD_",)


def isolate_environment(patch: pytest.MonkeyPatch) -> None:
    """No REDIS_URL, RQRL_QUEUE or RQ_DASHBOARD_* from the shell; RQRL_SECRET is the test secret, which
    worker subprocesses and in-process RolloutWorkers read (learners take ``secret=``, see tests.factories);
    RQRL_TIME_SCALE is TEST_TIME_SCALE. Tests that need other values set them."""
    for name in list(os.environ):
        if name in CLEARED_VARIABLES or name.startswith(CLEARED_PREFIXES):
            patch.delenv(name)
    patch.setenv("RQRL_SECRET", TEST_SECRET)
    patch.setenv(TIME_SCALE_VARIABLE, TEST_TIME_SCALE)


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
