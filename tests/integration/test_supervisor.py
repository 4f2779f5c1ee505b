"""The supervisor's reading of worker registrations, against a real Redis: what counts as a live worker."""

from __future__ import annotations

import datetime

from rq import Queue
from rq.utils import utcformat

from rqrl.engine.health import worker_heartbeat_ages, worker_is_healthy
from rqrl.engine.run_config import RunConfig
from rqrl.engine.supervisor import Supervisor, live_worker_names


def register(connection, name: str, heartbeat: str | bytes, queue: str = "rqrl") -> None:
    """A worker registration as anyone who can write to Redis can plant one."""
    connection.sadd(f"rq:workers:{queue}", f"rq:worker:{name}")
    connection.sadd("rq:workers", f"rq:worker:{name}")
    connection.hset(f"rq:worker:{name}", "last_heartbeat", heartbeat)


def test_a_forged_registration_dated_ahead_or_unreadable_is_no_live_worker(connection):
    now = datetime.datetime.now(datetime.UTC)
    register(connection, "rqrl.real", utcformat(now))
    register(connection, "rqrl.skewed", utcformat(now + datetime.timedelta(seconds=5)))  # a clock a bit ahead
    register(connection, "rqrl.forever", "9999-12-31T23:59:59.000000Z")
    register(connection, "rqrl.tomorrow", utcformat(now + datetime.timedelta(days=1)))
    register(connection, "rqrl.junk", b"\xff not a date")
    register(connection, "rqrl.old", utcformat(now - datetime.timedelta(minutes=5)))

    assert live_worker_names(connection, Queue("rqrl", connection=connection), 20) == {"rqrl.real", "rqrl.skewed"}
    ages = worker_heartbeat_ages(connection, "rqrl.")
    assert ages["rqrl.forever"] == ages["rqrl.tomorrow"] == ages["rqrl.junk"] == float("inf")
    healthy, why = worker_is_healthy(connection, "rqrl.forever")
    assert not healthy and why == "worker rqrl.forever has no heartbeat to trust (none, unreadable, or dated ahead)"


def test_a_count_of_no_workers_is_read_again_at_once_and_others_kept_a_second(connection, run_name):
    config = RunConfig(run_name=run_name, run_id="s", queue_name="rqrl-supervised", n_rollout_steps=4, n_actors=1,
                       batch_size=1, queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    supervisor = Supervisor(connection, config, Queue("rqrl-supervised", connection=connection))
    assert supervisor.workers_alive() == 0
    register(connection, "rqrl.first", utcformat(datetime.datetime.now(datetime.UTC)), queue="rqrl-supervised")
    assert supervisor.workers_alive() == 1, "a count of 0, taken as the run started, was kept for a second"
    register(connection, "rqrl.second", utcformat(datetime.datetime.now(datetime.UTC)), queue="rqrl-supervised")
    assert supervisor.workers_alive() == 1
    assert supervisor.workers_alive(cached=False) == 2


def test_a_hung_group_of_many_envs_names_their_making_as_a_cause(connection, run_name):
    big, small = list(range(2048)), [2048]
    config = RunConfig(run_name=run_name, run_id="s", queue_name="rqrl-hung", n_rollout_steps=4, n_actors=2049,
                       batch_size=1, queue_bound=1, actor_env_seeds=[0] * 2049, actor_agent_seeds=[0] * 2049,
                       actor_groups=[big, small])
    supervisor = Supervisor(connection, config, Queue("rqrl-hung", connection=connection))
    keys = supervisor.keys
    connection.set(keys.lease(1), "job#token", ex=30)
    assert "envs its group steps" not in str(supervisor.no_workers_error(30))
    connection.set(keys.lease(0), "job#token", ex=30)
    error = supervisor.no_workers_error(30)
    assert "the jobs of actor groups [0, 1] still hold their leases" in str(error)
    assert "or in making and resetting the 2,048 envs its group steps" in str(error)


def test_a_worker_that_runs_the_run_after_all_withdraws_its_sideline_report(connection, run_name, monkeypatch):
    """A worker sidelined once (its env's code missing, installed since) stayed counted among the refusers: as the
    only live worker it would have made the learner raise WorkersRefusedError while it ran the run's jobs."""
    import pytest

    from rqrl import WorkersRefusedError
    from rqrl.engine import jobs
    from rqrl.engine.keys import RunKeys
    from rqrl.errors import WorkerUnfitError

    monkeypatch.setattr(jobs, "worker_label", lambda: "rqrl.mended")
    config = RunConfig(run_name=run_name, run_id="s", queue_name="rqrl-mended", n_rollout_steps=4, n_actors=1,
                       batch_size=1, queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    supervisor = Supervisor(connection, config, Queue("rqrl-mended", connection=connection))
    register(connection, "rqrl.mended", utcformat(datetime.datetime.now(datetime.UTC)), queue="rqrl-mended")
    keys = RunKeys(run_name)
    jobs.sideline(connection, keys, "job-1", WorkerUnfitError("no module named 'my_envs'"))
    monkeypatch.setitem(jobs._UNFIT_STREAKS, run_name, 1)  # what back_off counted, without its sleep
    with pytest.raises(WorkersRefusedError, match="rqrl.mended"):
        supervisor.check_sidelined_workers()
    jobs.fit_again(connection, keys)  # its next job of the run set up fine
    supervisor.check_sidelined_workers()
    assert supervisor.sidelined == {} and not connection.hexists(keys.sidelined, "rqrl.mended")
