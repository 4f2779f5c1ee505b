"""rq-dashboard as ``rqrl dashboard`` serves it: every job read through rqrl's classes with JSON, Redis text
shown as text under a script policy (rqrl/cli/dashboard_pages.py), and a job that is gone or that RQ cannot
read explained instead of a 500.

rq-dashboard's views (module ``rq_dashboard.web``) fetch jobs with pickle on its job page and its delete and
requeue actions, and one job hash that RQ cannot parse (a field of the wrong type, a job id RQ refuses, a key
that is not a hash) makes its whole job list answer 500. :func:`secure_rq_dashboard` swaps its classes and
wraps its job views before Flask registers them.
"""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from flask import current_app, jsonify, request
from flask.blueprints import BlueprintSetupState  # flask.sansio only from Flask 3
from rq.exceptions import DeserializationError, InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker, Worker

from rqrl.cli.cross_site import refuse_cross_site_actions
from rqrl.cli.dashboard_pages import add_security_headers, csp_nonce, escaping
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

log = logging.getLogger(__name__)

UNREADABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ResponseError, InvalidJobOperation, DeserializationError, ValueError, TypeError, KeyError, AssertionError)
"""What RQ raises reading a job hash that it did not write: WRONGTYPE for a key that is not a hash, ValueError
for a job id it refuses, a date, number, status or JSON field it cannot parse, or bytes that are not UTF-8,
InvalidJobOperation for a hash without a status, AssertionError for a timeout it cannot parse."""

GONE_JOB_MESSAGE = (
    "job {job_id} is no longer in Redis: rqrl keeps a finished job for 0 s (its rollouts went to the learner), "
    f"a failed one for {ERROR_TTL_SECONDS // 3600} h, and removes a run's jobs when its learner stops"
)
UNREADABLE_JOB_MESSAGE = (
    "job {job_id} is unreadable ({reason}): rqrl and RQ never write a job like this, so someone who can write "
    "Redis did; look at it with redis-cli (TYPE and HGETALL rq:job:{job_id}) and delete it there"
)


@dataclass(frozen=True, kw_only=True)
class UnreadableJob:
    """A job id in a queue or registry whose hash RQ cannot read, listed as such instead of failing the list."""

    id: str
    reason: str

    @classmethod
    def from_error(cls, job_id: str, error: Exception) -> UnreadableJob:
        """The job ``job_id`` that RQ failed to read with ``error`` (its traceback logged at DEBUG: the pages
        ask again every few seconds)."""
        log.debug("the dashboard cannot read job %r", job_id, exc_info=error)
        return cls(id=job_id, reason=f"{type(error).__name__}: {error}"[:300])

    def as_row(self) -> dict[str, Any]:
        """The job as rq-dashboard's job list serializes one (``serialize_job``): its id and why it is unreadable."""
        return {"id": self.id, "created_at": None, "started_at": None, "ended_at": None, "exc_info": None,
                "description": f"unreadable job: {self.reason}"}

    def as_job_data(self) -> dict[str, Any]:
        """The job as rq-dashboard's job page reads it (``job_info``), with status ``unreadable``."""
        return {**self.as_row(), "status": "unreadable", "origin": None, "enqueued_at": None, "result": None,
                "metadata": None}


def _job_hash_exists(connection: redis.Redis, job_id: str) -> bool:
    """Whether Redis holds a key for job ``job_id`` (RQ says NoSuchJobError also for a hash it cannot read)."""
    return bool(connection.exists(f"{Job.redis_job_namespace_prefix}{job_id}"))


def _dashboard_connection() -> redis.Redis:
    """The Redis connection rq-dashboard opened for this request."""
    connection: redis.Redis = current_app.redis_conn  # type: ignore[attr-defined]
    return connection


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
    """RolloutQueue whose default name is rqrl's queue (rq-dashboard's Jobs tab opens on the queue it builds
    without a name, "default", where rqrl puts nothing), and whose jobs the list shows even when unreadable."""

    def __init__(self, name: str = DEFAULT_QUEUE, connection: redis.Redis | None = None, *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(name, connection, *args, **kwargs)

    def fetch_job(self, job_id: str) -> Job | UnreadableJob:  # type: ignore[override]
        """The job ``job_id``, or an UnreadableJob where RQ's fetch_job would raise or skip it (gone, unreadable);
        only rq-dashboard's job list calls it."""
        try:
            job = self.job_class.fetch(job_id, connection=self.connection, serializer=self.serializer)
        except NoSuchJobError as error:
            if _job_hash_exists(self.connection, job_id):  # a hash without the fields RQ needs
                return UnreadableJob.from_error(job_id, error)
            self.remove(job_id)  # RQ's own clean-up of a queued id whose hash is gone
            return UnreadableJob(id=job_id, reason=GONE_JOB_MESSAGE.format(job_id=job_id))
        except UNREADABLE_ERRORS as error:
            return UnreadableJob.from_error(job_id, error)
        return job


def tolerant_serialize_job(serialize_job: Callable[[Job], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    """rq-dashboard's ``serialize_job``, answering an unreadable job's row where reading its fields raises."""
    if getattr(serialize_job, "rqrl_tolerant", False):
        return serialize_job

    @functools.wraps(serialize_job)
    def tolerant(job: Job | UnreadableJob) -> dict[str, Any]:
        if isinstance(job, UnreadableJob):
            return job.as_row()
        try:
            return serialize_job(job)
        except UNREADABLE_ERRORS as error:  # its latest result, or a field read lazily
            return UnreadableJob.from_error(job.id, error).as_row()

    tolerant.rqrl_tolerant = True  # type: ignore[attr-defined]
    return tolerant


def _job_page(view: Callable[..., Any], *, data: bool) -> Callable[..., Any]:
    """rq-dashboard's job page (``data``: its JSON) for a job RQ cannot read: the page answers 422 and says why,
    the JSON an UnreadableJob, which the page shows."""

    @functools.wraps(view)
    def page(*args: Any, **kwargs: Any) -> Any:
        job_id = str(kwargs.get("job_id", "?"))
        try:
            return view(*args, **kwargs)
        except NoSuchJobError as error:
            if not _job_hash_exists(_dashboard_connection(), job_id):
                raise  # gone: _gone_job answers
            job = UnreadableJob.from_error(job_id, error)
        except UNREADABLE_ERRORS as error:
            job = UnreadableJob.from_error(job_id, error)
        if data:
            return jsonify(job.as_job_data()), 200, {"Cache-Control": "no-store"}
        message = UNREADABLE_JOB_MESSAGE.format(job_id=job.id, reason=job.reason)
        return f"<!doctype html><title>Job unreadable</title><h1>Job unreadable</h1><p>{html.escape(message)}.</p>", 422

    return page


def _gone_job(error: NoSuchJobError) -> tuple[Any, int]:
    """A 404 that says the job is gone (rq-dashboard answers a bare 500), as JSON for its data URLs."""
    job_id = (request.view_args or {}).get("job_id", "?")
    message = GONE_JOB_MESSAGE.format(job_id=job_id)
    if "/data/" in request.path:
        return jsonify({"error": message}), 404
    return f"<!doctype html><title>Job gone</title><h1>Job gone</h1><p>{html.escape(message)}.</p>", 404


def _set_up_app(state: BlueprintSetupState) -> None:
    """Once per app that registers rq-dashboard's blueprint: escaping templates, the security headers on every
    response, actions from other sites refused, and its job page and job data tolerant of unreadable jobs."""
    app = state.app
    app.jinja_loader = escaping(app.jinja_loader)  # rq-dashboard's app finds the blueprint's templates first
    app.add_template_global(csp_nonce, "csp_nonce")
    app.before_request(refuse_cross_site_actions)
    app.after_request(add_security_headers)
    prefix = ".".join(part for part in (state.name_prefix, state.name) if part)
    for endpoint, data in (("job_view", False), ("job_info", True)):
        name = f"{prefix}.{endpoint}"
        if name in app.view_functions:
            app.view_functions[name] = _job_page(app.view_functions[name], data=data)


def secure_rq_dashboard(web: Any) -> None:
    """Make rq-dashboard's views (module ``rq_dashboard.web``) read every job, queue, registry and
    worker through rqrl's classes: its job page and its delete and requeue actions otherwise fetch
    jobs with pickle. Its Jobs tab opens on rqrl's queue, a gone job's page says so (a 404), an unreadable
    job is listed as such, its pages show Redis text as text under a Content-Security-Policy, and its actions
    are refused when another site sends them (``rqrl.cli.cross_site``).
    Call it before the blueprint is registered on an app."""
    blueprint = web.blueprint
    if not getattr(blueprint, "_got_registered_once", False):  # Flask refuses set-up once registered
        if not getattr(blueprint, "rqrl_secured", False):
            blueprint.register_error_handler(NoSuchJobError, _gone_job)
            blueprint.record_once(_set_up_app)
            blueprint.rqrl_secured = True
    elif not getattr(blueprint, "rqrl_secured", False):
        log.warning("rq-dashboard's blueprint was registered before secure_rq_dashboard: its pages keep no "
                    "script policy; call it first")
    blueprint.jinja_loader = escaping(blueprint.jinja_loader)
    web.Job = RolloutJob
    web.Queue = DashboardQueue
    web.Worker = DashboardWorker
    web.requeue_job = _requeue_job
    web.serialize_job = tolerant_serialize_job(web.serialize_job)
    web.StartedJobRegistry = RolloutStartedJobRegistry
    web.FailedJobRegistry = RolloutFailedJobRegistry
    web.FinishedJobRegistry = RolloutFinishedJobRegistry
    web.DeferredJobRegistry = RolloutDeferredJobRegistry
    web.ScheduledJobRegistry = RolloutScheduledJobRegistry
    web.CanceledJobRegistry = RolloutCanceledJobRegistry
