"""Rollout jobs on RQ's queues: the job functions rqrl's workers run (by name, and no others), how long a failed
job stays for inspection, and the enqueueing of a group's next job with its lease handed over."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import hand_over, hand_over_from
from rqrl.engine.run_config import RunConfig
from rqrl.errors import LeaseLostError

JOB_FUNCTION = "rqrl.maze.jobs.run_actor_group"
"""Maze's actors (rqrl.maze.jobs)."""
SAMPLER_JOB_FUNCTION = "rqrl.garage.jobs.run_sampler_group"
"""garage's sampler (rqrl.garage.jobs)."""
SEED_ACTOR_JOB_FUNCTION = "rqrl.seed.jobs.run_seed_actor"
SEED_SERVER_JOB_FUNCTION = "rqrl.seed.jobs.run_seed_server"
ALLOWED_JOB_FUNCTIONS = frozenset({JOB_FUNCTION, SAMPLER_JOB_FUNCTION, SEED_ACTOR_JOB_FUNCTION,
                                   SEED_SERVER_JOB_FUNCTION})
"""The only functions an rqrl worker runs (rqrl.engine.rq_safety refuses any other job)."""
ERROR_TTL_SECONDS = 24 * 3600
"""How long RQ keeps a failed rollout job, for rq-dashboard and `rqrl status`."""


def enqueue_group(connection: redis.Redis, config: RunConfig, group_id: int, rollout_id: int,
                  holder: str | None = None) -> str:
    """Enqueue the job that runs ``group_id`` from ``rollout_id`` on; returns the job id.

    The group's lease and progress are handed to the new job at once, so the reaper does not take
    a job that a worker has dequeued but not yet started for a dead one (if it waits in the queue
    longer than the lease, the queue itself shows it is not lost). A job enqueueing its own
    continuation passes its lease ``holder``: LeaseLostError if it no longer holds the group.
    """
    keys = RunKeys(config.run_name)
    new_holder = keys.job_id(group_id, rollout_id)
    holder_job = holder.partition("#")[0] if holder is not None else None
    if holder_job is not None and (holder_job == new_holder or holder_job.startswith(new_holder + "_a")):
        # a job handing its group back before it ran a rollout: under its own id, the new job would be deleted
        # with the old one's hash when that ends (result_ttl=0), or overwritten when it is filed as failed
        new_holder = keys.job_id(group_id, rollout_id, again=uuid.uuid4().hex[:8])
    description = f"rqrl {config.run_name} actors {config.actor_groups[group_id]} from rollout {rollout_id}"
    return enqueue_with_lease(connection, config, JOB_FUNCTION, group_id, rollout_id, new_holder, holder, description)


def enqueue_with_lease(connection: redis.Redis, config: RunConfig, function: str, group_id: int, position: int,
                       job_id: str, holder: str | None, description: str) -> str:
    """Hand ``group_id``'s lease (and ``position``, its progress) to job ``job_id``, then enqueue it to run
    ``function(run name, group id, position)``; with ``holder`` (a continuation) only while that job still holds
    the group, else LeaseLostError. Every family's group jobs are enqueued here."""
    keys = RunKeys(config.run_name)
    if holder is not None:
        if not hand_over_from(connection, keys, group_id, holder, job_id, position, config.lease_seconds):
            raise LeaseLostError(f"group {group_id} is no longer {holder}'s: enqueueing no continuation")
        return _enqueue(connection, config.queue_name, function, (config.run_name, group_id, position), job_id,
                        description)
    return enqueue_leased(connection, keys, config.queue_name, function, (config.run_name, group_id, position),
                          group_id, job_id, config.lease_seconds, description, position)


def enqueue_leased(connection: redis.Redis, keys: RunKeys, queue_name: str, function: str, arguments: tuple[Any, ...],
                   group_id: int, job_id: str, lease_seconds: float, description: str, position: int = 0) -> str:
    """Hand ``group_id``'s lease (and ``position``, its progress) to job ``job_id``, whoever held it, then enqueue
    ``function(*arguments)`` under that id; an older job of the group loses its lease and stops."""
    with connection.pipeline(transaction=True) as pipe:
        hand_over(pipe, keys, group_id, job_id, position, lease_seconds)
        pipe.execute()
    return _enqueue(connection, queue_name, function, arguments, job_id, description)


def _enqueue(connection: redis.Redis, queue_name: str, function: str, arguments: tuple[Any, ...], job_id: str,
             description: str) -> str:
    queue = Queue(queue_name, connection=connection, serializer=JSONSerializer)
    job = queue.enqueue(function, *arguments, job_id=job_id, description=description, result_ttl=0,
                        failure_ttl=ERROR_TTL_SECONDS, job_timeout=-1)
    return str(job.id)
