"""Redis restarted mid-run: learner and workers ride it out; a Redis that stays away is a clear error.

The tests here start processes; the in-process ones are in tests/integration/test_connection.py.
"""

from __future__ import annotations

import time

import pytest
import redis

from rqrl import RolloutEvents
from tests.children import WorkerProcesses
from tests.factories import redis_actors
from tests.integration.test_connection import restartable  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)


def test_a_redis_restart_without_persistence_is_ridden_out(restartable, run_name):
    pool = WorkerProcesses(restartable.url)
    try:
        for index in range(2):
            pool.start(f"w{index}")
        pool.wait_registered(redis.Redis.from_url(restartable.url), 2)
        with redis_actors(restartable.url, run_name, actors_per_job=1, redis_outage_seconds=30) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            before = [actors.collect_outputs("cpu").record for _ in range(5)]
            restartable.kill()
            time.sleep(2.0)  # the point: Redis stays away a while, and learner and workers must ride it out
            restartable.start()  # empty: the run's keys, queue and RQ jobs are gone
            restarted = time.monotonic()
            after = [actors.collect_outputs("cpu").record for _ in range(5)]
            assert time.monotonic() - restarted < 30
            assert actors.get_stats_value(RolloutEvents.runs_restored, name="sum") >= 1

            def both_workers_back() -> bool:  # they register again with their next heartbeat
                actors.collect_outputs("cpu")
                return actors.workers_alive(cached=False) == 2

            wait_until(both_workers_back, 30, interval=0, message="both workers to register again after the restart")
            assert actors.records_rejected == 0
        assert all(process.poll() is None for process in pool.processes), "a worker died with the restart"
    finally:
        pool.stop_all()
    pairs = [(a, r) for record in before + after
             for a, r in zip(record.actor_id.tolist(), record.rollout_id.tolist(), strict=True)]
    assert len(pairs) == len(set(pairs)), "a rollout was delivered twice"
    for actor in (0, 1):  # rollout ids carry on where the learner left off (queued rollouts were lost)
        mine = [r for a, r in pairs if a == actor]
        assert mine == sorted(mine)
