"""A Redis writer without RQRL_SECRET plants jobs for RQ's own maintenance paths (issue 9, items 1
and 2): pickled ``meta`` that runs ``os.system``, ``*_callback_name`` naming an importable function,
and ``webhooks`` naming a URL. Real `rqrl worker` and `rq worker -w rqrl.engine.worker.RolloutWorker`
processes (with and without ``-S``), the learner's ``stop()`` and `rqrl dashboard` must neither
unpickle the payload, call the function, nor request the URL, and a real run must still work.

Every payload leaves a trace if it runs: the pickle touches ``pickle-<job id>`` and the callback
writes ``callback-<job id>`` in a marker folder; each webhook points at a listener on 127.0.0.1
that records every request.

The tests here run in-process; those that start processes are in tests/processes/test_rq_safety.py.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.timeout(180)

MARKER_DIR_ENV = "RQRL_TEST_HOSTILE_MARKERS"
QUEUE = "rqrl"
CALLBACK = f"{__name__}.hostile_callback"


def hostile_callback(job, *args, **kwargs) -> None:  # noqa: ANN001 - RQ's callback signature
    """What a planted ``*_callback_name`` names: leaves ``callback-<job id>`` if anyone calls it."""
    (Path(os.environ[MARKER_DIR_ENV]) / f"callback-{job.id}").write_text("called")


class _Touch:
    """Unpickling this runs ``touch PATH`` (the classic pickle payload)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


class Listener:
    """An HTTP server on 127.0.0.1 that records every request (a webhook's target)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                listener.requests.append(f"{self.command} {self.path}")
                self.send_response(200)
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:  # noqa: ANN002
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def markers(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir()
    monkeypatch.setenv(MARKER_DIR_ENV, str(folder))  # for the learner here and every process started below
    return folder


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as server:
        yield server


def plant_job(connection: redis.Redis, job_id: str, markers: Path, listener: Listener,
              func: str = "rqrl.maze.jobs.run_actor_group", args: tuple = ("no-such-run", 0, 0),
              status: str = "started") -> str:
    """Write a JSON job hash by hand, as a Redis writer without the secret can: pickled ``meta``, a
    failure, success and stopped callback, and webhooks on failure and success."""
    webhooks = [{"url": f"{listener.url}/{job_id}/{status}", "job_status": job_status, "method": "POST",
                 "headers": None, "timeout": 5} for job_status in ("failed", "finished")]
    connection.hset(f"rq:job:{job_id}", mapping={
        "data": json.dumps([func, None, list(args), {}]),
        "origin": QUEUE,
        "description": "planted",
        "status": status,
        "created_at": "2024-01-01T00:00:00.000000Z",
        "meta": pickle.dumps(_Touch(markers / f"pickle-{job_id}")),
        "failure_callback_name": CALLBACK,
        "success_callback_name": CALLBACK,
        "stopped_callback_name": CALLBACK,
        "webhooks": json.dumps(webhooks),
        "timeout": -1,
    })
    return job_id


def plant_expired_started(connection, markers, listener, job_id: str = "planted-wip") -> str:
    """A job in the started registry whose worker died long ago: RQ's clean-up fails it."""
    plant_job(connection, job_id, markers, listener)
    connection.zadd(f"rq:wip:{QUEUE}", {f"{job_id}:planted-execution": 1})
    return job_id


def assert_nothing_ran(markers: Path, listener: Listener, log: Path | None = None) -> None:
    ran = sorted(path.name for path in markers.iterdir())
    tail = f"\nlog:\n{log.read_text()[-3000:]}" if log is not None and log.exists() else ""
    assert not ran and not listener.requests, \
        f"planted payloads ran: {ran}; planted webhooks were called: {listener.requests}{tail}"


WORKER_COMMANDS = {
    "rqrl worker": [sys.executable, "-m", "rqrl", "worker", "--log-level", "INFO", "--redis-url"],
    "rq worker -w RolloutWorker": [sys.executable, "-m", "rq.cli", "worker", "-w", "rqrl.engine.worker.RolloutWorker",
                                   "--url"],
    "rq worker -w RolloutWorker -S json": [sys.executable, "-m", "rq.cli", "worker", "-w",
                                           "rqrl.engine.worker.RolloutWorker", "-S", "rq.serializers.JSONSerializer",
                                           "--url"],
}


def job_status(connection: redis.Redis, job_id: str) -> str | None:
    status = connection.hget(f"rq:job:{job_id}", "status")
    return status.decode() if status is not None else None


def test_learner_stop_cleans_up_through_rqrl_classes_only(connection, redis_url, run_name, markers, listener):
    """The registry helpers stop() is to use: RQ's started-registry clean-up there runs no callback, no
    webhook, and unpickles nothing; the failed registry deletes jobs without unpickling them."""
    from rqrl.engine.rq_safety import failed_registry, rollout_queue, started_registry

    wip = plant_expired_started(connection, markers, listener)
    assert started_registry(QUEUE, connection).get_job_ids() == []  # the clean-up ran: the entry is failed
    failed = failed_registry(QUEUE, connection)
    assert wip in failed.get_job_ids()
    assert rollout_queue(QUEUE, connection).fetch_job(wip).meta == {"unserialized": pickle.dumps(
        _Touch(markers / f"pickle-{wip}"))}
    failed.remove(wip, delete_job=True)
    assert not connection.exists(f"rq:job:{wip}")
    assert_nothing_ran(markers, listener)


def test_rollout_worker_rebuilds_the_pickle_queues_rq_command_line_hands_it(connection):
    from rq import Queue
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from rqrl.engine.rq_safety import RolloutQueue
    from rqrl.engine.worker import RolloutJob, RolloutWorker

    given = [Queue(QUEUE, connection=connection, job_class=Job, serializer="rq.serializers.DefaultSerializer")]
    worker = RolloutWorker(given, connection=connection, job_class=Job, queue_class=Queue,
                           serializer="rq.serializers.DefaultSerializer")
    assert [queue.name for queue in worker.queues] == [QUEUE]
    for queue in [*worker.queues, *worker._ordered_queues]:
        assert isinstance(queue, RolloutQueue) and queue.job_class is RolloutJob
        assert queue.serializer is JSONSerializer
    assert worker.serializer is JSONSerializer and worker.job_class is RolloutJob


def test_rollout_job_reads_with_json_whatever_serializer_it_is_given(connection, markers, listener):
    from rqrl.engine.worker import RolloutJob

    job_id = plant_job(connection, "planted-fetched", markers, listener)
    job = RolloutJob.fetch(job_id, connection=connection, serializer="rq.serializers.DefaultSerializer")
    assert job.meta == {"unserialized": connection.hget(f"rq:job:{job_id}", "meta")}
    assert job.webhooks == [] and job.failure_callback is None and job.success_callback is None
    job.execute_failure_callback(None)  # returns before it needs a death penalty: there is no callback
    job.send_webhooks("failed", exc_string="")
    time.sleep(0.2)  # the point: a webhook sent in the background would land by now
    assert_nothing_ran(markers, listener)
