"""RQ's job, queue and registry classes as rqrl uses them: JSON only, no callbacks, no webhooks.

RQ reads a job's ``meta``, result and arguments with the serializer of the object that fetches
it (pickle unless told otherwise), resolves ``success/failure/stopped_callback_name`` and the job
function by importing the dotted names stored in the job's hash, and POSTs the job to the
``webhooks`` URLs stored there. Its maintenance (``clean_registries``, the intermediate-queue
clean-up) fetches jobs with whatever job class and serializer its queues and registries were built
with, which is plain ``rq.job.Job`` with pickle in many places (``rq worker``'s queues, a registry
built from a queue). Anyone able to write Redis could then run code in every rqrl process.

Every RQ object rqrl builds comes from here, and each forces :class:`RolloutJob` and the JSON
serializer whatever it is given, so no path through it can unpickle or call what Redis data names.
docs/redis-security.md maps the RQ paths this closes; the RQ versions it was checked on are
:data:`TESTED_RQ_VERSIONS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, worker_registration
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from rqrl.engine.enqueue import ALLOWED_JOB_FUNCTIONS
from rqrl.errors import ForbiddenJobError

log = logging.getLogger(__name__)

TESTED_RQ_VERSIONS = ("2.12.0",)  # tests/integration/test_rq_safety.py runs the attacks against these


class RolloutJob(Job):
    """An RQ job read with JSON only, that runs only rqrl's job functions and never a callback or
    webhook named in its data.

    RQ resolves a job's function and its success/failure/stopped callbacks by importing the dotted
    names stored in Redis, and sends the job to the webhook URLs stored there, so anyone able to
    write a job could otherwise run any importable function (``os.system``) or make every worker
    call any URL, even with the JSON serializer. The serializer is forced to JSON whatever the caller
    passes, so ``meta``, results and arguments are never unpickled.
    """

    allowed_functions: frozenset[str] = ALLOWED_JOB_FUNCTIONS  # a subclass may extend it

    def __init__(self, id: str | None = None, connection: redis.Redis | None = None,
                 serializer: Any = None) -> None:
        super().__init__(id, connection=connection, serializer=JSONSerializer)

    @property
    def func(self) -> Callable[..., Any]:
        if self.func_name not in self.allowed_functions or self.instance is not None:
            raise ForbiddenJobError(
                f"refusing job {self.id}: it calls {self.func_name!r}, and rqrl workers only run "
                f"{sorted(self.allowed_functions)}"
            )
        return super().func

    def _refuse_callback(self, name: str | None) -> None:
        if name:
            log.warning("job %s names callback %r; rqrl workers never run callbacks from job data", self.id, name)

    @property
    def success_callback(self) -> None:
        self._refuse_callback(self._success_callback_name)
        return None

    @property
    def failure_callback(self) -> None:
        self._refuse_callback(self._failure_callback_name)
        return None

    @property
    def stopped_callback(self) -> None:
        self._refuse_callback(self._stopped_callback_name)
        return None

    def restore(self, raw_data: Any) -> Any:
        """RQ's restore, then drop any webhooks the hash names (rqrl never sets any)."""
        result = super().restore(raw_data)
        if self.webhooks:
            log.warning("job %s names webhooks %s; rqrl never calls URLs from job data",
                        self.id, [webhook.url for webhook in self.webhooks])
            self.webhooks = []
        return result

    def send_webhooks(self, status: str | JobStatus, *, exc_string: str | None = None) -> None:
        """Never send: a URL in a job's hash is whatever a Redis writer put there."""
        if self.webhooks:
            log.warning("job %s: not sending its webhooks; rqrl never calls URLs from job data", self.id)


class RolloutQueue(Queue):
    """An RQ queue whose jobs are always :class:`RolloutJob` (or a subclass it is given) read with JSON."""

    job_class = RolloutJob

    def __init__(self, name: str = "default", connection: redis.Redis | None = None, *args: Any,
                 **kwargs: Any) -> None:
        job_class = kwargs.get("job_class")
        if not (isinstance(job_class, type) and issubclass(job_class, RolloutJob)):
            kwargs["job_class"] = RolloutJob
        kwargs["serializer"] = JSONSerializer
        super().__init__(name, connection, *args, **kwargs)


class _RolloutRegistry:
    """Registry mix-in: jobs are fetched as RolloutJob with JSON, and its queue is a RolloutQueue."""

    def __init__(self, name: str = "default", connection: redis.Redis | None = None, job_class: Any = None,
                 queue: Queue | None = None, serializer: Any = None, death_penalty_class: Any = None) -> None:
        if queue is not None:
            name, connection = queue.name, queue.connection
        super().__init__(name, connection, job_class=RolloutJob, serializer=JSONSerializer,  # type: ignore[call-arg]
                         death_penalty_class=death_penalty_class)

    def get_queue(self) -> RolloutQueue:
        return RolloutQueue(self.name, connection=self.connection)  # type: ignore[attr-defined]


class RolloutStartedJobRegistry(_RolloutRegistry, StartedJobRegistry):
    """RQ's started registry; its clean-up runs no callback and unpickles nothing."""


class RolloutFailedJobRegistry(_RolloutRegistry, FailedJobRegistry):
    """RQ's failed registry with rqrl's job class and JSON."""


class RolloutFinishedJobRegistry(_RolloutRegistry, FinishedJobRegistry):
    """RQ's finished registry with rqrl's job class and JSON."""


class RolloutDeferredJobRegistry(_RolloutRegistry, DeferredJobRegistry):
    """RQ's deferred registry with rqrl's job class and JSON."""


class RolloutScheduledJobRegistry(_RolloutRegistry, ScheduledJobRegistry):
    """RQ's scheduled registry with rqrl's job class and JSON."""


class RolloutCanceledJobRegistry(_RolloutRegistry, CanceledJobRegistry):
    """RQ's canceled registry with rqrl's job class and JSON."""


def rollout_queue(name: str, connection: redis.Redis) -> RolloutQueue:
    """The RQ queue ``name`` as rqrl reads it (RolloutJob, JSON)."""
    return RolloutQueue(name, connection=connection)


def started_registry(queue_name: str, connection: redis.Redis) -> RolloutStartedJobRegistry:
    """RQ's started registry of ``queue_name``; its clean-up (``get_job_ids``) is safe to run."""
    return RolloutStartedJobRegistry(queue_name, connection)


def failed_registry(queue_name: str, connection: redis.Redis) -> RolloutFailedJobRegistry:
    """RQ's failed registry of ``queue_name``, read with rqrl's job class and JSON."""
    return RolloutFailedJobRegistry(queue_name, connection)


def clean_registries(queue_name: str, connection: redis.Redis,
                     exception_handlers: list[Callable[..., Any]] | None = None) -> None:
    """RQ's ``clean_registries`` for one queue, with registries that fetch jobs as RolloutJob with JSON."""
    RolloutFinishedJobRegistry(queue_name, connection).cleanup()
    RolloutStartedJobRegistry(queue_name, connection).cleanup(exception_handlers=exception_handlers)
    RolloutFailedJobRegistry(queue_name, connection).cleanup()
    RolloutDeferredJobRegistry(queue_name, connection).cleanup()


def clean_queue(worker: BaseWorker, queue_name: str) -> None:
    """One worker's maintenance of ``queue_name``: RQ's registry, worker-registry and intermediate-queue
    clean-up, all through rqrl's classes; only one worker at a time does it (RQ's maintenance lock)."""
    queue = rollout_queue(queue_name, worker.connection)
    if not queue.acquire_maintenance_lock():
        return
    try:
        log.info("worker %s: cleaning the registries of queue %s", worker.name, queue_name)
        clean_registries(queue_name, worker.connection, worker._exc_handlers)
        worker_registration.clean_worker_registry(queue)
        queue.intermediate_queue.cleanup(worker, queue)  # fetches with queue.job_class: RolloutJob
    finally:
        queue.release_maintenance_lock()


def as_rollout_job(job: Job) -> RolloutJob | None:
    """``job`` as a RolloutJob (fetched again with JSON if it is another class); None if it is gone."""
    if isinstance(job, RolloutJob):
        return job
    try:
        return RolloutJob.fetch(job.id, connection=job.connection)  # type: ignore[return-value]
    except NoSuchJobError:
        return None
