"""A run's life in Redis: its config and signed env factory and policy stored at start, adopted by a
resuming learner, stored again after a Redis restart lost them, and every trace removed at stop.

Workers read what is stored here (``rqrl.maze.jobs.load_context``); the learner-side APIs (actors,
samplers) own one RunStore each and know nothing of the keys it writes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import redis
from rq import Queue
from rq.job import Job

from rqrl.engine.codec import dumps_object
from rqrl.engine.keys import RunKeys
from rqrl.engine.learner_token import held_by_another, taken_over_error
from rqrl.engine.leases import group_is_leased, learner_gone, set_progress
from rqrl.engine.rq_safety import started_registry
from rqrl.engine.run_config import RunConfig
from rqrl.errors import ConfigError

log = logging.getLogger(__name__)

# KEYS[1] = the run's learner token; ARGV = this learner's token, the previous one ('' for none)
_HAND_BACK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1
"""

STOPPED_MARKER_SECONDS = 24 * 3600
"""How long ``rqrl stop`` of a run without a live learner keeps the run's stop flag: a day, as RQ keeps failed jobs."""

RESUME_FIELDS = ("n_rollout_steps", "n_actors", "queue_name", "actor_groups", "actor_env_seeds", "actor_agent_seeds")
"""What a resuming learner must give as the run was started with: what workers' jobs depend on."""


class RunStore:
    """One run's keys in one Redis; ``secret`` signs the pickled env factory and policy. A learner's store has its
    ``learner_token``: the store writes it with the run, a resume writes it over the previous learner's, and a
    learner whose token is no longer the run's has been taken over (RunTakenOverError at its next check-in)."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, secret: str | bytes, learner_token: str | None = None):
        self.connection, self.keys, self.secret = connection, keys, secret
        self.learner_token = learner_token
        self.previous_token: bytes | None = None  # the token a resume wrote over: the run goes back to it on failure

    def open(self, config: RunConfig, env_factory: Any, policy: Any, resume: bool) -> tuple[RunConfig, bool]:
        """Store a new run, or adopt the one stored under its name if ``resume``; returns the config in
        effect (an adopted run keeps its run id, so its queued records stay readable) and whether it is new."""
        existing = self.connection.get(self.keys.config)
        if existing is None:
            self.write(config, env_factory, policy)
            return config, True
        if not resume:  # a learner with a token can fence the one it takes over from: IMPALA's actors
            raise run_exists_error(self.connection, self.keys, can_take_over=self.learner_token is not None)
        adopted = adopt(RunConfig.from_json(existing), config)
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.stopped)
            if self.learner_token is not None:  # a learner still running the run stops at its next check-in
                pipe.set(self.keys.learner_token, self.learner_token, get=True)
            replies = pipe.execute()
        self.previous_token = replies[1] if self.learner_token is not None else None
        log.info("resumed run %s (run id %s) from Redis", self.keys.run_name, adopted.run_id)
        return adopted, False

    def hand_back(self, previous_token: bytes | None) -> None:
        """Give an adopted run back to the learner it was taken from (``previous_token``, as ``open`` read it), if
        this learner still holds it: a resume that fails to start leaves the run as it found it."""
        if self.learner_token is not None:
            self.connection.eval(_HAND_BACK, 1, self.keys.learner_token, self.learner_token, previous_token or b"")

    def exists(self) -> bool:
        """Whether Redis still holds the run (a restart without persistence loses it)."""
        return bool(self.connection.exists(self.keys.config))

    def check_in(self, learner_timeout: float, facts: Mapping[str, float] | None = None) -> tuple[bool, bool]:
        """The learner's heartbeat: move its deadline ``learner_timeout`` seconds on (past it, jobs stop) and
        publish ``facts`` (for ``rqrl status``); returns whether Redis still holds the run and whether it was
        stopped (``rqrl stop``), in one round trip. RunTakenOverError if another learner resumed the run. A run that
        ``rqrl stop`` removed reads (False, True): the caller stops rather than store it again."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.learner_token)
            pipe.set(self.keys.learner_deadline, f"{time.time() + learner_timeout:.3f}")
            if facts:
                pipe.hset(self.keys.learner, mapping={name: repr(float(value)) for name, value in facts.items()})
            pipe.exists(self.keys.config)
            pipe.exists(self.keys.stopped)
            holder, *_, exists, stopped = pipe.execute()
        if held_by_another(holder, self.learner_token):
            raise taken_over_error(self.keys.run_name)
        return bool(exists), bool(stopped)

    def write(self, config: RunConfig, env_factory: Any, policy: Any) -> None:
        """Store the config and the signed env factory and policy in one transaction."""
        try:
            env_factory_blob = dumps_object(env_factory, self.secret)
            policy_blob = dumps_object(policy, self.secret)
        except Exception as error:
            raise ConfigError(
                f"cannot pickle the env factory or policy ({type(error).__name__}: {error}); define them at "
                f"module level or as closures over picklable values"
            ) from error
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.env_factory, env_factory_blob)
            pipe.set(self.keys.policy, policy_blob)
            pipe.set(self.keys.config, config.to_json())
            pipe.delete(self.keys.stopped)  # the flag `rqrl stop` leaves a day (``stop``)
            if self.learner_token is not None:
                pipe.set(self.keys.learner_token, self.learner_token)
            pipe.execute()

    def restore(self, config: RunConfig, env_factory: Any, policy: Any, progress: Mapping[int, int]) -> None:
        """Store the run again after Redis lost it, with each group's next rollout id, so re-runs carry
        on where the learner's delivered rollouts end; the out-of-sync queue's indices restart at 0."""
        log.warning("the keys of run %s vanished from Redis (a restart without persistence?): storing the run "
                    "again; rollouts that were queued in Redis are lost", self.keys.run_name)
        self.write(config, env_factory, policy)
        with self.connection.pipeline(transaction=False) as pipe:
            for group_id, next_rollout_id in progress.items():
                set_progress(pipe, self.keys, group_id, next_rollout_id)
            # a pop in the moment before this check may have made the list afresh: indices restart at 0
            pipe.delete(self.keys.unacknowledged, self.keys.acknowledged)
            pipe.execute()

    def stop(self, queue: Queue, timeout: float, leave_stop_flag: bool = False) -> None:
        """Tell jobs to stop, wait up to ``timeout`` for running ones, then delete the run's queued jobs and
        every key of the run. Its failed jobs stay in RQ's failed registry, with their tracebacks, for
        rq-dashboard and ``rq`` to show until their failure_ttl (a day) ends. A learner that was taken over
        leaves them all to the learner that took the run over.

        ``leave_stop_flag`` (``rqrl stop`` of a run whose learner looks dead) keeps the run's stop flag for
        STOPPED_MARKER_SECONDS, set in the same transaction as the keys' removal: a learner that only looked dead
        (a sampler trains between its calls, and beats no heartbeat then) raises RunStoppedError at its next
        check-in instead of storing the run again. A new run of the same name clears it."""
        connection = self.connection
        if held_by_another(connection.get(self.keys.learner_token), self.learner_token):
            log.warning("run %s was taken over by another learner: leaving its keys and jobs to it",
                        self.keys.run_name)
            return
        flagged = raise_stop_flag(connection, self.keys)  # refused: no job hears of it, so none is waited for
        deadline = time.monotonic() + (timeout if flagged else 0.0)
        started = started_registry(queue.name, connection)
        while flagged:
            self._remove_queued_jobs(queue)
            # jobs whose lease expired died with their worker: nothing to wait for
            # a started job whose group holds a lease is still running: the lease may already name the
            # continuation it is enqueueing (leases are handed over before the enqueue)
            running = [job_id for job_id in started.get_job_ids() if (group_id := self.keys.group_of_job(job_id))
                       is not None and group_is_leased(connection, self.keys, group_id)]
            if not running:
                break
            if time.monotonic() >= deadline:
                log.warning("jobs of run %s still running after %.0f s; deleting its keys anyway",
                            self.keys.run_name, timeout)
                break
            time.sleep(0.05)
        self._remove_queued_jobs(queue)
        self._delete_keys(list(connection.scan_iter(match=self.keys.pattern, count=1000)), leave_stop_flag)

    def _delete_keys(self, keys: list[Any], leave_stop_flag: bool) -> None:
        """Delete ``keys``; with ``leave_stop_flag``, set the stop flag for a day in the same transaction. A full
        Redis refuses that transaction (it holds a write): the keys go first then, which frees the memory."""
        if not leave_stop_flag:
            if keys:
                self.connection.delete(*keys)
            return
        try:
            with self.connection.pipeline(transaction=True) as pipe:
                if keys:
                    pipe.delete(*keys)
                pipe.set(self.keys.stopped, 1, ex=STOPPED_MARKER_SECONDS)
                pipe.execute()
        except redis.exceptions.OutOfMemoryError:
            if keys:
                self.connection.delete(*keys)
            with contextlib.suppress(redis.exceptions.OutOfMemoryError):  # still full: raise_stop_flag said so
                self.connection.set(self.keys.stopped, 1, ex=STOPPED_MARKER_SECONDS)

    def _remove_queued_jobs(self, queue: Queue) -> None:
        for job_id in queue.get_job_ids():
            if job_id.startswith(self.keys.job_id_prefix):
                queue.remove(job_id)
                self.connection.delete(Job.key_for(job_id))


def deadline_text(deadline: bytes | str | None, now: float | None = None) -> str:
    """When a learner's heartbeat deadline (unix seconds, ``RunKeys.learner_deadline``) passes, for a message:
    ``"passes at 14:03:07 (in 212 s)"``, ``"passed at 14:03:07"``, or that it has none."""
    if deadline is None:
        return "is not set"
    try:
        value = float(deadline)
    except ValueError:
        return f"is {deadline!r}, no time"
    left = value - (time.time() if now is None else now)
    clock = time.strftime("%H:%M:%S", time.localtime(value))
    return f"passes at {clock} (in {left:.0f} s)" if left > 0 else f"passed at {clock}"


def run_exists_error(connection: redis.Redis, keys: RunKeys, can_take_over: bool) -> ConfigError:
    """Why a new learner cannot store run ``keys.run_name``, which Redis still holds, and what works: ``rqrl stop``
    (at once after its learner's heartbeat deadline, which the message says when), another name, and,
    where the learner ``can_take_over`` a live run (IMPALA's), a resume."""
    name = keys.run_name
    deadline = connection.get(keys.learner_deadline)
    if deadline is not None and not learner_gone(deadline):
        stop = (f"If its learner died (kill -9, OOM, a lost machine), its heartbeat deadline "
                f"{deadline_text(deadline)}; after that `rqrl stop {name}` removes the run at once (before it, "
                f"`rqrl stop` asks a live learner to stop and waits for it). ")
    else:
        stop = f"Its learner's heartbeat deadline {deadline_text(deadline)}: `rqrl stop {name}` removes the run now. "
    takeover = ("; or take the run over (`rqrl train --resume RUN_DIR`, resume=True in Python)" if can_take_over
                else " (only IMPALA's learner takes over a run still in Redis)")
    return ConfigError(
        f"run {name!r} already exists in this Redis (its keys start with 'rqrl:{name}:'): its learner runs, or died "
        f"before it cleaned up. {stop}Or give this run another name (--run-name, run_name= in Python){takeover}"
    )


def raise_stop_flag(connection: redis.Redis, keys: RunKeys) -> bool:
    """Set the run's stop flag; False when Redis is full and refuses it (OOM): the caller deletes the run's
    keys all the same, which frees the memory, and the jobs stop once they find the learner's deadline gone."""
    try:
        connection.set(keys.stopped, 1)
    except redis.exceptions.OutOfMemoryError:
        log.warning("run %s: Redis is at its maxmemory and refused the stop flag; deleting the run's keys without "
                    "it (its jobs stop within seconds, once they find its learner gone)", keys.run_name)
        return False
    return True


def adopt(existing: RunConfig, requested: RunConfig, fields: tuple[str, ...] = RESUME_FIELDS) -> RunConfig:
    """``existing`` if it agrees with ``requested`` on ``fields``, else ConfigError naming the differences."""
    different = [name for name in fields if getattr(existing, name) != getattr(requested, name)]
    if different:
        raise ConfigError(
            f"cannot resume run {existing.run_name!r}: its {different} differ from these arguments; resume with "
            f"the settings it was started with, or start a new run_name"
        )
    return existing
