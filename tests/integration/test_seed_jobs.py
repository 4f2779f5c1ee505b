"""SEED actors and servers as jobs on real `rqrl worker` processes: transitions flow, a killed worker's job is
enqueued again for another worker, and the run leaves no job, process or key behind.

The tests here run in-process; those that start processes are in tests/processes/test_seed_jobs.py.
"""

from __future__ import annotations

import pytest

from rqrl.engine.enqueue import ALLOWED_JOB_FUNCTIONS
from rqrl.errors import ConfigError
from rqrl.seed import Config
from rqrl.seed.jobs import ACTOR_JOB, SERVER_JOB

QUEUE = "rqrl-seed-test"


def test_the_job_functions_are_allowed_on_workers():
    assert {ACTOR_JOB, SERVER_JOB} <= ALLOWED_JOB_FUNCTIONS


def test_job_mode_needs_a_shared_redis_given_or_from_redis_url(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="redis_url=, or REDIS_URL set"):
        Config(queue_name=QUEUE)
    monkeypatch.setenv("REDIS_URL", "redis://shared-host:6379/0")
    assert Config(queue_name=QUEUE).redis_url is None  # taken from the environment when the trainer starts
