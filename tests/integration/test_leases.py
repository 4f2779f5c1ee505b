"""Faults on workers: killed or hung workers' actor groups are re-run elsewhere, nothing is lost
and nothing is delivered twice (real Redis, real `rqrl worker` processes).

The tests here run in-process; those that start processes are in tests/processes/test_leases.py.
"""

from __future__ import annotations

import functools

import pytest

from rqrl.engine.leases import group_is_leased
from tests.factories import redis_actors
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)

# actors for `rqrl worker` processes: one actor per job, jobs that yield every 0.2 s so groups move between workers
actors_on_workers = functools.partial(redis_actors, n_actors=4, actors_per_job=1, min_job_seconds=0.2)


def test_resuming_with_other_settings_is_refused(connection, redis_url, run_name):
    from rqrl import ConfigError

    first = actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2)
    first.start()
    try:
        with pytest.raises(ConfigError, match="cannot resume"):
            actors_on_workers(redis_url, run_name, n_actors=3, batch_size=2, resume=True).start()
    finally:
        first.stop()


def test_a_job_dequeued_but_not_started_keeps_its_group_until_the_handed_over_lease_expires(
        connection, redis_url, run_name):
    from rq import Queue

    from rqrl.engine.leases import Reaper

    actors = actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2)
    actors.start()  # no worker: the two groups' jobs wait in the queue, each with the lease handed to it
    try:
        queue_key = Queue("rqrl", connection=connection).key
        leases = [connection.get(actors.keys.lease(group)) for group in range(2)]
        assert leases == [actors.keys.job_id(group, 0).encode() for group in range(2)]
        connection.delete(queue_key)  # as if workers dequeued both jobs and had not started them yet
        reaper = Reaper(connection, actors.keys, 2, min_interval=0.0)
        assert reaper.orphaned_groups(queue_key) == [] and reaper.orphaned_groups(queue_key) == []
        # the workers died before starting: the leases lapse
        wait_until(lambda: not any(group_is_leased(connection, actors.keys, group) for group in range(2)),
                   actors.config.lease_seconds + 10, message="the handed-over leases lapsing")
        reaper.orphaned_groups(queue_key)
        assert reaper.orphaned_groups(queue_key) == [0, 1]
    finally:
        actors.stop()
