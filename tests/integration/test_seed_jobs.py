"""SEED actors and servers as jobs on real `rqrl worker` processes: transitions flow, a killed worker's job is
enqueued again for another worker, and the run leaves no job, process or key behind.

The tests here run in-process; those that start processes are in tests/processes/test_seed_jobs.py.
"""

from __future__ import annotations

import math

import pytest

from rqrl.engine.enqueue import ALLOWED_JOB_FUNCTIONS
from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import GroupLease, lease_holder
from rqrl.errors import ConfigError
from rqrl.seed import Config
from rqrl.seed.jobs import ACTOR_JOB, SERVER_JOB, JobFleet
from tests.polling import wait_until

QUEUE = "rqrl-seed-test"


def test_the_job_functions_are_allowed_on_workers():
    assert {ACTOR_JOB, SERVER_JOB} <= ALLOWED_JOB_FUNCTIONS


def test_job_mode_needs_a_shared_redis_given_or_from_redis_url(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="redis_url=, or REDIS_URL set"):
        Config(queue_name=QUEUE)
    monkeypatch.setenv("REDIS_URL", "redis://shared-host:6379/0")
    assert Config(queue_name=QUEUE).redis_url is None  # taken from the environment when the trainer starts


def test_each_actor_and_server_is_a_leased_group_and_a_relaunch_fences_the_older_job(connection, run_name):
    keys = RunKeys(run_name)
    fleet = JobFleet(connection, QUEUE, keys, actor_processes=2)
    fleet.launch("actor-1")
    fleet.launch("server-0")
    actor, server = fleet.jobs["actor-1"], fleet.jobs["server-0"]
    assert connection.get(keys.lease(1)) == actor.job_id.encode(), "actor 1 is group 1, handed to its job"
    assert connection.get(keys.lease(2)) == server.job_id.encode(), "server 0 comes after the 2 actors"
    assert fleet._running() == {"actor-1": False, "server-0": False}, "handed over is not started"

    started = GroupLease(connection, keys, 1, lease_holder(actor.job_id, actor.token), 3.0, hang_seconds=math.inf)
    started.acquire()
    try:
        assert fleet._running() == {"actor-1": True, "server-0": False}
        fleet.launch("actor-1")  # the trainer judged it dead: its place goes to a new job
        assert fleet.jobs["actor-1"].job_id != actor.job_id
        wait_until(lambda: started.lost, 5, message="the older job to see its lease taken")
        assert fleet._running()["actor-1"] is False
    finally:
        started.release()
        fleet.stop(0)
    assert connection.llen(f"rq:queue:{QUEUE}") == 0
