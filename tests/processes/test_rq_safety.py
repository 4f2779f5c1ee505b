"""A Redis writer without RQRL_SECRET plants jobs for RQ's own maintenance paths (issue 9, items 1
and 2): pickled ``meta`` that runs ``os.system``, ``*_callback_name`` naming an importable function,
and ``webhooks`` naming a URL. Real `rqrl worker` and `rq worker -w rqrl.engine.worker.RolloutWorker`
processes (with and without ``-S``), the learner's ``stop()`` and `rqrl dashboard` must neither
unpickle the payload, call the function, nor request the URL, and a real run must still work.

Every payload leaves a trace if it runs: the pickle touches ``pickle-<job id>`` and the callback
writes ``callback-<job id>`` in a marker folder; each webhook points at a listener on 127.0.0.1
that records every request.

The tests here start processes; the in-process ones are in tests/integration/test_rq_safety.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.children import REPO_ROOT, free_port, get_json, stop_process, worker_env
from tests.factories import redis_actors
from tests.integration.test_rq_safety import (  # noqa: F401 - shared with the in-process tests
    CALLBACK,
    MARKER_DIR_ENV,
    QUEUE,
    WORKER_COMMANDS,
    Listener,
    _Touch,
    assert_nothing_ran,
    hostile_callback,
    job_status,
    listener,
    markers,
    plant_expired_started,
    plant_job,
)
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)


def plant_stuck_intermediate(connection, markers, listener, job_id: str = "planted-intermediate") -> str:
    """A job stuck in the intermediate queue for an hour: RQ's clean-up fails it."""
    plant_job(connection, job_id, markers, listener, status="queued")
    connection.rpush(f"rq:queue:{QUEUE}:intermediate", job_id)
    connection.set(f"rq:queue:{QUEUE}:intermediate:first_seen:{job_id}", time.time() - 3600)
    return job_id


def plant_queued(connection, markers, listener, job_id: str, **job) -> str:
    plant_job(connection, job_id, markers, listener, status="queued", **job)
    connection.sadd("rq:queues", f"rq:queue:{QUEUE}")
    connection.rpush(f"rq:queue:{QUEUE}", job_id)
    return job_id


def wait_while_running(condition, what: str, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """wait_until ``condition``; ``process`` exiting first fails at once, either failure with the end of ``log``."""

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def check() -> bool:
        if condition():
            return True
        if process.poll() is not None:
            raise AssertionError(f"the process exited ({process.returncode}) before {what}:\n{tail()}")
        return False

    wait_until(check, timeout, interval=0.1, message=lambda: f"{what}\n{tail()}")


def collect_one_batch(redis_url: str, run_name: str) -> None:
    """A legitimate run: one batch of real rollouts, then stop()."""
    with redis_actors(redis_url, run_name, collect_timeout=60) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        assert actors.collect_outputs("cpu").record.rewards.shape == (16, 2)


@contextlib.contextmanager
def worker_process(kind: str, redis_url: str, log: Path) -> Iterator[subprocess.Popen]:
    command = [*WORKER_COMMANDS[kind], redis_url]
    if kind != "rqrl worker":
        command.append(QUEUE)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        stop_process(process)


SECURED_DASHBOARD = ("import sys, rq_dashboard.cli, rq_dashboard.web; "
                     "from rqrl.cli.dashboard import secure_rq_dashboard; "
                     "secure_rq_dashboard(rq_dashboard.web); "
                     "rq_dashboard.cli.run.main(args=['--json', *sys.argv[1:]], prog_name='dashboard')")


@pytest.mark.parametrize("kind", list(WORKER_COMMANDS))
def test_worker_maintenance_and_jobs_run_no_planted_pickle_callback_or_webhook(kind, connection, redis_url,
                                                                                run_name, markers, listener,
                                                                                tmp_path):
    wip = plant_expired_started(connection, markers, listener)
    stuck = plant_stuck_intermediate(connection, markers, listener)
    allowed = plant_queued(connection, markers, listener, "planted-allowed")
    forbidden = plant_queued(connection, markers, listener, "planted-forbidden", func="os.system",
                             args=(f"touch {markers / 'os-system'}",))
    log = tmp_path / "worker.log"
    with worker_process(kind, redis_url, log) as process:
        # the worker cleans its queue's registries when it starts, before it dequeues anything
        wait_while_running(lambda: not connection.zrange(f"rq:wip:{QUEUE}", 0, -1),
                           "the expired started entry is cleaned", process, log)
        wait_while_running(lambda: not connection.llen(f"rq:queue:{QUEUE}:intermediate"),
                           "the stuck intermediate entry is cleaned", process, log)
        wait_while_running(lambda: job_status(connection, allowed) == "finished"
                           and job_status(connection, forbidden) == "failed", "the planted queued jobs end",
                           process, log)
        collect_one_batch(redis_url, run_name)
        assert process.poll() is None
    failed = set(connection.zrange(f"rq:failed:{QUEUE}", 0, -1))
    assert {wip.encode(), stuck.encode(), forbidden.encode()} <= failed, failed
    time.sleep(0.5)  # the point: a webhook in flight would land by now
    assert_nothing_ran(markers, listener, log)


def test_learner_stop_runs_no_planted_callback_or_webhook(connection, redis_url, run_name, markers, listener,
                                                          workers):
    workers.start("legit")
    with redis_actors(redis_url, run_name, collect_timeout=60) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")
        # planted after the worker's start-up maintenance: only stop() meets it
        plant_expired_started(connection, markers, listener)
    time.sleep(0.5)  # the point: a webhook in flight would land by now
    assert_nothing_ran(markers, listener)


@pytest.mark.parametrize("launch", [
    pytest.param([sys.executable, "-m", "rqrl", "dashboard"], id="rqrl dashboard"),
    pytest.param([sys.executable, "-c", SECURED_DASHBOARD], id="secure_rq_dashboard"),
])
def test_dashboard_job_pages_and_actions_unpickle_nothing(launch, connection, redis_url, markers, listener,
                                                          tmp_path):
    viewed = plant_job(connection, "planted-viewed", markers, listener, status="failed")
    requeued = plant_job(connection, "planted-requeued", markers, listener, status="failed")
    connection.zadd(f"rq:failed:{QUEUE}", {viewed: time.time() + 3600, requeued: time.time() + 3600})
    connection.sadd("rq:queues", f"rq:queue:{QUEUE}")
    port = free_port()
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*launch, "--redis-url", redis_url, "--bind", "127.0.0.1", "--port", str(port)],
                                   cwd=REPO_ROOT, env=worker_env(), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        get_json(f"{base}/0/data/queues.json", process, log, timeout=60)  # the dashboard answers
        for path, data in [(f"/0/view/job/{viewed}", None), (f"/0/data/job/{viewed}.json", None),
                           (f"/0/data/jobs/{QUEUE}/failed/8/asc/1.json", None),
                           (f"/job/{requeued}/requeue", b"")]:
            with contextlib.suppress(urllib.error.HTTPError):  # a refusal is fine; running the payload is not
                urllib.request.urlopen(base + path, data=data, timeout=10).close()
        assert process.poll() is None
    finally:
        stop_process(process)
    assert_nothing_ran(markers, listener, log)
