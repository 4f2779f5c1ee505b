"""rq-dashboard as ``rqrl dashboard`` serves it: every job, queue, registry and worker read through rqrl's
classes with JSON (rq-dashboard's job page and its delete and requeue actions otherwise fetch jobs with
pickle), and a job that is gone explained instead of a 500. Only the ``dashboard`` command uses it."""

from __future__ import annotations

import html
from typing import Any

import redis
from flask import jsonify, request
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker, Worker

from rqrl.engine.enqueue import ERROR_TTL_SECONDS
from rqrl.engine.keys import DEFAULT_QUEUE
from rqrl.engine.rq_safety import (
    RolloutCanceledJobRegistry,
    RolloutDeferredJobRegistry,
    RolloutFailedJobRegistry,
    RolloutFinishedJobRegistry,
    RolloutJob,
    RolloutQueue,
    RolloutScheduledJobRegistry,
    RolloutStartedJobRegistry,
)


def _requeue_job(job_id: str, connection: redis.Redis, serializer: Any = None) -> Job:
    """RQ's ``requeue_job``, fetching the job as a RolloutJob with JSON whatever ``serializer`` says."""
    return RolloutJob.fetch(job_id, connection=connection).requeue()


class DashboardWorker(Worker):
    """RQ's Worker as the dashboard lists it: busy workers' jobs are read as RolloutJob with JSON."""

    job_class = RolloutJob
    queue_class = RolloutQueue

    @classmethod
    def all(cls, *args: Any, **kwargs: Any) -> list[BaseWorker]:
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = RolloutJob
        kwargs["queue_class"] = RolloutQueue
        return super().all(*args, **kwargs)


class DashboardQueue(RolloutQueue):
    """RolloutQueue whose default name is rqrl's queue: rq-dashboard's Jobs tab opens on the queue it builds
    without a name ("default", where rqrl puts nothing)."""

    def __init__(self, name: str = DEFAULT_QUEUE, connection: redis.Redis | None = None, *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(name, connection, *args, **kwargs)


GONE_JOB_MESSAGE = (
    "job {job_id} is no longer in Redis: rqrl keeps a finished job for 0 s (its rollouts went to the learner), "
    f"a failed one for {ERROR_TTL_SECONDS // 3600} h, and removes a run's jobs when its learner stops"
)


def _gone_job(error: NoSuchJobError) -> tuple[Any, int]:
    """A 404 that says the job is gone (rq-dashboard answers a bare 500), as JSON for its data URLs."""
    job_id = (request.view_args or {}).get("job_id", "?")
    message = GONE_JOB_MESSAGE.format(job_id=job_id)
    if "/data/" in request.path:
        return jsonify({"error": message}), 404
    return f"<!doctype html><title>Job gone</title><h1>Job gone</h1><p>{html.escape(message)}.</p>", 404


def secure_rq_dashboard(web: Any) -> None:
    """Make rq-dashboard's views (module ``rq_dashboard.web``) read every job, queue, registry and
    worker through rqrl's classes: its job page and its delete and requeue actions otherwise fetch
    jobs with pickle. Its Jobs tab opens on rqrl's queue, and a gone job's page says so (a 404)."""
    if not getattr(web.blueprint, "_got_registered_once", False):  # Flask refuses set-up once registered
        web.blueprint.register_error_handler(NoSuchJobError, _gone_job)
    web.Job = RolloutJob
    web.Queue = DashboardQueue
    web.Worker = DashboardWorker
    web.requeue_job = _requeue_job
    web.StartedJobRegistry = RolloutStartedJobRegistry
    web.FailedJobRegistry = RolloutFailedJobRegistry
    web.FinishedJobRegistry = RolloutFinishedJobRegistry
    web.DeferredJobRegistry = RolloutDeferredJobRegistry
    web.ScheduledJobRegistry = RolloutScheduledJobRegistry
    web.CanceledJobRegistry = RolloutCanceledJobRegistry
