"""The tear-down against a real Redis: it starts on fresh connections."""

from __future__ import annotations

import redis

from rqrl.engine.teardown import tearing_down


def test_a_connection_a_signal_left_owing_a_reply_is_not_used_by_the_tear_down(redis_url, run_name):
    """A SIGTERM between a pipeline's commands and its replies left the connection owing them: the SEED trainer's
    tear-down then read `Wrong number of response items from pipeline execution`."""
    client = redis.Redis.from_url(redis_url)
    client.set(f"{run_name}:a", "1")
    owing = client.connection_pool.get_connection()
    owing.send_command("GET", f"{run_name}:a")  # sent, its reply never read: as an interrupted command leaves it
    client.connection_pool.release(owing)
    with tearing_down(client, redis_url, run_name):
        with client.pipeline(transaction=False) as pipe:
            pipe.exists(f"{run_name}:a")
            pipe.exists(f"{run_name}:none")
            assert pipe.execute() == [1, 0]
    client.delete(f"{run_name}:a")
