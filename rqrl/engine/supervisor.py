"""The learner's watch over a run's jobs: re-runs actor groups whose job died or hung, counts the
workers that are alive, raises the failures workers report, and counts rollouts that never arrived.

Everything read from Redis here is parsed defensively: an error report that is not the JSON a
worker writes is dropped, counted (``error_reports_rejected``) and logged, never raised; a worker
hash with junk fields counts as a worker without a heartbeat; a progress that does not parse is
replaced by what the learner knows (its delivered rollouts), with a warning."""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, Worker
from rq.job import Job
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from rqrl.engine.enqueue import enqueue_group
from rqrl.engine.health import heartbeat_age
from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import Reaper, recorded_progress
from rqrl.engine.rq_safety import started_registry
from rqrl.engine.run_config import RunConfig
from rqrl.errors import ActorFailedError, CollectTimeoutError, NoWorkersError, WorkersRefusedError

log = logging.getLogger(__name__)


LARGE_GROUP_ACTORS = 1024
"""An actor group of this many envs or more can take a job long enough to make and reset to look like a hang."""


class Supervisor:
    """Supervises the jobs of one run on ``queue``."""

    def __init__(self, connection: redis.Redis, config: RunConfig, queue: Queue):
        self.connection, self.config, self.queue = connection, config, queue
        self.keys = RunKeys(config.run_name)
        self.reaper = Reaper(connection, self.keys, len(config.actor_groups), lease_seconds=config.lease_seconds)
        self._last_failure_check = 0.0
        self._workers_alive = (-1e9, 0)
        self.error_reports_rejected = 0
        self._last_sideline_check = 0.0
        self.sidelined: dict[str, dict[str, Any]] = {}  # worker name -> its report (see check_sidelined_workers)

    def start_groups(self) -> None:
        """Enqueue one job per actor group of a new run."""
        for group_id in range(len(self.config.actor_groups)):
            enqueue_group(self.connection, self.config, group_id, 0)

    def rerun_orphaned_groups(self, delivered_next: Callable[[int], int] | None = None,
                              rerun: Callable[[int], bool] | None = None) -> list[int]:
        """Re-enqueue groups whose job died with its worker or hung (see rqrl.engine.leases); returns them.
        ``delivered_next(group)`` is where the learner's delivered rollouts end: where a group is re-run
        from if its recorded progress is missing or does not parse. ``rerun(group)``, if given, enqueues
        the group's job instead (the sampler's), or returns False when the group has nothing left to do."""
        orphaned = self.reaper.orphaned_groups(self.queue.key)
        if rerun is not None:
            done = []
            for group_id in orphaned:
                self._forget_started_jobs(group_id)
                if rerun(group_id):
                    done.append(group_id)
                    log.warning("group %d of run %s lost its job (worker killed or hung): re-running it", group_id,
                                self.config.run_name)
            return done
        for group_id in orphaned:
            self._forget_started_jobs(group_id)
            rollout_id = recorded_progress(self.connection, self.keys, group_id)
            if rollout_id is None:
                rollout_id = delivered_next(group_id) if delivered_next is not None else 0
            enqueue_group(self.connection, self.config, group_id, rollout_id)
            log.warning("actor group %d of run %s lost its job (worker killed or hung): re-running it from "
                        "rollout %d", group_id, self.config.run_name, rollout_id)
        return orphaned

    def _forget_started_jobs(self, group_id: int) -> None:
        """Drop a dead group's job from RQ's started registry (entries are ``job_id:execution_id``)."""
        registry_key = started_registry(self.queue.name, self.connection).key
        for entry in self.connection.zrange(registry_key, 0, -1):
            member = entry.decode() if isinstance(entry, bytes) else str(entry)
            job_id = member.split(":")[0]
            if self.keys.group_of_job(job_id) == group_id:
                self.connection.zrem(registry_key, member)
                self.connection.delete(Job.key_for(job_id))

    def raise_actor_failures(self, throttled: bool = False) -> None:
        """ActorFailedError for the oldest failure a worker reported; checks at most every 0.5 s if ``throttled``."""
        now = time.monotonic()
        if throttled and now - self._last_failure_check < 0.5:
            return
        self._last_failure_check = now
        while True:
            raw = self.connection.lpop(self.keys.errors)
            if raw is None:
                return
            report = parse_error_report(raw) if isinstance(raw, (bytes, str)) else None
            if report is not None:
                break
            self.error_reports_rejected += 1
            log.warning("dropped an entry of %s that is not a worker's error report: %.200r (if this recurs, "
                        "something other than rqrl writes to this Redis)", self.keys.errors, raw)
        raise ActorFailedError(
            f"actors {report['actor_ids']} failed on worker {report['worker']} at rollout "
            f"{report['rollout_id']}: {report['error']}",
            job_id=report["job_id"],
            actor_ids=report["actor_ids"],
            remote_traceback=report["traceback"],
        )

    def check_sidelined_workers(self, throttled: bool = False) -> None:
        """Warn once for each worker that cannot run this run (it hands the jobs back, the run goes on); raise
        WorkersRefusedError when every live worker on the queue is such a worker. At most once a second if
        ``throttled``."""
        now = time.monotonic()
        if throttled and now - self._last_sideline_check < 1.0:
            return
        self._last_sideline_check = now
        reports = read_sideline_reports(self.connection, self.keys)
        for name, report in reports.items():
            if name not in self.sidelined:
                log.warning("worker %s cannot run %s and is sidelined: it hands the run's jobs back, and the run "
                            "goes on with the other workers. %s", name, self.keys.run_name, report["error"])
        self.sidelined = reports  # a worker that withdrew its report (rqrl.engine.jobs.fit_again) runs the run again
        if not self.sidelined:
            return
        live = live_worker_names(self.connection, self.queue, self.config.timings.liveness)
        if live and live <= self.sidelined.keys():
            first = self.sidelined[min(live)]
            raise WorkersRefusedError(
                f"every live worker on queue {self.queue.name!r} ({', '.join(sorted(live))}) refused run "
                f"{self.keys.run_name!r}, so nothing can run it; {first['worker']}: {first['error']}",
                job_id=first["job_id"], actor_ids=[], remote_traceback=first["traceback"])

    def no_workers_error(self, seconds: float) -> CollectTimeoutError:
        """What to raise when no worker has sent a heartbeat for ``seconds``: NoWorkersError, unless jobs of
        the run that started still hold live leases, i.e. their workers are alive and the jobs hung (a
        worker's heartbeats come from its job between rollouts; the lease from a thread beside it)."""
        lease_keys = [self.keys.lease(group) for group in range(len(self.config.actor_groups))]
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.mget(lease_keys)
            for key in lease_keys:
                pipe.pttl(key)
            leases, *ttls = pipe.execute()
        # a running job's lease names it with its run's token (rqrl.engine.leases.lease_holder); a queued job's,
        # handed over at enqueue, names only the job
        held = [group for group, (lease, ttl) in enumerate(zip(leases, ttls, strict=True))
                if lease is not None and int(ttl) > 0 and b"#" in lease and not lease.startswith(b"failed:")]
        queue_name = self.config.queue_name
        if held:
            return CollectTimeoutError(
                f"no worker on queue {queue_name!r} has sent a heartbeat for {seconds:.0f} s, but the jobs of actor "
                f"groups {held} still hold their leases: their workers are alive and the jobs hung, most likely in "
                f"the env's reset or step (or in the policy){self._large_groups(held)}. rqrl re-runs a group whose "
                f"job finished no rollout for hang_seconds ({self.config.hang_seconds:.0f} s); fix the env (look at "
                f"the workers' stacks, e.g. with py-spy dump), or give hang_seconds a bound the env keeps"
            )
        return NoWorkersError(
            f"no worker has been listening on queue {queue_name!r} for {seconds:.0f} s; start some with "
            f"'rqrl worker --redis-url URL --queue {queue_name}'"
        )

    def _large_groups(self, groups: list[int]) -> str:
        """For the hang error: the envs a job of these groups makes and resets before its first rollout, when that
        many may be the cause."""
        most = max(len(self.config.actor_groups[group]) for group in groups)
        if most < LARGE_GROUP_ACTORS:
            return ""
        return (f", or in making and resetting the {most:,} envs its group steps (n_actors / actors_per_job); lower "
                f"n_actors, or spread them over more workers and jobs")

    def workers_alive(self, cached: bool = True) -> int:
        """Workers on the run's queue with a heartbeat within the run's liveness window (a SIGKILLed
        worker stays registered in RQ for minutes); re-read at most once a second if ``cached``, but at every call
        while none was found (a count taken as the run started read 0 while its first rollouts flowed)."""
        now = time.monotonic()
        if not cached or now - self._workers_alive[0] > 1.0 or self._workers_alive[1] == 0:
            self._workers_alive = (now, count_live_workers(self.connection, self.queue,
                                                                     self.config.timings.liveness))
        return self._workers_alive[1]


_REPORT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "job_id": str, "actor_ids": list, "rollout_id": int, "worker": str, "error": str, "traceback": str}


def parse_error_report(raw: bytes | str) -> dict[str, Any] | None:
    """A worker's error report (rqrl.engine.group_job.GroupJob._fail), or None if ``raw`` is not one."""
    try:
        report = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(report, dict):
        return None
    for name, kind in _REPORT_FIELDS.items():
        if not isinstance(report.get(name), kind):
            return None
    if not all(isinstance(actor, int) for actor in report["actor_ids"]):
        return None
    return report


_SIDELINE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "worker": str, "job_id": str, "error": str, "traceback": str, "at": (int, float)}


def read_sideline_reports(connection: redis.Redis, keys: RunKeys) -> dict[str, dict[str, Any]]:
    """The run's sidelined workers (rqrl.maze.jobs._sideline): name -> report; entries that are not a worker's
    report (job data is anyone's who can write to Redis) are left out."""
    reports = {}
    for raw_name, raw in connection.hgetall(keys.sidelined).items():
        try:
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            report = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(report, dict) and all(isinstance(report.get(field), kind)
                                            for field, kind in _SIDELINE_FIELDS.items()):
            reports[name] = report
    return reports


def count_live_workers(connection: redis.Redis, queue: Queue, liveness: float) -> int:
    """How many workers listen on ``queue`` with a heartbeat at most ``liveness`` s old (see live_worker_names)."""
    return len(live_worker_names(connection, queue, liveness))


def live_worker_names(connection: redis.Redis, queue: Queue, liveness: float) -> set[str]:
    """Names of the workers listening on ``queue`` whose last heartbeat is at most ``liveness`` seconds old
    (ProtocolTimings.liveness).

    Reads only each worker hash's ``last_heartbeat`` (RQ's ``Worker.all`` parses every field and
    fails on the first hash with junk in one); a heartbeat that does not parse, or is dated ahead (a forged
    registration), counts as none (health.heartbeat_age)."""
    worker_keys = sorted(connection.smembers(WORKERS_BY_QUEUE_KEY % queue.name))
    if not worker_keys:
        return set()
    with connection.pipeline(transaction=False) as pipe:
        for key in worker_keys:
            pipe.hget(key, "last_heartbeat")
        heartbeats = pipe.execute()
    now = datetime.datetime.now(datetime.UTC)
    live = set()
    for key, heartbeat in zip(worker_keys, heartbeats, strict=True):
        try:
            name = key.decode() if isinstance(key, bytes) else str(key)
        except UnicodeDecodeError:
            continue
        if heartbeat_age(heartbeat, now) <= liveness:
            live.add(name.removeprefix(Worker.redis_worker_namespace_prefix))
    return live
