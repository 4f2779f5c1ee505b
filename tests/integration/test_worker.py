"""`rqrl worker` and `rq worker` processes: joining mid-run, the documented rq command line.

The tests here run in-process; those that start processes are in tests/processes/test_worker.py.
"""

from __future__ import annotations

import pytest

from tests.conftest import TEST_SECRET
from tests.factories import redis_actors
from tests.in_process import work_burst

pytestmark = pytest.mark.timeout(120)


def enqueue_raw(connection, function: str, *args, **options):
    """What an attacker with write access to Redis can do: enqueue any function name with JSON args."""
    from rq import Queue
    from rq.serializers import JSONSerializer

    return Queue("rqrl", connection=connection, serializer=JSONSerializer).enqueue(function, *args, **options)


def test_an_external_redis_without_a_secret_is_refused(redis_url, monkeypatch):
    from rqrl import ConfigError

    monkeypatch.delenv("RQRL_SECRET")
    with pytest.raises(ConfigError, match="RQRL_SECRET"):
        redis_actors(redis_url, "no-secret", n_actors=4, secret=None)


def test_the_learner_never_reads_the_secret_from_the_environment(redis_url):
    from rqrl import ConfigError

    assert TEST_SECRET  # set in this process's environment by conftest: only the command line may read it
    with pytest.raises(ConfigError, match=r"pass secret=\.\.\. in Python \(e\.g\. secret=os\.environ"):
        redis_actors(redis_url, "no-secret", n_actors=4, secret=None)


def test_an_idle_worker_beats_once_per_heartbeat_of_its_timings(connection, redis_url):
    from rqrl.engine.timings import protocol_timings
    from rqrl.engine.worker import RolloutWorker

    worker = RolloutWorker(["rqrl"], connection=connection)
    assert worker.dequeue_timeout == protocol_timings().heartbeat == 0.5  # RQ alone would wait whole seconds
    assert worker.worker_ttl >= 15

def test_a_hostile_job_is_refused_and_lands_in_the_failed_registry(connection, tmp_path, caplog):
    from rq.job import Job, JobStatus
    from rq.registry import FailedJobRegistry
    from rq.serializers import JSONSerializer

    marker = tmp_path / "pwned"
    job = enqueue_raw(connection, "os.system", f"touch {marker}")
    callback_job = enqueue_raw(connection, "rqrl.maze.jobs.run_actor_group", "no-such-run", 0, 0)
    connection.hset(callback_job.key, "success_callback_name", "os.getcwd")
    work_burst(connection)  # the job logic, in-process: tests/e2e/test_cli.py runs `rqrl worker --burst` itself
    assert not marker.exists(), "the hostile job ran"
    failed = FailedJobRegistry("rqrl", connection=connection, serializer=JSONSerializer)  # rqrl's serializer
    assert job.id in failed.get_job_ids()
    held = Job.fetch(job.id, connection=connection, serializer=failed.serializer)
    assert (held.func_name, held.args, held.get_status()) == ("os.system", [f"touch {marker}"], JobStatus.FAILED)
    refused = held.latest_result()
    assert "ForbiddenJobError" in (refused.exc_string or "")
    assert "never run callbacks" in caplog.text


def test_with_redis_from_redis_url_the_secret_comes_from_rqrl_secret_too(redis_url, monkeypatch):
    """Maze's constructors take no secret: REDIS_URL and RQRL_SECRET configure a drop-in script (the sampler's
    choice is rqrl.engine.options.run_secret's, tests/unit/test_options.py)."""
    from rqrl import ConfigError, RedisDistributedActors
    from tests import fixtures

    monkeypatch.setenv("REDIS_URL", redis_url)
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, 2.0, n_local_workers=0)
    assert actors.redis_url == redis_url and actors.secret == TEST_SECRET
    explicit = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, 2.0, n_local_workers=0,
                                      secret="given")
    assert explicit.secret == "given"  # an argument still wins
    monkeypatch.delenv("RQRL_SECRET")
    with pytest.raises(ConfigError, match=r"set RQRL_SECRET \(for `rqrl train`, and for a script that takes Redis"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, 2.0, n_local_workers=0)


def test_a_stop_signal_while_the_worker_registers_stops_it_instead_of_killing_it(connection, monkeypatch):
    """RQ installs its SIGTERM and SIGINT handlers only after it has registered the worker: a signal in between
    killed the worker outright (seen in CI, a worker stopped just after it registered). Now it is a stop request,
    honoured before the first dequeue: the queued job stays queued."""
    import signal

    from rq.worker import BaseWorker

    from rqrl.engine.worker import RolloutWorker

    enqueue_raw(connection, "rqrl.maze.jobs.run_actor_group", "no-such-run", 0, 0)
    caught = []
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    # where the worker leaves SIGTERM to its default action, this test's own handler stands in for the kill
    signal.signal(signal.SIGTERM, lambda number, frame: caught.append(number))
    register = BaseWorker.register_birth

    def registering(worker, *args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # handled before raise_signal returns, on this (the main) thread
        return register(worker, *args, **kwargs)

    monkeypatch.setattr(BaseWorker, "register_birth", registering)
    worker = RolloutWorker(["rqrl"], connection=connection, name="stopped-early", secret=TEST_SECRET)
    try:
        worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert caught == [], "the signal reached the default disposition's stand-in: it would have killed the worker"
    assert worker.shutdown_requested
    assert connection.llen("rq:queue:rqrl") == 1, "stopped before its first dequeue"


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_idle_worker_whose_stop_was_lost_in_a_finalizer_stops_at_its_next_dequeue_timeout(connection, monkeypatch):
    """RQ stops an idle worker by raising StopRequested from its signal handler; CPython drops an exception raised
    inside a __del__ (where a signal can land), and RQ's idle dequeue then blocked until a job came, however long.
    The stop is a flag too, read between dequeue timeouts."""
    import signal
    import time

    from rq.worker import BaseWorker

    from rqrl.engine.worker import RolloutWorker

    worker = RolloutWorker(["rqrl"], connection=connection, name="lost-stop", secret=TEST_SECRET)

    class StopInAFinalizer:
        def __del__(self):
            worker.request_stop(signal.SIGTERM, None)  # its StopRequested is printed and dropped

    lost = []
    beat = BaseWorker.heartbeat

    def beat_and_lose_a_stop(self, *args, **kwargs):
        beat(self, *args, **kwargs)
        if not lost and self.get_state() == "idle":
            lost.append(True)
            StopInAFinalizer()  # collected at once

    monkeypatch.setattr(BaseWorker, "heartbeat", beat_and_lose_a_stop)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        worker.work(burst=False, logging_level="WARNING", with_scheduler=False)  # blocked for good before
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert lost, "the stop was asked while the worker waited for jobs"
    assert time.monotonic() - started < 10


def test_a_job_that_redis_lost_while_it_ran_finishes_with_a_warning_not_an_error(connection, caplog):
    import logging

    from rq.registry import StartedJobRegistry
    from rq.utils import now

    from rqrl.engine.rq_safety import rollout_queue
    from rqrl.engine.worker import RolloutWorker

    queue = rollout_queue("rqrl", connection)
    job = enqueue_raw(connection, "rqrl.maze.jobs.run_actor_group", "no-such-run", 0, 0, result_ttl=0)  # as rqrl's
    connection.delete(job.key)  # what a restart without persistence does to a job while it runs
    connection.hset(job.key, "last_heartbeat", "2026-01-01T00:00:00Z")  # a heartbeat since writes a partial hash
    job.started_at = job.ended_at = now()  # what RQ sets around the run
    worker = RolloutWorker([queue], connection=connection)
    with caplog.at_level(logging.WARNING):
        worker.handle_job_success(job, queue, StartedJobRegistry(queue.name, connection=connection))
    assert f"job {job.id} finished, but Redis lost it meanwhile" in caplog.text
    assert not connection.exists(job.key)


def test_a_job_this_worker_cannot_run_is_logged_without_its_traceback(connection, caplog):
    """A worker with another RQRL_SECRET logged a chained traceback of two screens per job it handed back."""
    import logging

    from rqrl.engine.worker import RolloutWorker
    from rqrl.errors import SignatureError, WorkerUnfitError

    worker = RolloutWorker(["rqrl"], connection=connection, name="unfit", secret=TEST_SECRET)
    job = enqueue_raw(connection, "rqrl.maze.jobs.run_actor_group", "r", 0, 0)
    try:
        try:
            raise SignatureError("refusing a payload whose signature does not match")
        except SignatureError as cause:
            raise WorkerUnfitError("this worker cannot verify the signed payload of run 'r'") from cause
    except WorkerUnfitError as error:
        exc_info = (WorkerUnfitError, error, error.__traceback__)
    with caplog.at_level(logging.ERROR, logger="rq.worker"):
        worker.handle_exception(job, *exc_info)
    assert "WorkerUnfitError: this worker cannot verify the signed payload of run 'r'" in caplog.text
    assert "Traceback" not in caplog.text and "SignatureError" not in caplog.text
