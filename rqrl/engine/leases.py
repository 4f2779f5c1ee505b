"""Leases that prove a live job is running an actor group, and the learner's reaper that re-runs
groups whose job died with its worker. This module is the only one that reads or writes the
``lease:{group}`` and ``progress:{group}`` keys.

A job holds ``lease:{group}`` (value: its job id, a TTL of ``lease_seconds``), handed to it when
it is enqueued, so a job between a worker's dequeue and its start is covered too. A thread in the
worker refreshes it while rollouts keep finishing; it stops refreshing when the process dies
(SIGKILL, a lost machine) or when no rollout finished for ``hang_seconds`` (an env hung in
``step``). The refresher also stores ``progress:{group}``, the next rollout id after the last push. The
learner's reaper finds groups with neither a lease nor a queued job and enqueues them again from
their progress; pushes are idempotent per rollout id, so nothing is delivered twice.

The lease is also a fence. A running job holds it under a value unique to that job run
(``lease_holder``: job id and a per-run token), the queue's push script refuses rollouts from a job
that no longer holds it, and a job hands the group to its continuation only while it still holds
it. So a job that outlived its lease (a Redis restart lost every key, the reaper gave the group to
another job) can neither push nor move the group's progress: whatever it ran after the loss is
dropped, and the group's next job starts from the recorded progress, from resets.

Values read here are parsed defensively: a progress that is not an integer is ignored with a
warning (the caller falls back to what it knows), and the reaper repairs leases that cannot be
right (no expiry, an expiry longer than any lease is given, a holder that is no job of the group).
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.client import Pipeline

from rqrl.engine.keys import RunKeys
from rqrl.errors import LeaseLostError

log = logging.getLogger(__name__)

# KEYS[1] = lease, KEYS[2] = progress; ARGV[1] = holder, ARGV[2] = TTL ms, ARGV[3] = next rollout id or ''
_REFRESH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3]) end
return 1
"""
# KEYS[1] = lease; ARGV[1] = holder
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1] = lease, KEYS[2] = progress; ARGV[1] = current holder, ARGV[2] = new holder, ARGV[3] = TTL ms,
# ARGV[4] = the new holder's first rollout id
_HAND_OVER_FROM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[4])
return 1
"""
# KEYS[1] = lease; ARGV[1] = holder, ARGV[2] = the failed mark
_MARK_FAILED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
FAILED_PREFIX = "failed:"
_TTL_SLACK_MS = 1000  # a lease's TTL may exceed lease_seconds by this much (clock and round-trip noise)


def lease_holder(job_id: str, token: str) -> str:
    """The lease value of one run of a job: a job re-enqueued under the same id is another holder."""
    return f"{job_id}#{token}"


class GroupLease:
    """The lease of one job on one actor group."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, group_id: int, holder: str,
                 lease_seconds: float, hang_seconds: float):
        self.connection, self.keys, self.group_id, self.holder = connection, keys, group_id, holder
        self.ttl_ms = int(lease_seconds * 1000)
        self.hang_seconds = hang_seconds
        self.lost = False
        self._last_progress = time.monotonic()
        self._stop = threading.Event()
        self._refresh = connection.register_script(_REFRESH)
        self._release = connection.register_script(_RELEASE)
        self._mark_failed = connection.register_script(_MARK_FAILED)
        self._thread: threading.Thread | None = None
        self._next_rollout_id: int | None = None

    def acquire(self) -> None:
        """Take the group (from a dead or hung holder too) and start refreshing in the background."""
        self.connection.set(self.keys.lease(self.group_id), self.holder, px=self.ttl_ms)
        self._thread = threading.Thread(target=self._keep_alive, name=f"rqrl-lease-g{self.group_id}", daemon=True)
        self._thread.start()

    def _keep_alive(self) -> None:
        interval = self.ttl_ms / 4000
        while not self._stop.wait(interval):
            if time.monotonic() - self._last_progress > self.hang_seconds:
                log.error("no rollout of group %d finished for %.0f s: letting its lease expire so another worker "
                          "takes over", self.group_id, self.hang_seconds)
                return
            try:
                if not self._refresh_now():
                    self.lost = True
                    return
            except redis.RedisError as error:  # the main loop meets the same error and reports it
                log.warning("could not refresh the lease of group %d: %s", self.group_id, error)

    def _refresh_now(self) -> bool:
        """Extend the lease and store the latest progress, if the lease is still ours."""
        progress = "" if self._next_rollout_id is None else self._next_rollout_id
        return bool(self._refresh(keys=self._lease_keys(), args=[self.holder, self.ttl_ms, progress]))

    def _lease_keys(self) -> list[str]:
        return [self.keys.lease(self.group_id), self.keys.progress(self.group_id)]

    def touch(self) -> None:
        """The job is alive and waiting (for queue space, for weights): not hung."""
        self._last_progress = time.monotonic()

    def record_progress(self, next_rollout_id: int) -> None:
        """After a push: note the next rollout id (the refresher stores it, so this costs no round trip);
        raise LeaseLostError if another job took over. A re-run may thus repeat up to a refresh
        interval of rollouts, which the queue's idempotent push drops."""
        self._last_progress = time.monotonic()
        self._next_rollout_id = next_rollout_id
        if self.lost:
            raise LeaseLostError(f"group {self.group_id} was taken over by another job; {self.holder} stops")

    def mark_failed(self) -> bool:
        """Keep the group from being re-run after its job failed (the learner reports the failure instead),
        if the lease is still this job's; False when another job took the group over meanwhile (this one
        had hung past its lease), which then runs on untouched."""
        self._stop.set()
        try:
            return bool(self._mark_failed(keys=[self.keys.lease(self.group_id)],
                                          args=[self.holder, f"{FAILED_PREFIX}{self.holder}"]))
        except redis.RedisError as error:  # the failure is still reported; the reaper may re-run the group
            log.warning("could not mark group %d failed: %s", self.group_id, error)
            return True

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if not self.lost:
                self._refresh_now()  # the final progress, before letting go
            self._release(keys=[self.keys.lease(self.group_id)], args=[self.holder])
        except redis.RedisError:
            pass


def hand_over(pipe: redis.Redis | Pipeline, keys: RunKeys, group_id: int, holder: str, rollout_id: int,
              lease_seconds: float) -> None:
    """Give a group's lease to ``holder`` (a job being enqueued) and set its progress to ``rollout_id``.

    Queue it on the transaction that enqueues the job, so the reaper never sees the job waiting
    without a lease; the job's GroupLease takes over the same lease when it starts.
    """
    pipe.set(keys.lease(group_id), holder, px=int(lease_seconds * 1000))
    pipe.set(keys.progress(group_id), rollout_id)


def hand_over_from(connection: redis.Redis, keys: RunKeys, group_id: int, holder: str, new_holder: str,
                   rollout_id: int, lease_seconds: float) -> bool:
    """Give the group to ``new_holder`` (a continuation) only while ``holder`` still has it; False if it lost it."""
    script = connection.register_script(_HAND_OVER_FROM)
    return bool(script(keys=[keys.lease(group_id), keys.progress(group_id)],
                       args=[holder, new_holder, int(lease_seconds * 1000), rollout_id]))


def set_progress(pipe: redis.Redis | Pipeline, keys: RunKeys, group_id: int, next_rollout_id: int) -> None:
    """Set where a group's next (re-)run starts, e.g. after Redis lost the run's keys."""
    pipe.set(keys.progress(group_id), next_rollout_id)


def parse_progress(value: bytes | str | None, key: str) -> int | None:
    """A stored progress as an int; None if missing, or (with a warning naming the key) not a rollout id."""
    if value is None:
        return None
    try:
        progress = int(value)
    except (TypeError, ValueError):
        progress = -1
    if progress < 0:
        log.warning("%s holds %r, not a rollout id: ignoring it (it is written again with the group's next "
                    "push; if this recurs, something other than rqrl writes to this Redis)", key, value)
        return None
    return progress


def recorded_progress(connection: redis.Redis, keys: RunKeys, group_id: int) -> int | None:
    """The next rollout id recorded for a group; None if there is none, or none that parses."""
    return parse_progress(connection.get(keys.progress(group_id)), keys.progress(group_id))


def read_progress(connection: redis.Redis, keys: RunKeys, group_id: int, default: int = 0) -> int:
    """The next rollout id of a group (``default``, e.g. 0 before its first push, if none is recorded)."""
    progress = recorded_progress(connection, keys, group_id)
    return default if progress is None else progress


def start_rollout(keys: RunKeys, group_id: int, requested: int, recorded: int | None) -> int:
    """Where a job starts: the group's recorded progress, which only lease holders move, over the rollout id
    in the job's arguments (which anyone who can enqueue a job chooses); warns when they disagree."""
    if recorded is None or recorded == requested:
        return requested
    log.warning("a job of run %s asks to run actor group %d from rollout %d, but the group's recorded progress "
                "(%s) says %d: starting from %d", keys.run_name, group_id, requested, keys.progress(group_id),
                recorded, recorded)
    return recorded


def group_is_leased(connection: redis.Redis, keys: RunKeys, group_id: int) -> bool:
    """Whether a live, hung-but-not-yet-expired or failed job holds the group's lease."""
    return bool(connection.exists(keys.lease(group_id)))


class Reaper:
    """Learner-side: re-enqueues groups whose job lost its lease without a successor in the queue.

    A group is reaped only when two passes at least ``min_interval`` apart both find it without a
    lease and without a queued job, so a job that was just dequeued has time to take its lease.
    A lease that cannot be right is deleted with a warning and the group treated as lease-less:
    one with no expiry (only a failed job's mark has none), one set for longer than leases are
    given (``lease_seconds``), or one whose holder is no job of the group. A failed job's mark
    keeps its group from being re-run; it is logged once, as the learner raises the failure its
    job reported (a mark planted without a report is thus noticed, not repaired).
    """

    def __init__(self, connection: redis.Redis, keys: RunKeys, n_groups: int, min_interval: float = 1.0,
                 lease_seconds: float = 5.0):
        self.connection, self.keys, self.n_groups, self.min_interval = connection, keys, n_groups, min_interval
        self.max_ttl_ms = int(lease_seconds * 1000) + _TTL_SLACK_MS
        self._suspects: set[int] = set()
        self._last_pass = 0.0
        self._delete_if = connection.register_script(_RELEASE)
        self._failed_logged: set[int] = set()
        self.reaped = 0
        self.leases_repaired = 0

    def orphaned_groups(self, queue_key: str) -> list[int]:
        """Groups to re-enqueue now (empty most of the time); ``queue_key`` is the RQ queue's list of job ids.

        Leases and queued jobs are read in one transaction: read apart, a job dequeued between the
        two reads (or a continuation enqueued just after its group's lease was read) would look like
        a group with neither.
        """
        now = time.monotonic()
        if now - self._last_pass < self.min_interval:
            return []
        self._last_pass = now
        lease_keys = [self.keys.lease(group) for group in range(self.n_groups)]
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.mget(lease_keys)
            for key in lease_keys:
                pipe.pttl(key)
            pipe.lrange(queue_key, 0, -1)
            leases, *ttls, queued = pipe.execute()
        without = set()
        for group, (lease, ttl) in enumerate(zip(leases, ttls, strict=True)):
            if lease is None or self._repaired(group, lease, int(ttl)):
                without.add(group)
        if without:
            without -= {self.keys.group_of_job(job_id.decode() if isinstance(job_id, bytes) else job_id)
                        for job_id in queued}
        orphaned = sorted(without & self._suspects)
        self._suspects = without - set(orphaned)
        self.reaped += len(orphaned)
        return orphaned

    def _repaired(self, group: int, lease: bytes, ttl_ms: int) -> bool:
        """Delete the group's lease if it cannot be right (then the group counts as lease-less)."""
        value = lease.decode(errors="replace")
        if value.startswith(FAILED_PREFIX) and ttl_ms == -1:
            if group not in self._failed_logged:
                self._failed_logged.add(group)
                log.warning("actor group %d of run %s is marked failed (%s = %r): it is not re-run; the learner "
                            "raises the failure its job reported (delete the key to re-run the group)", group,
                            self.keys.run_name, self.keys.lease(group), value)
            return False
        if self.keys.group_of_job(value.split("#")[0]) != group:
            problem = "names no job of this group"
        elif ttl_ms == -1:
            problem = "has no expiry"
        elif ttl_ms > self.max_ttl_ms:
            problem = f"expires in {ttl_ms / 1000:.0f} s, longer than any lease is given ({self.max_ttl_ms} ms)"
        else:
            return False
        if self._delete_if(keys=[self.keys.lease(group)], args=[lease]):
            self.leases_repaired += 1
            log.warning("%s = %r %s, which no lease rqrl sets does: deleted it, so the group is re-run if no job "
                        "runs it (if this recurs, something other than rqrl writes to this Redis)",
                        self.keys.lease(group), value, problem)
        return True


def learner_alive(deadline: bytes | str | None, now: float | None = None) -> bool:
    """Whether a run's learner is alive by its heartbeat ``deadline`` as Redis holds it: there is one, and it has
    not passed (``rqrl health --run`` and ``rqrl status`` both answer by this)."""
    return deadline is not None and not learner_gone(deadline, now)


def learner_gone(deadline: bytes | str | None, now: float | None = None) -> bool:
    """Whether the run's learner missed its heartbeat deadline (unix seconds; see RunKeys.learner_deadline).
    No deadline, or one that does not parse, counts as alive: stopping a run takes a positive sign."""
    if deadline is None:
        return False
    try:
        value = float(deadline)
    except (TypeError, ValueError):
        return False
    return (time.time() if now is None else now) > value

