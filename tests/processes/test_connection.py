"""Redis restarted mid-run: learner and workers ride it out; a Redis that stays away is a clear error.

The tests here start processes; the in-process ones are in tests/integration/test_connection.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from rqrl import RolloutEvents
from rqrl.engine.server import EmbeddedRedis
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


def test_a_full_redis_is_named_and_ridden_out_once_memory_is_back(run_name, caplog):
    """Redis at its maxmemory for 15 s: the learner waits (no error), says Redis is out of memory, and batches
    flow again within 20 s of memory coming back; the workers live through it."""
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        pool = WorkerProcesses(server.url)
        try:
            for index in range(2):
                pool.start(f"w{index}")
            pool.wait_registered(client, 2)
            with redis_actors(server.url, run_name, actors_per_job=1, redis_outage_seconds=40) as actors:
                actors.broadcast_updated_policy(actors.policy.state_dict())
                for _ in range(3):
                    actors.collect_outputs("cpu")
                client.config_set("maxmemory-policy", "noeviction")
                client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)
                lifted: list[float] = []
                lift = threading.Timer(15, lambda: (client.config_set("maxmemory", 0), lifted.append(time.monotonic())))
                lift.start()
                try:
                    while not lifted:
                        actors.collect_outputs("cpu")  # queued rollouts first, then it waits for memory
                    for _ in range(3):
                        actors.collect_outputs("cpu")
                    recovered = time.monotonic() - lifted[0]
                finally:
                    lift.cancel()
                print(f"batches flowed again {recovered:.2f} s after memory came back")
                assert recovered < 20, f"batches flowed again {recovered:.1f} s after memory came back"

                def both_workers_back() -> bool:  # a registration that expired while full comes back with a heartbeat
                    actors.collect_outputs("cpu")
                    return actors.workers_alive(cached=False) == 2

                wait_until(both_workers_back, 30, interval=0, message="both workers registered after the full Redis")
            assert any("is out of memory" in record.getMessage() for record in caplog.records), caplog.text
            assert all(process.poll() is None for process in pool.processes), "a worker died of the full Redis"
        finally:
            pool.stop_all()
