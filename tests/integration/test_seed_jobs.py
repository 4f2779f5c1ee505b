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


def _refused_on_a_worker_of_another_secret(connection, run_name, monkeypatch, caplog):
    """A SEED run whose server-0 job a worker with another RQRL_SECRET took: the fleet, the refusing worker's name."""
    import signal

    from rqrl.engine.worker import RolloutWorker
    from rqrl.seed.store import SeedRecord, SeedRun
    from tests.conftest import TEST_SECRET

    monkeypatch.setenv("RQRL_TIME_SCALE", "0.05")  # the refusing worker's back-off
    run = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "run-id")
    run.write({"actor_processes": 1}, dict, dict)
    run.record(SeedRecord(QUEUE, 1, 1))
    fleet = JobFleet(connection, QUEUE, run.keys, actor_processes=1)
    fleet.launch("server-0")
    refused = fleet.jobs["server-0"].job_id
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker = RolloutWorker([QUEUE], connection=connection, name="other-secret", secret="another secret")
        worker.work(burst=True, logging_level="WARNING", with_scheduler=False, max_jobs=1)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    report = connection.hget(run.keys.sidelined, "other-secret")
    assert report is not None and b"WorkerUnfitError" in report and b"RQRL_SECRET" in report, report
    return fleet, refused


def test_a_worker_with_another_secret_is_sidelined_and_its_job_goes_to_another(connection, run_name, monkeypatch,
                                                                                caplog):
    fleet, refused = _refused_on_a_worker_of_another_secret(connection, run_name, monkeypatch, caplog)
    try:
        with caplog.at_level("WARNING", logger="rqrl.engine.supervisor"):
            assert fleet.dead() == [], "a refused job is handed back, not counted as a death"
        assert "worker other-secret cannot run" in caplog.text
        assert fleet.jobs["server-0"].job_id != refused
        assert fleet.jobs["server-0"].job_id.encode() in connection.lrange(f"rq:queue:{QUEUE}", 0, -1)
    finally:
        fleet.stop(0)


def test_the_trainer_gives_up_once_every_live_worker_refused_the_run(connection, run_name, monkeypatch, caplog):
    from rqrl.errors import WorkersRefusedError

    fleet, _ = _refused_on_a_worker_of_another_secret(connection, run_name, monkeypatch, caplog)
    # the refusing worker, which a burst run deregistered, as the live worker it is in production
    monkeypatch.setattr("rqrl.engine.supervisor.live_worker_names", lambda *args: {"other-secret"})
    try:
        with pytest.raises(WorkersRefusedError, match=r"every live worker on queue .*RQRL_SECRET"):
            fleet.dead()
    finally:
        fleet.stop(0)
