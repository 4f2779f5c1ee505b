"""The RQ job function: the one place where transport (Redis) and rollouts meet.

A job runs one actor group's rollouts for a *slice*: it keeps going in place for as long as its
group need not move, and yields (cuts its running episodes, marked ``truncated``, and enqueues its
own continuation at the queue's tail) only when it must: another job waits on a queue its worker
serves (checked every ``min_job_seconds`` once the slice has run that long), or its worker was
asked to shut down. ``max_job_seconds`` ends no slice by itself: past it, with nothing waiting, a
new slice starts in place and the episodes go on. The run stopping and a lost lease end a job
without a continuation. Envs, policies and weights stay warm in the worker process between jobs,
so a continuation that lands on the same worker only costs the RQ round trips. Job arguments are
plain JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import torch
from rq import Queue, get_current_job
from rq.serializers import JSONSerializer

from rqrl.codec import loads_object, records_key, secret_bytes, weights_key
from rqrl.enqueue import ERROR_TTL_SECONDS, enqueue_group
from rqrl.errors import (
    ForbiddenJobError,
    LeaseLostError,
    RecordError,
    RunStoppedError,
    SignatureError,
    WorkerUnfitError,
)
from rqrl.group_records import encode_signed_steps, entry_stream, records_per_entry
from rqrl.keys import RunKeys
from rqrl.leases import GroupLease, learner_gone, lease_holder, recorded_progress, start_rollout
from rqrl.policy import ActFunction, Policy, make_act_function
from rqrl.rollout import ActorGroup, EnvFactory, GroupRollout
from rqrl.run_config import RunConfig
from rqrl.timings import protocol_timings
from rqrl.trajectories import PendingRollout, PushReport, SentPush, TrajectoryQueue
from rqrl.weights import SentFetch, WeightStore

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.1


@dataclass
class RunContext:
    """What a worker keeps warm for one run: config, env factory, policy, weights, actor groups, and the keys
    it signs records with and checks weights against (derived from the secret and the run id)."""

    config: RunConfig
    env_factory: EnvFactory
    policy: Policy
    keys: RunKeys
    records_key: bytes
    weights_key: bytes
    weights_version: int | None = None
    act: ActFunction | None = None
    groups: dict[int, ActorGroup] = field(default_factory=dict)

    def group(self, group_id: int) -> ActorGroup:
        if group_id not in self.groups:
            actor_ids = self.config.actor_groups[group_id]
            self.groups[group_id] = ActorGroup(
                self.env_factory,
                actor_ids,
                [self.config.actor_env_seeds[a] for a in actor_ids],
                [self.config.actor_agent_seeds[a] for a in actor_ids],
                self.config.n_rollout_steps,
            )
        group = self.groups[group_id]
        self.act_for(group)
        return group

    def act_for(self, group: ActorGroup) -> ActFunction:
        """The policy's act function, made once (for the action space of the run's envs)."""
        if self.act is None:
            self.act = make_act_function(self.policy, group.action_space)
        return self.act

    def close(self) -> None:
        for group in self.groups.values():
            group.close()
        self.groups.clear()


_CONTEXTS: dict[str, RunContext] = {}
_MAX_CONTEXTS = 4
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
    """The secret this worker verifies signed payloads with; SignatureError if it was started without one."""
    return _require_secret()


def _require_secret() -> bytes:
    """The secret configure_secret set (RolloutWorker passes its ``secret`` or RQRL_SECRET)."""
    if _secret is None:
        raise SignatureError(
            "this worker has no shared secret, so it cannot verify the run's signed env factory and policy; "
            "start it with RQRL_SECRET set to the learner's secret"
        )
    return _secret


require_secret = _require_secret  # public for the sampler's job (rqrl.sampler_jobs)


def read_config(connection: redis.Redis, run_name: str) -> RunConfig:
    """The run's config from Redis; RunStoppedError if the run is gone."""
    raw_config = connection.get(RunKeys(run_name).config)
    if raw_config is None:
        raise RunStoppedError(f"run {run_name!r} has no config in Redis: it was stopped or never started")
    return RunConfig.from_json(raw_config)


def load_context(connection: redis.Redis, run_name: str) -> RunContext:
    """The warm context of ``run_name``, rebuilt if the run was restarted under the same name."""
    keys = RunKeys(run_name)
    config = read_config(connection, run_name)
    context = _CONTEXTS.get(run_name)
    if context is not None and context.config.run_id == config.run_id:
        return context
    if context is not None:
        context.close()
    env_factory_blob, policy_blob = connection.mget([keys.env_factory, keys.policy])
    # None: the run is gone; workers connect without decode_responses, so a value is bytes
    if not isinstance(env_factory_blob, bytes) or not isinstance(policy_blob, bytes):
        raise RunStoppedError(f"run {run_name!r} has no env factory or policy in Redis")
    secret, (policy, env_factory) = load_signed(run_name, policy_blob, env_factory_blob)
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    context = RunContext(config=config, env_factory=env_factory, policy=policy, keys=keys,
                         records_key=records_key(secret, config.run_id), weights_key=weights_key(secret, config.run_id))
    while len(_CONTEXTS) >= _MAX_CONTEXTS:
        _CONTEXTS.pop(next(iter(_CONTEXTS))).close()
    _CONTEXTS[run_name] = context
    return context


def load_signed(run_name: str, *blobs: bytes) -> tuple[bytes, list[Any]]:
    """The secret, and each signed blob of the run unpickled; WorkerUnfitError if this worker cannot verify
    them (no or another secret) or cannot import their code: the run may well go on on other workers."""
    try:
        secret = _require_secret()
        return secret, [loads_object(blob, secret) for blob in blobs]
    except SignatureError as error:
        raise WorkerUnfitError(f"this worker cannot verify run {run_name!r}'s signed payload: {error}") from error
    except Exception as error:  # unpickling imports the user's code: ModuleNotFoundError, AttributeError, ...
        raise WorkerUnfitError(
            f"this worker cannot load run {run_name!r}'s env factory or policy ({type(error).__name__}: {error}); "
            f"install the env's code in this worker's environment, at the learner's version (docs/service.md)"
        ) from error


def _drop_context(run_name: str) -> None:
    """Free a stopped run's envs and policy in this worker."""
    context = _CONTEXTS.pop(run_name, None)
    if context is not None:
        context.close()


def worker_label() -> str:
    job = get_current_job()
    name = getattr(job, "worker_name", None) if job is not None else None
    return name or f"{socket.gethostname()}.{os.getpid()}"


class _Slice:
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

    def heartbeat(self, env_steps: int = 0) -> None:
        """Keep RQ's worker and started-job registry entries alive during a long slice; ``env_steps`` stepped
        since the last call count towards this worker's steps/s on the run (see _publish_rate)."""
        now = time.monotonic()
        if env_steps:
            _publish_rate(self.connection, self.config, env_steps, now)
        if now - self.last_heartbeat < self.config.timings.heartbeat:
            return
        self.last_heartbeat = now
        if _heartbeat_hook is not None:
            _heartbeat_hook()


_RATES: dict[str, tuple[float, int]] = {}  # run name -> (when this worker last published, env steps since)


def _publish_rate(connection: redis.Redis, config: RunConfig, env_steps: int, now: float) -> None:
    """Count ``env_steps``; every heartbeat (the run's timings) publish this worker process's env steps/s on the
    run (over its jobs, however short their slices) for ``rqrl status``. A lost write only leaves a gap."""
    run_name, heartbeat = config.run_name, config.timings.heartbeat
    since, steps = _RATES.get(run_name, (now, 0))
    steps += env_steps
    if now - since < heartbeat:
        _RATES[run_name] = (since, steps)
        return
    _RATES[run_name] = (now, 0)
    while len(_RATES) > _MAX_CONTEXTS:  # runs this worker no longer serves
        _RATES.pop(next(iter(_RATES)))
    keys = RunKeys(run_name)
    try:
        with connection.pipeline(transaction=False) as pipe:
            pipe.hset(keys.worker_rates, worker_label(),
                      json.dumps({"steps_per_second": round(steps / (now - since), 1), "at": time.time()}))
            pipe.expire(keys.worker_rates, max(1, math.ceil(4 * heartbeat)))
            pipe.execute()
    except redis.RedisError as error:
        log.debug("could not publish this worker's steps/s: %s", error)


JobSlice = _Slice  # public for the sampler's job (rqrl.sampler_jobs), which slices the same way


def _wait_for_weights(context: RunContext, store: WeightStore, is_stopped: Callable[[], bool],
                      beat: Callable[[], None], sent: SentFetch | None = None) -> int | None:
    """Load the latest weights (the reply to ``sent``, a check sent ahead, if given); block until the learner has
    broadcast a first version (actors may start before it). Returns the version loaded, or None if the worker was
    asked to shut down meanwhile."""
    poll = 0.01
    while True:
        fetched = sent.result() if sent is not None else store.fetch_if_newer(context.weights_version)
        sent = None
        if fetched is not None:
            version, state_dict = fetched
            context.policy.load_state_dict(state_dict)
            context.weights_version = version
        if context.weights_version is not None:
            return context.weights_version
        if is_stopped():
            raise RunStoppedError(f"run {context.keys.run_name!r} stopped before any weights were broadcast")
        if shutdown_requested():
            return None
        beat()
        time.sleep(poll)
        poll = min(poll * 2, 0.5)


def run_actor_group(run_name: str, group_id: int, rollout_id: int) -> dict[str, Any]:
    """RQ job: run rollouts of one actor group and push them to the run's out-of-sync queue."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("run_actor_group must run inside an RQ job")
    connection = job.connection
    keys = RunKeys(run_name)
    first_rollout = rollout_id
    lease: GroupLease | None = None
    try:
        config = read_config(connection, run_name)
        _check_job_arguments(config, group_id, rollout_id)
        token = uuid.uuid4().hex  # this job run's pushes: tells a retried push from another job's rollout
        # the lease first: unpickling and building envs can take a while, and the reaper must not
        # mistake a job that is still starting for a dead one
        # ``held`` for the closures below; ``lease`` is cleared once the lease is given up
        held = lease = GroupLease(connection, keys, group_id, lease_holder(job.id, token), config.lease_seconds,
                                  config.hang_seconds)
        held.acquire()
        context = load_context(connection, run_name)
        config = context.config
        rollout_id = first_rollout = start_rollout(keys, group_id, rollout_id,
                                                   recorded_progress(connection, keys, group_id))
        group = _build_group(context, group_id)
        act = context.act_for(group)
        _UNFIT_STREAKS.pop(run_name, None)
        store = WeightStore(connection, keys, context.weights_key, config.weights_ttl_seconds)
        queue = TrajectoryQueue(connection, keys, config.queue_entries, marker_grace_seconds=2 * config.lease_seconds)
        work = _Slice(connection, config)

        stop_checked_at, stopped = 0.0, False

        def is_stopped() -> bool:
            """Whether the run was stopped, or its learner is gone; asks Redis at most every STOP_CHECK_SECONDS."""
            nonlocal stop_checked_at, stopped
            now = time.monotonic()
            if now - stop_checked_at >= STOP_CHECK_SECONDS and not stopped:
                stop_checked_at = now
                flag, deadline = connection.mget([keys.stopped, keys.learner_deadline])
                if learner_gone(deadline):
                    log.warning("run %s: its learner has sent no heartbeat past its deadline (learner_timeout): "
                                "job %s stops and frees this worker; a resumed learner re-runs the group", run_name,
                                job.id)
                stopped = flag is not None or learner_gone(deadline)
            return stopped

        def beat() -> None:
            """Keep RQ's heartbeats and the group's lease alive while the job waits."""
            work.heartbeat()
            held.touch()

        label = worker_label()
        fence = (keys.lease(group_id), held.holder)
        refused: set[int] = set()  # actors whose last rollout here was already delivered by an earlier job
        # the last rollout's push, sent but not yet confirmed: its reply is read after the next rollout is
        # stepped, so the worker does not idle waiting for Redis (one entry per rollout: the common case)
        in_flight: tuple[SentPush, list[tuple[PendingRollout, list[int]]], int] | None = None

        def delivered(entries: list[tuple[PendingRollout, list[int]]], report: PushReport,
                      next_rollout_id: int) -> None:
            """Note the actors whose rollout an earlier job had delivered already, and the group's progress."""
            nonlocal refused
            duplicates = {entry.stream_id for entry in report.duplicates}
            refused = {actor for entry, actors in entries if entry.stream_id in duplicates for actor in actors}
            held.record_progress(next_rollout_id)

        def settle() -> None:
            """Confirm the in-flight push (pushing it again if the queue was full or the reply lost)."""
            nonlocal in_flight
            if in_flight is not None:
                sent, sent_entries, next_rollout_id = in_flight
                in_flight = None
                delivered(sent_entries, queue.finish(sent, is_stopped, on_wait=beat), next_rollout_id)

        weights_check: SentFetch | None = None  # sent after a rollout, read before the next one
        try:
            while True:
                weights_version = _wait_for_weights(context, store, is_stopped, beat, weights_check)
                weights_check = None
                if is_stopped():
                    return {"rollouts": rollout_id - first_rollout, "stopped": True}
                if weights_version is None:  # shut down before any weights came (so before any push): hand it back
                    enqueue_group(connection, config, group_id, rollout_id, holder=lease.holder)
                    return {"rollouts": 0, "stopped": False}
                yield_now = work.should_yield()
                rollout = group.run_group(act, rollout_id, weights_version, cut_at_end=yield_now, worker=label)
                settle()
                if not yield_now:  # the next rollout's weights, asked after any wait for room in the queue: the
                    # reply is read once this rollout's push is on its way
                    weights_check = store.send_fetch(context.weights_version)
                # a re-run recomputes rollouts an earlier job delivered; the first new one does not
                # continue the delivered one before it, and says so
                continues = [rollout.continues_previous and actor not in refused for actor in rollout.actor_ids]
                entries = _group_entries(rollout, continues, group_id, config.run_id, context.records_key)
                queue.bound = config.entries_bound(len(entries[0][1]))
                sent = queue.send(entries[0][0], token, fence) if len(entries) == 1 and not yield_now else None
                rollout_id += 1
                if sent is not None:
                    in_flight = (sent, entries, rollout_id)
                else:
                    report = queue.push([entry for entry, _ in entries], is_stopped, on_wait=beat, token=token,
                                        lease=fence)
                    delivered(entries, report, rollout_id)
                    if report.waited_seconds > 0 and weights_check is not None:  # the check predates the wait for
                        weights_check.abandon()  # room, during which the learner may have published: ask afresh
                        weights_check = None
                work.heartbeat(len(rollout.actor_ids) * config.n_rollout_steps)
                if yield_now:
                    enqueue_group(connection, config, group_id, rollout_id, holder=lease.holder)
                    return {"rollouts": rollout_id - first_rollout, "stopped": False}
        finally:
            if in_flight is not None:  # the job ends before it needed the outcome (stopped, failed, lost)
                in_flight[0].abandon()
            if weights_check is not None:
                weights_check.abandon()
    except RunStoppedError:
        _drop_context(run_name)
        return {"rollouts": rollout_id - first_rollout, "stopped": True}
    except ForbiddenJobError:
        raise  # a job rqrl did not enqueue: into RQ's failed registry, never reported as the run's failure
    except WorkerUnfitError as error:
        # this worker's fault, not the actors': hand the group back to a worker that can run it, wait so
        # that one gets it, then fail, so the job shows in RQ's failed registry (and the dashboard)
        if lease is not None:
            try:
                enqueue_group(connection, config, group_id, rollout_id, holder=lease.holder)
            except LeaseLostError:
                pass  # the reaper gave the group to another job meanwhile
            lease.release()
            lease = None
        sideline(connection, keys, job.id, error)
        back_off(run_name)
        raise
    except LeaseLostError:
        log.warning("job %s lost actor group %d to another job; stopping", job.id, group_id)
        # its envs may be ahead of what was pushed: whoever runs the group here next starts afresh
        _drop_group(run_name, group_id)
        return {"rollouts": rollout_id - first_rollout, "lost": True}
    except Exception as error:
        still_ours = lease is None or lease.mark_failed()
        lease = None
        _drop_group(run_name, group_id)  # the group's envs may be mid-step: rebuild them next time
        if still_ours:
            _report_failure(connection, keys, job.id, group_id, rollout_id, error)
        else:  # this job hung past its lease and another runs the group now: its failure is not the run's
            log.warning("job %s failed after actor group %d moved to another job; not reporting: %s", job.id,
                        group_id, error)
        raise
    finally:
        if lease is not None:
            lease.release()


def _group_entries(rollout: GroupRollout, continues: list[bool], group_id: int, run_id: str,
                   key: bytes) -> list[tuple[PendingRollout, list[int]]]:
    """A group's rollouts as queue entries of at most ENTRY_BYTES (whole rollouts; one if a rollout is larger),
    each on its part's stream, with the actors it holds; ``continues``: each actor's continues_previous. Each entry
    is encoded straight from the group's buffers."""
    size, actor_ids = records_per_entry(rollout.first_record), rollout.actor_ids
    starts = range(0, len(actor_ids), size)
    return [(PendingRollout(entry_stream(group_id, part), rollout.rollout_id, encode_signed_steps(
                rollout.steps.actors(start, start + size), actor_ids[start:start + size],
                continues[start:start + size], rollout.policy_version, rollout.rollout_id, rollout.worker, run_id,
                key)), actor_ids[start:start + size]) for part, start in enumerate(starts)]


def _build_group(context: RunContext, group_id: int) -> ActorGroup:
    """The run's envs of one actor group; WorkerUnfitError if their code does not import on this worker."""
    try:
        return context.group(group_id)
    except ImportError as error:
        raise WorkerUnfitError(
            f"this worker cannot build run {context.keys.run_name!r}'s envs ({type(error).__name__}: {error}); "
            f"install the env's package in this worker's environment (docs/service.md)"
        ) from error


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


def _check_job_arguments(config: RunConfig, group_id: object, rollout_id: object) -> None:
    """Refuse job arguments no learner enqueues (job data is anyone's who can write to Redis): a group id
    outside the run's groups (-1 would alias the last group under another lease) or a negative rollout id."""
    if not (type(group_id) is int and 0 <= group_id < len(config.actor_groups)):
        raise ForbiddenJobError(f"refusing a job for actor group {group_id!r}: run {config.run_name!r} has groups "
                                f"0..{len(config.actor_groups) - 1}")
    if not (type(rollout_id) is int and rollout_id >= 0):
        raise ForbiddenJobError(f"refusing a job starting at rollout {rollout_id!r}: expected an int >= 0")


def _drop_group(run_name: str, group_id: int) -> None:
    """Close and forget this worker's envs of one actor group."""
    context = _CONTEXTS.get(run_name)
    if context is not None:
        dropped = context.groups.pop(group_id, None)
        if dropped is not None:
            dropped.close()


def push_error_report(connection: redis.Redis, keys: RunKeys, report: dict[str, Any]) -> None:
    """Append a failure report (job id, actors, worker, error, traceback) to the run's error list, which the
    learner or sampler raises from; a Redis error here is logged, not raised over the job's own error."""
    try:
        with connection.pipeline() as pipe:
            pipe.rpush(keys.errors, json.dumps(report))
            pipe.expire(keys.errors, ERROR_TTL_SECONDS)
            pipe.execute()
    except redis.RedisError:
        log.exception("could not report the failure of job %s to the run", report.get("job_id"))


def _report_failure(connection: redis.Redis, keys: RunKeys, job_id: str, group_id: int, rollout_id: int,
                    error: BaseException) -> None:
    """Tell the learner which job failed and why, with the full traceback from this worker."""
    actor_ids: list[int] = []
    raw_config = connection.get(keys.config)
    if raw_config is not None:
        try:
            actor_ids = RunConfig.from_json(raw_config).actor_groups[group_id]
        except (RecordError, ValueError, IndexError, TypeError):
            actor_ids = []
    report = {
        "job_id": job_id,
        "group_id": group_id,
        "actor_ids": actor_ids,
        "rollout_id": rollout_id,
        "worker": worker_label(),
        "error": f"{type(error).__name__}: {error}",
        "traceback": traceback.format_exc(),
    }
    push_error_report(connection, keys, report)
