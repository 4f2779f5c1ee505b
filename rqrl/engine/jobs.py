"""What every family's RQ job shares: the hooks through which the rqrl worker speaks to its running job
(heartbeats, shutdown, the queues it serves, the shared secret), the run record and signed payloads a job
loads, the slice that decides when a job yields, and the reports a job leaves when it fails or cannot run.

The worker layer (rqrl.engine.worker) sets the hooks; jobs never import it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, get_current_job
from rq.serializers import JSONSerializer

from rqrl.engine.codec import loads_object, secret_bytes
from rqrl.engine.enqueue import ERROR_TTL_SECONDS
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import RunConfig
from rqrl.engine.timings import protocol_timings
from rqrl.engine.worker_times import WorkerTimes
from rqrl.errors import RunStoppedError, SignatureError, WorkerUnfitError

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.1
"""How often a job's waits look at the run's stop flag and the worker's shutdown."""
_MAX_RUNS = 4
"""Runs whose steps/s a worker process keeps counting (as many as it keeps warm contexts for)."""

_secret: bytes | None = None


_heartbeat_hook: Callable[[], None] | None = None


_stop_requested_hook: Callable[[], bool] | None = None


_queue_keys_hook: Callable[[], list[str]] | None = None


def set_heartbeat_hook(hook: Callable[[], None] | None) -> None:
    """Let the worker layer refresh RQ's heartbeats during long slices (jobs never import it)."""
    global _heartbeat_hook
    _heartbeat_hook = hook


def set_worker_hooks(stop_requested: Callable[[], bool] | None, queue_keys: Callable[[], list[str]] | None) -> None:
    """Let the worker layer tell a running job that its worker was asked to shut down, and which queues it
    serves (jobs never import it): a slice yields when either says the group has to move."""
    global _stop_requested_hook, _queue_keys_hook
    _stop_requested_hook, _queue_keys_hook = stop_requested, queue_keys


def shutdown_requested() -> bool:
    """Whether this worker process was asked to shut down (SIGTERM/SIGINT; see set_worker_hooks)."""
    return _stop_requested_hook is not None and _stop_requested_hook()


def configure_secret(secret: str | bytes | None) -> None:
    """Set the shared secret this worker process verifies pickled payloads with."""
    global _secret
    _secret = secret_bytes(secret) if secret else None


def beat_worker() -> None:
    """Refresh RQ's heartbeats of the worker running this job now (long jobs call it; a no-op elsewhere)."""
    if _heartbeat_hook is not None:
        _heartbeat_hook()


def worker_secret() -> bytes:
    """The secret this worker verifies signed payloads with (configure_secret set it: RolloutWorker passes its
    ``secret`` or RQRL_SECRET); SignatureError if it was started without one."""
    if _secret is None:
        raise SignatureError(
            "this worker has no shared secret, so it cannot verify the run's signed env factory and policy; "
            "start it with RQRL_SECRET set to the learner's secret"
        )
    return _secret


def read_config(connection: redis.Redis, run_name: str) -> RunConfig:
    """The run's config from Redis; RunStoppedError if the run is gone."""
    raw_config = connection.get(RunKeys(run_name).config)
    if raw_config is None:
        raise RunStoppedError(f"run {run_name!r} has no config in Redis: it was stopped or never started")
    return RunConfig.from_json(raw_config)


def load_signed(run_name: str, *blobs: bytes) -> tuple[bytes, list[Any]]:
    """The secret, and each signed blob of the run unpickled; WorkerUnfitError if this worker cannot verify
    them (no or another secret) or cannot import their code: the run may well go on on other workers."""
    try:
        secret = worker_secret()
        return secret, [loads_object(blob, secret) for blob in blobs]
    except SignatureError as error:
        raise WorkerUnfitError(f"this worker cannot verify the signed payload of run {run_name!r}: {error}") from error
    except Exception as error:  # unpickling imports the user's code: ModuleNotFoundError, AttributeError, ...
        raise WorkerUnfitError(
            f"this worker cannot load run {run_name!r}'s env factory or policy ({type(error).__name__}: {error}); "
            f"install the env's code in this worker's environment, at the learner's version (docs/service.md)"
        ) from error


def worker_label() -> str:
    job = get_current_job()
    name = getattr(job, "worker_name", None) if job is not None else None
    return name or f"{socket.gethostname()}.{os.getpid()}"


class JobSlice:
    """Bookkeeping of one job: when to check the queues, heartbeat, and yield."""

    def __init__(self, connection: redis.Redis, config: RunConfig):
        self.connection = connection
        self.config = config
        self.started = time.monotonic()
        self.last_check = self.started
        self.last_heartbeat = self.started
        self.rq_queue_key = Queue(config.queue_name, connection=connection, serializer=JSONSerializer).key

    def should_yield(self) -> bool:
        """True when the group has to move: the worker is shutting down, or, once the slice has run
        min_job_seconds (checked every min_job_seconds), another job waits on a queue the worker serves.
        Past max_job_seconds with nothing waiting, a new slice starts in place: no cut."""
        if _stop_requested_hook is not None and _stop_requested_hook():
            return True
        now = time.monotonic()
        elapsed = now - self.started
        if elapsed < self.config.min_job_seconds or now - self.last_check < self.config.min_job_seconds:
            return False
        self.last_check = now
        if self._jobs_waiting():
            return True
        if elapsed >= self.config.max_job_seconds:
            self.started = now  # a new slice in place: the group keeps its worker, envs and episodes
        return False

    def jobs_waiting(self) -> bool:
        """Whether a job waits on a queue this job's worker serves (one round trip, no rate limit)."""
        return self._jobs_waiting()

    def _jobs_waiting(self) -> bool:
        """Whether a job waits on the run's queue or on another queue this job's worker serves."""
        keys = list(dict.fromkeys([self.rq_queue_key, *(_queue_keys_hook() if _queue_keys_hook is not None else [])]))
        if len(keys) == 1:
            return int(self.connection.llen(keys[0])) > 0
        with self.connection.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.llen(key)
            return any(int(length) > 0 for length in pipe.execute())

    def heartbeat(self, env_steps: int = 0, times: WorkerTimes | None = None) -> None:
        """Keep RQ's worker and started-job registry entries alive during a long slice; ``env_steps`` stepped
        since the last call count towards this worker's steps/s on the run, and ``times`` towards where its time
        went (see _publish_rate)."""
        now = time.monotonic()
        if env_steps:
            _publish_rate(self.connection, self.config, env_steps, now, times)
        if now - self.last_heartbeat < self.config.timings.heartbeat:
            return
        self.last_heartbeat = now
        if _heartbeat_hook is not None:
            _heartbeat_hook()


_RATES: dict[str, tuple[float, int, WorkerTimes]] = {}
"""Run name -> when this worker last published, the env steps since, and where its time went since."""


def _publish_rate(connection: redis.Redis, config: RunConfig, env_steps: int, now: float,
                  times: WorkerTimes | None = None) -> None:
    """Count ``env_steps`` and ``times``; every heartbeat (the run's timings) publish this worker process's env
    steps/s on the run (over its jobs, however short their slices) for ``rqrl status``, and the share of its time
    each part of its loop took (``time``, where measured). A lost write only leaves a gap."""
    run_name, heartbeat = config.run_name, config.timings.heartbeat
    since, steps, spent = _RATES.get(run_name, (now, 0, WorkerTimes()))
    steps += env_steps
    if times is not None:
        spent.add(times)
    if now - since < heartbeat:
        _RATES[run_name] = (since, steps, spent)
        return
    _RATES[run_name] = (now, 0, WorkerTimes())
    while len(_RATES) > _MAX_RUNS:  # runs this worker no longer serves
        _RATES.pop(next(iter(_RATES)))
    keys = RunKeys(run_name)
    published: dict[str, Any] = {"steps_per_second": round(steps / (now - since), 1), "at": time.time()}
    if times is not None:
        published["time"] = spent.shares(now - since)
    try:
        with connection.pipeline(transaction=False) as pipe:
            pipe.hset(keys.worker_rates, worker_label(), json.dumps(published))
            pipe.expire(keys.worker_rates, max(1, math.ceil(4 * heartbeat)))
            pipe.execute()
    except redis.RedisError as error:
        log.debug("could not publish this worker's steps/s: %s", error)


_UNFIT_STREAKS: dict[str, int] = {}  # run name -> jobs in a row this worker could not run


def sideline(connection: redis.Redis, keys: RunKeys, job_id: str, error: WorkerUnfitError) -> None:
    """Tell the learner (and ``rqrl status``) that this worker cannot run the run, and why."""
    name = worker_label()
    log.error("worker %s cannot run %s and hands its jobs back to other workers: %s", name, keys.run_name, error)
    report = {"worker": name, "job_id": job_id, "error": str(error), "at": time.time(),
              "traceback": traceback.format_exc()}
    try:
        with connection.pipeline() as pipe:
            pipe.hset(keys.sidelined, name, json.dumps(report))
            pipe.expire(keys.sidelined, ERROR_TTL_SECONDS)
            pipe.execute()
    except redis.RedisError:
        log.exception("could not report to run %s that worker %s is sidelined", keys.run_name, name)


def fit_again(connection: redis.Redis, keys: RunKeys) -> None:
    """This worker could set up a job of run ``keys``: its next back-off starts again at the first window, and a
    sideline report it filed for the run (its code installed since, say) is withdrawn, so the learner no longer
    counts it among the workers that refuse the run."""
    if _UNFIT_STREAKS.pop(keys.run_name, None) is None:
        return
    try:
        connection.hdel(keys.sidelined, worker_label())
    except redis.RedisError:
        log.warning("could not withdraw worker %s's sideline report from run %s", worker_label(), keys.run_name)


def back_off(run_name: str) -> None:
    """Wait 1, 2, 4, ... up to 30 s (the sideline windows of this worker's ProtocolTimings; longer for each
    job of the run in a row it could not run) before dequeueing again, so the job handed back goes to a worker
    that can run it."""
    timings = protocol_timings()
    streak = _UNFIT_STREAKS[run_name] = _UNFIT_STREAKS.get(run_name, 0) + 1
    deadline = time.monotonic() + min(timings.sideline_max, timings.sideline_first * 2.0 ** (streak - 1))
    last_beat = -float("inf")
    while (now := time.monotonic()) < deadline and not shutdown_requested():
        if now - last_beat >= timings.heartbeat:
            beat_worker()
            last_beat = now
        time.sleep(min(0.25, timings.heartbeat, deadline - now))


def push_error_report(connection: redis.Redis, keys: RunKeys, report: dict[str, Any]) -> None:
    """Append a failure report (job id, actors, worker, error, traceback) to the run's error list, which the
    learner or sampler raises from; a Redis error here is logged, not raised over the job's own error."""
    try:
        with connection.pipeline() as pipe:
            pipe.rpush(keys.errors, json.dumps(report))
            pipe.expire(keys.errors, ERROR_TTL_SECONDS)
            pipe.execute()
    except redis.RedisError as error:  # one line: the job's own error, raised next, carries the traceback
        log.warning("could not report the failure of job %s to the run (%s: %s)", report.get("job_id"),
                    type(error).__name__, error)

