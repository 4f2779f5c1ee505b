"""The supervisor's reading of worker registrations, against a real Redis: what counts as a live worker."""

from __future__ import annotations

import datetime

from rq import Queue
from rq.utils import utcformat

from rqrl.engine.health import worker_heartbeat_ages, worker_is_healthy
from rqrl.engine.supervisor import live_worker_names


def register(connection, name: str, heartbeat: str | bytes, queue: str = "rqrl") -> None:
    """A worker registration as anyone who can write to Redis can plant one."""
    connection.sadd(f"rq:workers:{queue}", f"rq:worker:{name}")
    connection.sadd("rq:workers", f"rq:worker:{name}")
    connection.hset(f"rq:worker:{name}", "last_heartbeat", heartbeat)


def test_a_forged_registration_dated_ahead_or_unreadable_is_no_live_worker(connection):
    now = datetime.datetime.now(datetime.UTC)
    register(connection, "rqrl.real", utcformat(now))
    register(connection, "rqrl.skewed", utcformat(now + datetime.timedelta(seconds=5)))  # a clock a bit ahead
    register(connection, "rqrl.forever", "9999-12-31T23:59:59.000000Z")
    register(connection, "rqrl.tomorrow", utcformat(now + datetime.timedelta(days=1)))
    register(connection, "rqrl.junk", b"\xff not a date")
    register(connection, "rqrl.old", utcformat(now - datetime.timedelta(minutes=5)))

    assert live_worker_names(connection, Queue("rqrl", connection=connection), 20) == {"rqrl.real", "rqrl.skewed"}
    ages = worker_heartbeat_ages(connection, "rqrl.")
    assert ages["rqrl.forever"] == ages["rqrl.tomorrow"] == ages["rqrl.junk"] == float("inf")
    healthy, why = worker_is_healthy(connection, "rqrl.forever")
    assert not healthy and why == "worker rqrl.forever has no heartbeat to trust (none, unreadable, or dated ahead)"
