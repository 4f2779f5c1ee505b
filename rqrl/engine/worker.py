"""The rqrl RQ worker: a non-forking SimpleWorker with the JSON serializer, so envs, policies
and weights stay warm between jobs.

RQ's default ``Worker`` forks a work-horse per job, which would rebuild the env and policy and
re-import torch for every job (``benchmarks/worker_overhead.py`` measures it). Start one with
``rqrl worker`` or ``rq worker -w rqrl.engine.worker.RolloutWorker -S rq.serializers.JSONSerializer rqrl``.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import uuid
from collections.abc import Sequence
from types import FrameType
from typing import Any

import redis
import torch
from redis.client import Pipeline
from rq import Queue, SimpleWorker, get_current_job, worker_registration
from rq.exceptions import InvalidJobOperation, StopRequested
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.version import VERSION as RQ_VERSION

from rqrl.engine.codec import secret_from_environment
from rqrl.engine.connection import SHUTDOWN_REDIS_GRACE_SECONDS, connect, redact_url, stop_riding_out
from rqrl.engine.health import host_worker_prefix
from rqrl.engine.jobs import configure_secret, set_heartbeat_hook, set_worker_hooks
from rqrl.engine.keys import DEFAULT_QUEUE
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.process import exit_when_orphaned
from rqrl.engine.rq_safety import (
    TESTED_RQ_VERSIONS,
    RolloutJob,
    RolloutQueue,
    as_rollout_job,
    clean_queue,
    rollout_queue,
)
from rqrl.engine.timings import protocol_timings
from rqrl.errors import WorkerUnfitError

__all__ = ["DEFAULT_QUEUE", "RolloutJob", "RolloutWorker", "run_worker", "send_heartbeat"]

log = logging.getLogger(__name__)

_running: RolloutWorker | None = None
_stopping: set[str] = set()  # names of this process's workers asked to stop
_SHUTDOWN_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError)
"""What a Redis that is gone or full raises at a stopping worker: a warning, not a traceback, and exit code 0."""


class _OneLineOutageOnStop(logging.Filter):
    """RQ logs a Redis that vanished under a stopping worker as an unhandled exception, its traceback a screen of
    chained retries; one line says as much, and ``run_worker`` says what it means for the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        name = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if isinstance(error, _SHUTDOWN_REDIS_ERRORS) and isinstance(name, str) and name in _stopping:
            record.exc_info, record.exc_text = None, None
            record.msg = f"{record.msg} ({type(error).__name__}: {str(error).replace('%', '%%')})"
        return True


logging.getLogger("rq.worker").addFilter(_OneLineOutageOnStop())


class RolloutWorker(SimpleWorker):
    """SimpleWorker with JSON job payloads, RolloutJob (rqrl's functions only), one torch thread,
    and heartbeats for long slices. The shared secret comes from ``secret`` or ``RQRL_SECRET``.

    Whatever queues, job class, queue class and serializer it is given (``rq worker`` builds pickle
    queues of plain ``Job`` unless told otherwise), it serves RolloutQueues of RolloutJobs read with
    JSON, and its maintenance (registry and intermediate-queue clean-up) goes through
    :mod:`rqrl.engine.rq_safety`, so nothing it does unpickles, or calls a function or URL named in, Redis data.
    """

    job_class = RolloutJob
    queue_class = RolloutQueue

    def __init__(self, queues: Any, *args: Any, secret: str | bytes | None = None, **kwargs: Any):
        if kwargs.get("serializer") not in (None, JSONSerializer, "json", "rq.serializers.JSONSerializer"):
            log.warning("rqrl workers use the JSON serializer; ignoring %s", kwargs["serializer"])
        job_class = kwargs.get("job_class")
        if job_class is not None and not (isinstance(job_class, type) and issubclass(job_class, RolloutJob)):
            if job_class is not Job:  # rq's command line passes Job when no --job-class is given
                log.warning("rqrl workers run RolloutJob or a subclass; ignoring job class %s", job_class)
            job_class = None
        queue_class = kwargs.get("queue_class")
        if queue_class is not None and not (isinstance(queue_class, type) and issubclass(queue_class, RolloutQueue)):
            if queue_class is not Queue:  # rq's command line passes Queue when no --queue-class is given
                log.warning("rqrl workers use RolloutQueue; ignoring queue class %s", queue_class)
            queue_class = None
        if RQ_VERSION not in TESTED_RQ_VERSIONS:
            log.warning("rqrl's guards against job data were checked on RQ %s, and this is RQ %s: run "
                        "tests/integration/test_rq_safety.py (docs/redis-security.md)",
                        ", ".join(TESTED_RQ_VERSIONS), RQ_VERSION)
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = job_class or RolloutJob
        kwargs["queue_class"] = queue_class or RolloutQueue
        # queues by name only: RQ keeps Queue objects as given, with their job class and serializer
        given = [queues] if isinstance(queues, str | Queue) else list(queues)
        if kwargs.get("connection") is None and len(args) < 3:
            kwargs["connection"] = next((queue.connection for queue in given if isinstance(queue, Queue)), None)
        queues = [queue.name if isinstance(queue, Queue) else queue for queue in given]
        # a heartbeat every ProtocolTimings.heartbeat while idle (each dequeue waits that long, see
        # dequeue_timeout), so the learner can tell live workers from killed ones (see workers_alive)
        self.timings = protocol_timings()
        kwargs.setdefault("worker_ttl", math.ceil(self.timings.heartbeat) + 15)
        self._check_registration = True  # off once the ACL user turns out not to allow the check
        self.shutdown_requested = False  # SIGTERM/SIGINT: the running job ends its slice early (see jobs)
        super().__init__(queues, *args, **kwargs)
        torch.set_num_threads(1)
        configure_secret(secret or secret_from_environment())

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """RQ's start (registering the worker, subscribing), with a SIGTERM or SIGINT until RQ installs its own
        handlers right after it taken as a stop request that the work loop honours before its first dequeue: it
        killed the worker outright before (seen in CI: a worker stopped just after it registered)."""
        if threading.current_thread() is threading.main_thread():  # where RQ installs its own
            for number in (signal.SIGINT, signal.SIGTERM):
                signal.signal(number, self._mark_stopping)
        super().bootstrap(*args, **kwargs)

    def _mark_stopping(self, signum: int, frame: FrameType | None) -> None:
        """A stop asked: the flag the running job reads, RQ's ``_stop_requested`` (its loop reads it before each
        dequeue, and so does ours between dequeue timeouts), and a Redis that is gone no longer held out for (the
        last push, hand-back and deregistration must not hold the exit)."""
        self.shutdown_requested = True
        self._stop_requested = True
        _stopping.add(self.name)
        stop_riding_out(self.connection, SHUTDOWN_REDIS_GRACE_SECONDS)

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """RQ's warm shutdown, plus a flag the running job reads: it ends its slice after the rollout in hand
        and enqueues its continuation, so the worker exits in seconds, not after a whole slice. RQ stops an idle
        worker by raising StopRequested from here, which CPython drops if the signal lands in a __del__ or a weakref
        callback: ``_stop_requested`` stops it all the same (``dequeue_job_and_maintain_ttl``)."""
        self._mark_stopping(signum, frame)
        if self.get_state() == "busy":
            log.warning("worker %s: shutting down; the running job ends after the rollout or episode in hand and "
                        "hands the rest of its work back to the queue", self.name)
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    @property
    def dequeue_timeout(self) -> float:  # type: ignore[override]
        """Seconds each idle dequeue blocks before the next heartbeat: the heartbeat itself (RQ derives a whole
        number of seconds, at least one, from worker_ttl; Redis's BLPOP takes fractions)."""
        return self.timings.heartbeat

    def dequeue_job_and_maintain_ttl(self, timeout: float | None,
                                     max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        """RQ's dequeue, blocking about a dequeue timeout at a time and checking in between for a stop whose
        StopRequested was lost (see request_stop): RQ's own blocks until a job comes. Never between a job's dequeue
        and its run. Burst (no timeout) and ``max_idle_time`` are RQ's as they are."""
        if timeout is None or max_idle_time is not None:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[arg-type]
        while True:
            if self._stop_requested:
                raise StopRequested
            result = super().dequeue_job_and_maintain_ttl(
                timeout, max_idle_time=max(1, math.ceil(timeout)))  # type: ignore[arg-type]
            if result is not None:
                return result

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
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

    def clean_registries(self) -> None:
        """RQ's maintenance of each queue, through rqrl's job class and JSON only (see rq_safety)."""
        for queue in self.queues:
            clean_queue(self, queue.name)
        # rq assigns None in __init__ without a hint, so mypy infers the type None; rq itself assigns now() here
        self.last_cleaned_at = now()  # type: ignore[assignment]

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry | None = None,
                           exc_string: str = "") -> None:
        """RQ's failure handling, on a RolloutJob and a RolloutQueue (no callback, no webhook)."""
        rollout_job = as_rollout_job(job)
        if rollout_job is None:
            log.warning("job %s failed but is gone from Redis; nothing to file", job.id)
            return
        super().handle_job_failure(rollout_job, rollout_queue(queue.name, self.connection), started_job_registry,
                                   exc_string)

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """RQ's logging and handlers of a job's exception; a WorkerUnfitError goes to them without its traceback
        and cause: ``sideline`` said in one line why this worker cannot run the run, and the frames (a signature
        check, an import) add a screen per job handed back."""
        error = exc_info[1] if len(exc_info) > 1 else None
        if isinstance(error, WorkerUnfitError):
            exc_info = (WorkerUnfitError, WorkerUnfitError(str(error)), None)
        super().handle_exception(job, *exc_info)

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry) -> None:
        """RQ's success handling; a job that Redis lost while it ran (a restart without persistence; its hash has no
        status) has nothing left to clean up: one warning, where RQ logged its failure to read the job's status as
        an error with a traceback."""
        try:
            super().handle_job_success(job, queue, started_job_registry)
        except InvalidJobOperation:
            if self.connection.hget(job.key, "status") is not None:
                raise
            # the hash's heartbeat fields, if the job beat since: written anew after the restart, all there is; and
            # the execution's record, which RQ's handling would have removed with the job
            with self.connection.pipeline() as pipe:
                pipe.delete(job.key)
                self.cleanup_execution(job, pipeline=pipe)
                pipe.execute()
            log.warning("job %s finished, but Redis lost it meanwhile (restarted?): nothing to clean up", job.id)

    def _start_scheduler(self, *args: Any, **kwargs: Any) -> None:
        """rqrl schedules no jobs: ``rq worker --with-scheduler`` starts no scheduler here."""
        log.warning("rqrl workers run no RQ scheduler (rqrl schedules no jobs); ignoring --with-scheduler")

    def execute_job(self, job: Job, queue: Queue) -> None:
        global _running
        _running = self
        try:
            super().execute_job(job, queue)
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


def stop_requested() -> bool:
    """Whether the running worker was asked for a warm shutdown (SIGTERM/SIGINT while busy): its job then
    hands its group on at the next rollout instead of keeping the worker (RQ waits for the job to end)."""
    worker = _running
    return worker is not None and worker.shutdown_requested


def served_queue_keys() -> list[str]:
    """The Redis keys of the queues the running worker serves (a job yields to jobs waiting on any of them)."""
    worker = _running
    return [queue.key for queue in worker.queues] if worker is not None else []


set_heartbeat_hook(send_heartbeat)
set_worker_hooks(stop_requested, served_queue_keys)


def default_worker_name() -> str:
    return f"{host_worker_prefix()}{os.getpid()}.{uuid.uuid4().hex[:6]}"


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
    keep_freed_memory()  # a job's buffers per rollout: no page faults (rqrl.engine.memory)
    connection = connect(redis_url)
    worker = RolloutWorker(list(queue_names), connection=connection, name=name or default_worker_name(),
                           secret=secret)
    try:
        return worker.work(burst=burst, logging_level=logging_level, with_scheduler=False)
    except _SHUTDOWN_REDIS_ERRORS as error:
        if not worker.shutdown_requested:
            raise
        state = "stayed full" if isinstance(error, redis.exceptions.OutOfMemoryError) else "stayed unreachable"
        log.warning("worker %s: Redis at %s %s as it shut down (%s); it exits without deregistering (its "
                    "registration lapses after worker_ttl, and the learner re-runs any group it held)",
                    worker.name, redact_url(redis_url), state, error)
        return False
