"""The learner's watch over a run's jobs: re-runs actor groups whose job died or hung, counts the
workers that are alive, and raises the failures workers report."""

from __future__ import annotations

import datetime
import json
import logging
import time

import redis
from rq import Queue, Worker
from rq.job import Job
from rq.serializers import JSONSerializer

from rqrl.errors import ActorFailedError
from rqrl.jobs import LIVENESS_SECONDS, enqueue_group
from rqrl.keys import RunKeys
from rqrl.leases import Reaper, read_progress
from rqrl.rq_safety import started_registry
from rqrl.run_config import RunConfig

log = logging.getLogger(__name__)


class Supervisor:
    """Supervises the jobs of one run on ``queue``."""

    def __init__(self, connection: redis.Redis, config: RunConfig, queue: Queue):
        self.connection, self.config, self.queue = connection, config, queue
        self.keys = RunKeys(config.run_name)
        self.reaper = Reaper(connection, self.keys, len(config.actor_groups))
        self._last_failure_check = 0.0
        self._workers_alive = (-1e9, 0)

    def start_groups(self) -> None:
        """Enqueue one job per actor group of a new run."""
        for group_id in range(len(self.config.actor_groups)):
            enqueue_group(self.connection, self.config, group_id, 0)

    def rerun_orphaned_groups(self) -> list[int]:
        """Re-enqueue groups whose job died with its worker or hung (see rqrl.leases); returns them."""
        orphaned = self.reaper.orphaned_groups(self.queue.key)
        for group_id in orphaned:
            self._forget_started_jobs(group_id)
            rollout_id = read_progress(self.connection, self.keys, group_id)
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
        raw = self.connection.lpop(self.keys.errors)
        if not isinstance(raw, bytes | str):  # None: no failure reported
            return
        report = json.loads(raw)
        raise ActorFailedError(
            f"actors {report['actor_ids']} failed on worker {report['worker']} at rollout "
            f"{report['rollout_id']}: {report['error']}",
            job_id=report["job_id"],
            actor_ids=report["actor_ids"],
            remote_traceback=report["traceback"],
        )

    def workers_alive(self, cached: bool = True) -> int:
        """Workers on the run's queue with a heartbeat in the last LIVENESS_SECONDS (a SIGKILLed
        worker stays registered in RQ for minutes); re-read at most once a second if ``cached``."""
        now = time.monotonic()
        if not cached or now - self._workers_alive[0] > 1.0:
            self._workers_alive = (now, count_live_workers(self.connection, self.queue))
        return self._workers_alive[1]


def count_live_workers(connection: redis.Redis, queue: Queue) -> int:
    """Workers listening on ``queue`` whose last heartbeat is at most LIVENESS_SECONDS old."""
    cutoff = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=LIVENESS_SECONDS)
    live = 0
    for worker in Worker.all(connection=connection, queue=queue, serializer=JSONSerializer):
        heartbeat = worker.last_heartbeat
        if heartbeat is not None and heartbeat.tzinfo is None:
            heartbeat = heartbeat.replace(tzinfo=datetime.UTC)
        if heartbeat is not None and heartbeat >= cutoff:
            live += 1
    return live
