"""SEED actors and servers as jobs on real `rqrl worker` processes: transitions flow, a killed worker's job is
enqueued again for another worker, and the run leaves no job, process or key behind.

The tests here start processes; the in-process ones are in tests/integration/test_seed_jobs.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from rqrl.seed import Config, Trainer
from tests.conftest import TEST_SECRET
from tests.integration.test_seed_jobs import QUEUE  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until
from tests.seed_fixtures import cartpole_agent, make_cartpole


def config(redis_url, run_name, **overrides):
    values = {"redis_url": redis_url, "run_name": run_name, "secret": TEST_SECRET, "actor_threads": 2,
              "minimum_buffer_size": 50, "inference_batchsize": 2, "inference_delay": 0.01, "broadcast_period": 0.5,
              "request_timeout": 1.0, "queue_name": QUEUE}
    values.update(overrides)
    return Config(**values)


def assert_no_job_or_key(connection, run_name):
    assert list(connection.scan_iter(match=f"rqrl:{run_name}:*")) == []
    # a worker that finishes its job's RQ bookkeeping after the stop writes the job's hash a moment longer (it
    # deletes it itself: result_ttl=0); a job that stays for 5 s was left behind
    deadline = time.monotonic() + 5
    while list(connection.scan_iter(match=f"rq:job:rqrl_{run_name}_*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(connection.scan_iter(match=f"rq:job:rqrl_{run_name}_*")) == []
    assert connection.llen(f"rq:queue:{QUEUE}") == 0


@pytest.mark.timeout(120)
def test_actors_and_servers_run_as_worker_jobs(redis_url, connection, run_name, workers):
    for index in range(2):
        workers.start(f"seed-{index}", queue=QUEUE)
    workers.wait_registered(connection, 2, queue=QUEUE)

    def stop_once_trained(trainer):
        if trainer.stats.train_steps >= 5:
            trainer.stop()

    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_cartpole, on_progress=stop_once_trained,
                      progress_seconds=0.1)
    trainer.start(90.0)
    stats = trainer.stats
    assert stats.train_steps >= 5 and stats.counters["pushed"] == stats.transitions_received > 0
    assert stats.restarts == [] and not trainer.processes
    assert_no_job_or_key(connection, run_name)
    assert all(process.poll() is None for process in workers.processes)  # the workers serve on


@pytest.mark.timeout(180)
def test_a_killed_workers_job_goes_to_another_worker(redis_url, connection, run_name, workers):
    for index in range(3):
        workers.start(f"seed-{index}", queue=QUEUE)
    workers.wait_registered(connection, 3, queue=QUEUE)
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, epsilon=0.0), make_cartpole)
    thread = threading.Thread(target=trainer.start, args=(150.0,), daemon=True)
    thread.start()

    def pushed():
        return int(connection.hget(f"rqrl:{run_name}:seed:stats", "pushed") or 0)

    try:
        wait_until(lambda: pushed() > 20, 60, message="transitions to flow")
        busy = {key.decode().split(":")[-1] for key in connection.scan_iter(match="rq:worker:*")
                if connection.hget(key, "current_job")}
        victim = next(process for process in workers.processes
                      if any(name in " ".join(process.args) for name in busy))
        victim.kill()
        wait_until(lambda: trainer.stats.restarts, 30, message="a restart")
        before = pushed()
        wait_until(lambda: pushed() > before + 20, 60, message="transitions after the restart")
    finally:
        trainer.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert any("stopped beating" in line for line in trainer.stats.restarts), trainer.stats.restarts
    assert_no_job_or_key(connection, run_name)


@pytest.mark.timeout(120)
def test_too_few_workers_for_the_jobs_is_named_in_a_warning(redis_url, connection, run_name, workers, caplog):
    """One worker for a server and an actor: the server holds it for the whole run, so the actor's job waits
    forever; the trainer says so instead of training silently on nothing."""
    workers.start("seed-only", queue=QUEUE)
    workers.wait_registered(connection, 1, queue=QUEUE)
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_cartpole)
    with caplog.at_level("WARNING", logger="rqrl.seed.jobs"):
        trainer.start(6.0)
    warnings = [record.getMessage() for record in caplog.records if "for a free worker" in record.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "start at least 2 `rqrl worker --queue rqrl-seed-test`" in warnings[0]
    assert trainer.stats.transitions_received == 0
    assert_no_job_or_key(connection, run_name)
