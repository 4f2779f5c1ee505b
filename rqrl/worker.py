"""The rqrl RQ worker: a non-forking SimpleWorker with the JSON serializer, so envs, policies
and weights stay warm between jobs.

RQ's default ``Worker`` forks a work-horse per job, which would rebuild the env and policy and
re-import torch for every job (``benchmarks/worker_overhead.py`` measures it). Start one with
``rqrl worker`` or ``rq worker -w rqrl.worker.RolloutWorker -S rq.serializers.JSONSerializer rqrl``.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any

import redis
import torch
from rq import Queue, SimpleWorker, get_current_job, worker_registration
from rq.job import Job
from rq.serializers import JSONSerializer

from rqrl.connection import connect
from rqrl.errors import ForbiddenJobError
from rqrl.jobs import ALLOWED_JOB_FUNCTIONS, HEARTBEAT_SECONDS, configure_secret, set_heartbeat_hook
from rqrl.process import exit_when_orphaned

log = logging.getLogger(__name__)

DEFAULT_QUEUE = "rqrl"
_running: RolloutWorker | None = None


class RolloutJob(Job):
    """An RQ job that runs only rqrl's own job functions and never a callback named in its data.

    RQ resolves a job's function (and its success/failure/stopped callbacks) by importing the
    dotted names stored in Redis, so anyone able to write a job could otherwise run any importable
    function (``os.system``) on every worker, even with the JSON serializer.
    """

    allowed_functions: frozenset[str] = ALLOWED_JOB_FUNCTIONS  # a subclass may extend it

    @property
    def func(self):  # noqa: ANN201 - RQ's signature
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
    def success_callback(self):  # noqa: ANN201
        self._refuse_callback(self._success_callback_name)
        return None

    @property
    def failure_callback(self):  # noqa: ANN201
        self._refuse_callback(self._failure_callback_name)
        return None

    @property
    def stopped_callback(self):  # noqa: ANN201
        self._refuse_callback(self._stopped_callback_name)
        return None


class RolloutWorker(SimpleWorker):
    """SimpleWorker with JSON job payloads, RolloutJob (rqrl's functions only), one torch thread,
    and heartbeats for long slices. The shared secret comes from ``secret`` or ``RQRL_SECRET``."""

    def __init__(self, *args: Any, secret: str | bytes | None = None, **kwargs: Any):
        if kwargs.get("serializer") not in (None, JSONSerializer):
            log.warning("rqrl workers use the JSON serializer; ignoring %s", kwargs["serializer"])
        job_class = kwargs.get("job_class")
        if job_class is not None and not (isinstance(job_class, type) and issubclass(job_class, RolloutJob)):
            log.warning("rqrl workers run RolloutJob or a subclass; ignoring job class %s", job_class)
            job_class = None
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = job_class or RolloutJob
        # a heartbeat every HEARTBEAT_SECONDS while idle (RQ waits worker_ttl - 15 s per dequeue),
        # so the learner can tell live workers from killed ones (see workers_alive)
        kwargs.setdefault("worker_ttl", int(HEARTBEAT_SECONDS) + 15)
        self._check_registration = True  # off once the ACL user turns out not to allow the check
        super().__init__(*args, **kwargs)
        torch.set_num_threads(1)
        configure_secret(secret or os.environ.get("RQRL_SECRET"))

    def heartbeat(self, timeout: int | None = None, pipeline=None) -> None:  # noqa: ANN001 - RQ's signature
        """RQ's heartbeat, plus registering again if Redis lost our registration (a restart without
        persistence), so the learner keeps counting this worker."""
        super().heartbeat(timeout, pipeline)
        if pipeline is None:
            self.register_again_if_lost()

    def register_again_if_lost(self) -> None:
        """Register again if Redis lost our registration (a restart without persistence): RQ's
        heartbeat rewrites the worker's hash, but not its entries in the registries of workers."""
        if not self._check_registration:
            return
        registries = [self.redis_workers_keys, *(worker_registration.WORKERS_BY_QUEUE_KEY % name
                                                  for name in self.queue_names())]
        try:
            with self.connection.pipeline(transaction=False) as check:
                check.hget(self.key, "birth")
                for registry in registries:
                    check.sismember(registry, self.key)
                if all(check.execute()):
                    return
        except redis.exceptions.NoPermissionError as error:
            self._check_registration = False
            log.warning("worker %s cannot check its registration (%s): it will not register again after a Redis "
                        "restart; add +sismember to its ACL user (docs/redis-security.md)", self.name, error)
            return
        log.warning("worker %s: Redis lost its registration (restarted?); registering again", self.name)
        with self.connection.pipeline() as registration:
            registration.hset(self.key, mapping=self.serialize())
            worker_registration.register(self, registration)
            registration.execute()

    def execute_job(self, job, queue):  # noqa: ANN001 - RQ's signature
        global _running
        _running = self
        try:
            return super().execute_job(job, queue)
        finally:
            _running = None


def send_heartbeat() -> None:
    """Called by long jobs: refresh the running worker's and job's heartbeats (no-op elsewhere)."""
    worker = _running
    if worker is None:
        return
    job = get_current_job()
    if job is not None and getattr(worker, "execution", None) is not None:
        worker.maintain_heartbeats(job)  # RQ's heartbeat in a pipeline: check the registration here
        worker.register_again_if_lost()
    else:
        worker.heartbeat()


set_heartbeat_hook(send_heartbeat)


def default_worker_name() -> str:
    return f"rqrl.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def run_worker(
    redis_url: str,
    queue_names: Sequence[str] = (DEFAULT_QUEUE,),
    name: str | None = None,
    burst: bool = False,
    logging_level: str = "WARNING",
    parent_pid: int | None = None,
    secret: str | bytes | None = None,
) -> bool:
    """Connect to ``redis_url`` and work on ``queue_names`` until stopped (SIGTERM/SIGINT).

    With ``parent_pid`` (local workers of a learner) the process dies with its parent.
    """
    if parent_pid is not None:
        exit_when_orphaned(parent_pid)
        os.setsid()  # out of the terminal's process group: Ctrl-C goes to the learner, which stops us
    connection = connect(redis_url)
    queues = [Queue(queue_name, connection=connection, serializer=JSONSerializer) for queue_name in queue_names]
    worker = RolloutWorker(queues, connection=connection, name=name or default_worker_name(), secret=secret)
    return worker.work(burst=burst, logging_level=logging_level, with_scheduler=False)
