"""`rqrl worker` and `rq worker` processes: joining mid-run, the documented rq command line.

The tests here start processes; the in-process ones are in tests/integration/test_worker.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.children import REPO_ROOT, WorkerProcesses, run_rqrl, stop_process, worker_env
from tests.factories import redis_actors
from tests.integration.test_worker import enqueue_raw
from tests.polling import wait_until
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(120)




def test_a_worker_joining_mid_run_gets_work(connection, redis_url, run_name, workers):
    workers.start("first")
    workers.wait_registered(connection, 1)
    # four single-actor jobs on one worker: jobs wait in the queue, so a newcomer finds work
    with redis_actors(redis_url, run_name, n_actors=4, actors_per_job=1, min_job_seconds=0.05) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        before = set()
        for _ in range(5):
            before |= set(actors.collect_outputs("cpu").record.worker)
        workers.start("second")
        workers.wait_registered(connection, 2)
        after = set()

        def second_delivered() -> bool:
            after.update(actors.collect_outputs("cpu").record.worker)
            return "second" in after

        wait_until(second_delivered, 30, interval=0,
                   message=lambda: f"a rollout by the joining worker; workers seen: {after}")
        assert actors.workers_alive(cached=False) == 2
    assert before == {"first"}


def test_a_busy_worker_whose_registration_redis_lost_registers_again_mid_job(connection, redis_url, run_name,
                                                                             workers):
    from rqrl.engine.timings import protocol_timings

    workers.start("busy")
    workers.wait_registered(connection, 1)
    with redis_actors(redis_url, run_name, n_actors=2, actors_per_job=2) as actors:  # one group: one long job
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")
        job_ids = connection.zrange("rq:wip:rqrl", 0, -1)
        # what a Redis restart without persistence does to the registration of a busy worker
        connection.delete("rq:worker:busy")
        connection.srem("rq:workers", "rq:worker:busy")
        connection.srem("rq:workers:rqrl", "rq:worker:busy")

        def registered() -> bool:
            return bool(connection.sismember("rq:workers", "rq:worker:busy")
                        and connection.sismember("rq:workers:rqrl", "rq:worker:busy"))

        def registered_again() -> bool:
            if registered():
                return True
            actors.collect_outputs("cpu")  # the job runs on meanwhile
            return False

        wait_until(registered_again, protocol_timings().heartbeat + 15, interval=0,
                   message="the busy worker registering again")
        assert connection.hget("rq:worker:busy", "birth") is not None
        assert connection.zrange("rq:wip:rqrl", 0, -1) == job_ids, "it registered again mid-job, not after it"
        assert actors.workers_alive(cached=False) == 1


def test_plain_rq_worker_with_the_documented_class_runs_rollouts(connection, redis_url, run_name):
    command = [sys.executable, "-m", "rq.cli", "worker", "-w", "rqrl.engine.worker.RolloutWorker",
               "-S", "rq.serializers.JSONSerializer", "--url", redis_url, "rqrl"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        with redis_actors(redis_url, run_name, n_actors=2, batch_size=2) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            record = actors.collect_outputs("cpu").record
            assert record.rewards.shape == (16, 2)
    finally:
        stop_process(process)




def test_plain_rq_worker_without_the_json_serializer_still_refuses_hostile_jobs(connection, redis_url, tmp_path):
    marker = tmp_path / "pwned"
    enqueue_raw(connection, "os.system", f"touch {marker}")
    command = [sys.executable, "-m", "rq.cli", "worker", "-w", "rqrl.engine.worker.RolloutWorker", "--url", redis_url,
               "--burst", "rqrl"]
    result = subprocess.run(command, cwd=REPO_ROOT, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


def test_a_tampered_env_factory_is_refused_and_reported(connection, redis_url, run_name, workers):
    from rqrl import ActorFailedError

    with redis_actors(redis_url, run_name, n_actors=2, batch_size=2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        blob = connection.get(actors.keys.env_factory)
        connection.set(actors.keys.env_factory, blob[:-1] + bytes([blob[-1] ^ 1]))
        workers.start("victim")
        with pytest.raises(ActorFailedError, match="SignatureError"):
            actors.collect_outputs("cpu")


def test_a_worker_with_another_secret_refuses_the_run(connection, redis_url, run_name):
    from rqrl import ActorFailedError

    process = subprocess.Popen([sys.executable, "-m", "rqrl", "worker", "--redis-url", redis_url], cwd=REPO_ROOT,
                               env=worker_env(RQRL_SECRET="not-the-learner-secret"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        with redis_actors(redis_url, run_name, n_actors=2, batch_size=2) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            with pytest.raises(ActorFailedError, match="different RQRL_SECRET"):
                actors.collect_outputs("cpu")
    finally:
        stop_process(process)


def test_rqrl_worker_without_a_secret_says_what_to_set(redis_url):
    env = {key: value for key, value in worker_env().items() if key != "RQRL_SECRET"}
    result = run_rqrl("worker", "--redis-url", redis_url, env=env, timeout=60)
    assert result.returncode != 0 and "RQRL_SECRET is not set" in result.stderr


def test_sigterm_to_a_worker_waiting_for_first_weights_hands_the_group_back(connection, redis_url, run_name,
                                                                            workers, monkeypatch):
    # production's timings: the handed-over lease is read after the worker's exit, which takes longer than the
    # tests' 0.5 s lease
    monkeypatch.setenv("RQRL_TIME_SCALE", "1")
    worker = workers.start("waiting")
    workers.wait_registered(connection, 1)
    with redis_actors(redis_url, run_name, n_actors=2, actors_per_job=2):  # started, nothing broadcast yet
        wait_until(lambda: connection.hget("rq:worker:waiting", "state") == b"busy", 30,
                   message="the worker to take the group's job")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=15)  # without the hand-back it would wait for weights until the run stops
        assert worker.returncode == 0
        queued = [job_id.decode() for job_id in connection.lrange("rq:queue:rqrl", 0, -1)]
        assert len(queued) == 1 and queued[0].startswith(f"rqrl_{run_name}_g0_r0_a"), \
            f"the continuation is queued under an id of its own: {queued}"
        assert connection.exists(f"rq:job:{queued[0]}"), "its job survives the end of the job it replaces"
        assert connection.get(f"rqrl:{run_name}:lease:0").decode() == queued[0], "and holds the group's lease"


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_sigterm_stops_a_worker_within_seconds_when_its_redis_is_gone(tmp_path, run_name, busy):
    """A worker whose Redis vanished (a crash, a host gone) exits within seconds of SIGTERM and says why, instead of
    riding out the whole outage window (60 s) for its last writes and its deregistration; busy or idle."""
    server = RedisServer(tmp_path).start()
    workers = WorkerProcesses(server.url)
    actors = None
    try:
        worker = workers.start("orphaned", extra=["--log-level", "INFO"])
        workers.wait_registered(server.admin, 1)
        if busy:
            actors = redis_actors(server.url, run_name, n_actors=2, actors_per_job=2, pop_ahead=False)
            actors.start()
            actors.broadcast_updated_policy(actors.policy.state_dict())
            actors.collect_outputs("cpu")
            assert server.admin.hget("rq:worker:orphaned", "state") == b"busy"
        server.kill()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        output = worker.stderr.read().decode()
    finally:
        workers.stop_all()
        if actors is not None:
            actors.stop(timeout=1)  # a Redis that is gone costs its tear-down a few seconds (test_teardown.py)
        server.stop()
    assert worker.returncode == 0, output
    assert "stayed unreachable as it shut down" in output, output
