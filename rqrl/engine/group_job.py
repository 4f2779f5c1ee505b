"""The lifecycle of one RQ job that runs one group of a run, written once for every family: the exception
ladder, the lease, the hand-over to a continuation, the failure report, the check of the run's stop flag,
and the per-run state a worker keeps warm between jobs. Maze's actor groups (rqrl.maze.jobs) and garage's
sampler groups (rqrl.garage.jobs) are subclasses of ``GroupJob``."""

from __future__ import annotations

import abc
import logging
import time
import traceback
import uuid
from typing import Any, Generic, Protocol, TypeVar

import redis
from rq import get_current_job

from rqrl.engine.jobs import STOP_CHECK_SECONDS, back_off, push_error_report, read_config, sideline, worker_label
from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import GroupLease, learner_gone, lease_holder
from rqrl.engine.rq_safety import failed_registry
from rqrl.engine.run_config import RunConfig
from rqrl.errors import ForbiddenJobError, LeaseLostError, RunStoppedError, WorkerUnfitError

log = logging.getLogger(__name__)


class GroupJob(abc.ABC):
    """One RQ job that runs one group of a run from ``position`` on (a rollout id, a sampler call).

    ``run()`` reads the run's record, checks the job's arguments (job data is anyone's who can write to Redis)
    and calls ``work()``. Then:

    - the run stopped (RunStoppedError): the worker forgets the run; the job ends quietly;
    - a job rqrl did not enqueue (ForbiddenJobError): into RQ's failed registry, never the run's failure;
    - this worker cannot run the run (WorkerUnfitError): the group goes back on the queue for another worker,
      the run is told (``rqrl status`` shows it), this worker backs off, and the job fails in RQ's registry;
    - the lease went to another job (LeaseLostError): the group's warm state here is dropped; the job ends;
    - anything else: the group's warm state is dropped and, unless another job holds the group by now (this one
      hung past its lease), the run gets a failure report with this worker's traceback; the job fails.

    A job that ends without raising leaves RQ's failed registry: RQ's clean-up files a job there as abandoned
    when its worker stops sending heartbeats (paused, cut off from Redis), and a job that comes back and ends
    (fenced, or done) has not failed.
    """

    group_kind = "group"
    """What a group is called in messages ("actor group", "sampler group")."""

    def __init__(self, run_name: str, group_id: int, position: int):
        job = get_current_job()
        if job is None:
            raise RuntimeError(f"{type(self).__name__} must run inside an RQ job")
        self.job, self.connection = job, job.connection
        self.run_name, self.keys = run_name, RunKeys(run_name)
        self.group_id, self.position = group_id, position
        self.token = uuid.uuid4().hex
        """This job run's: tells a retried push of this job from another job's (and names its lease holder)."""
        self.lease: GroupLease | None = None
        self._config: RunConfig | None = None

    @property
    def config(self) -> RunConfig:
        """The run's record (``run()`` reads it before ``work()``)."""
        assert self._config is not None, "run() reads the config before work() starts"
        return self._config

    @config.setter
    def config(self, config: RunConfig) -> None:
        self._config = config

    # ---- what a family's job says ----

    @abc.abstractmethod
    def check_arguments(self) -> None:
        """ForbiddenJobError for arguments no learner enqueues."""

    @abc.abstractmethod
    def work(self) -> dict[str, Any]:
        """Run the group; the job's result."""

    @abc.abstractmethod
    def counts(self) -> dict[str, Any]:
        """What this job did so far, for its result (``{"rollouts": n}``, ``{"episodes": n}``)."""

    @abc.abstractmethod
    def enqueue_continuation(self, holder: str) -> None:
        """Enqueue the job that goes on with the group from ``position``, handing it this job's lease
        (``holder``); LeaseLostError if the group is no longer this job's."""

    @abc.abstractmethod
    def forget_group(self) -> None:
        """Drop this worker's warm state of the group (it may be mid-step): it is rebuilt next time."""

    @abc.abstractmethod
    def forget_run(self) -> None:
        """Drop this worker's warm state of the whole run (it stopped)."""

    @abc.abstractmethod
    def failure_fields(self, error: BaseException) -> dict[str, Any]:
        """The failure report's fields that say where the group failed (``actor_ids``, ``rollout_id``, ...)."""

    # ---- the lifecycle ----

    def run(self) -> dict[str, Any]:
        """The job: ``work()`` inside the exception ladder of the class docstring."""
        result = self._ladder()
        failed_registry(self.job.origin, self.connection).remove(self.job.id)  # filed as abandoned while away
        return result

    def _ladder(self) -> dict[str, Any]:
        try:
            self.config = read_config(self.connection, self.run_name)
            self.check_arguments()
            return self.work()
        except RunStoppedError:
            self.forget_run()
            return {**self.counts(), "stopped": True}
        except ForbiddenJobError:
            raise
        except WorkerUnfitError as error:
            self._hand_back()
            self.forget_group()
            sideline(self.connection, self.keys, self.job.id, error)
            back_off(self.run_name)
            raise
        except LeaseLostError:
            log.warning("job %s lost %s %d to another job; stopping", self.job.id, self.group_kind, self.group_id)
            self.forget_group()
            return {**self.counts(), "lost": True}
        except Exception as error:
            self._fail(error)
            raise
        finally:
            if self.lease is not None:
                self.lease.release()

    def take_lease(self) -> GroupLease:
        """Hold the group under this job run's lease."""
        config = self.config
        self.lease = GroupLease(self.connection, self.keys, self.group_id, lease_holder(self.job.id, self.token),
                                config.lease_seconds, config.hang_seconds)
        self.lease.acquire()
        return self.lease

    def continue_later(self) -> None:
        """Hand the group to a continuation at the queue's tail (LeaseLostError if it is no longer this job's)."""
        assert self.lease is not None, "a job continues only a group it holds"
        self.enqueue_continuation(self.lease.holder)

    def _hand_back(self) -> None:
        """This worker cannot run the group: give it back to the queue, for a worker that can."""
        if self.lease is None:
            return
        try:
            self.continue_later()
        except LeaseLostError:
            pass  # the reaper gave the group to another job meanwhile
        self.lease.release()
        self.lease = None

    def _fail(self, error: BaseException) -> None:
        """Report the failure to the run, unless the group moved to another job meanwhile."""
        still_ours = self.lease is None or self.lease.mark_failed()
        self.lease = None
        self.forget_group()
        if not still_ours:  # this job hung past its lease and another runs the group now: not the run's failure
            log.warning("job %s failed after %s %d moved to another job; not reporting: %s", self.job.id,
                        self.group_kind, self.group_id, error)
            return
        push_error_report(self.connection, self.keys, {
            "job_id": self.job.id, "group_id": self.group_id, "worker": worker_label(),
            "error": f"{type(error).__name__}: {error}", **self.failure_fields(error),
            "traceback": traceback.format_exc()})


def check_group_arguments(config: RunConfig, group_id: object, position: object, *, least: int, what: str) -> None:
    """ForbiddenJobError unless ``group_id`` is one of the run's groups and ``position`` an int >= ``least``
    (-1 as a group id would alias the last group under another lease)."""
    if not (type(group_id) is int and 0 <= group_id < len(config.actor_groups)):
        raise ForbiddenJobError(f"refusing a job for group {group_id!r}: run {config.run_name!r} has groups "
                                f"0..{len(config.actor_groups) - 1}")
    if not (type(position) is int and position >= least):
        raise ForbiddenJobError(f"refusing a job starting at {what} {position!r}: expected an int >= {least}")


class StopCheck:
    """Whether the run was stopped or its learner is gone; asks Redis at most every STOP_CHECK_SECONDS, and once
    it said yes it stays yes."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, job_id: str):
        self.connection, self.keys, self.job_id = connection, keys, job_id
        self.checked_at, self.stopped = 0.0, False

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.checked_at >= STOP_CHECK_SECONDS and not self.stopped:
            self.checked_at = now
            flag, deadline = self.connection.mget([self.keys.stopped, self.keys.learner_deadline])
            if learner_gone(deadline):
                log.warning("run %s: its learner has sent no heartbeat past its deadline (learner_timeout): job %s "
                            "stops and frees this worker; a resumed learner re-runs the group", self.keys.run_name,
                            self.job_id)
            self.stopped = flag is not None or learner_gone(deadline)
        return self.stopped


class RunContext(Protocol):
    """What a worker keeps warm for one run: built for one run id, closed when dropped."""

    @property
    def config(self) -> RunConfig: ...

    def close(self) -> None: ...


Context = TypeVar("Context", bound=RunContext)


class WarmContexts(Generic[Context]):
    """A worker process's warm contexts, one per run, at most ``size`` (the oldest is closed first); a run restarted
    under the same name (another run id) gets a fresh one.

    >>> from types import SimpleNamespace
    >>> contexts = WarmContexts(size=1)
    >>> def context(run_id): return SimpleNamespace(config=SimpleNamespace(run_id=run_id), close=lambda: None)
    >>> first = contexts.add("a", context("1"))
    >>> contexts.get("a", "1") is first, contexts.get("a", "2")
    (True, None)
    """

    def __init__(self, size: int = 4):
        self.size = size
        self._contexts: dict[str, Context] = {}

    def get(self, run_name: str, run_id: str) -> Context | None:
        """The context of this run, or None (a context of an earlier run of that name is closed)."""
        context = self._contexts.get(run_name)
        if context is not None and context.config.run_id != run_id:
            self.drop(run_name)
            return None
        return context

    def peek(self, run_name: str) -> Context | None:
        """The context kept for ``run_name``, whatever its run id."""
        return self._contexts.get(run_name)

    def run_names(self) -> list[str]:
        """The runs kept, oldest first."""
        return list(self._contexts)

    def add(self, run_name: str, context: Context) -> Context:
        while len(self._contexts) >= self.size:
            self._contexts.pop(next(iter(self._contexts))).close()
        self._contexts[run_name] = context
        return context

    def drop(self, run_name: str) -> None:
        """Close and forget the context of ``run_name``, if any."""
        context = self._contexts.pop(run_name, None)
        if context is not None:
            context.close()
