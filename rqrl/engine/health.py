"""Health checks a container runs (``rqrl health``): is this host's worker sending heartbeats, is a run's
learner alive. Each reads a few keys; neither changes anything."""

from __future__ import annotations

import datetime
import socket

import redis
from rq.utils import utcparse
from rq.worker_registration import REDIS_WORKER_KEYS

from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import learner_alive
from rqrl.engine.timings import protocol_timings

WORKER_KEY_PREFIX = "rq:worker:"
CLOCK_SKEW_SECONDS = 60.0
"""How far ahead of this machine's clock a worker's heartbeat may be dated and still count: clocks of synced
machines differ by far less, and a forged registration dated years ahead would otherwise count as alive forever."""


def heartbeat_age(raw: bytes | str | None, now: datetime.datetime) -> float:
    """Seconds since the RQ heartbeat ``raw`` (a worker hash's ``last_heartbeat``) at ``now``; infinity for one
    that does not parse or is dated more than CLOCK_SKEW_SECONDS ahead.

    >>> now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    >>> heartbeat_age(b"2025-12-31T23:59:50.000000Z", now), heartbeat_age(b"9999-01-01T00:00:00.000000Z", now)
    (10.0, inf)
    >>> heartbeat_age(b"junk", now), heartbeat_age(None, now)
    (inf, inf)
    """
    try:
        age = (now - utcparse(raw.decode() if isinstance(raw, bytes) else str(raw))).total_seconds()
    except (AttributeError, TypeError, UnicodeDecodeError, ValueError, OverflowError):
        return float("inf")
    return age if age >= -CLOCK_SKEW_SECONDS else float("inf")


def host_worker_prefix() -> str:
    """What the default names of this host's workers start with (``rqrl health --worker`` looks for them)."""
    return f"rqrl.{socket.gethostname()}."


def worker_heartbeat_ages(connection: redis.Redis, name_prefix: str) -> dict[str, float]:
    """Seconds since the last heartbeat of each registered RQ worker whose name starts with ``name_prefix``
    (infinity for a heartbeat that does not parse or is dated ahead, see heartbeat_age)."""
    keys = sorted(key.decode() if isinstance(key, bytes) else str(key)
                  for key in connection.smembers(REDIS_WORKER_KEYS))
    keys = [key for key in keys if key.startswith(WORKER_KEY_PREFIX + name_prefix)]
    if not keys:
        return {}
    with connection.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.hget(key, "last_heartbeat")
        heartbeats = pipe.execute()
    now = datetime.datetime.now(datetime.UTC)
    return {key[len(WORKER_KEY_PREFIX):]: heartbeat_age(heartbeat, now)
            for key, heartbeat in zip(keys, heartbeats, strict=True)}


def worker_is_healthy(connection: redis.Redis, name_prefix: str) -> tuple[bool, str]:
    """Whether a worker named ``name_prefix``... sent a heartbeat within the liveness window
    (ProtocolTimings.liveness), and why not."""
    ages = worker_heartbeat_ages(connection, name_prefix)
    if not ages:
        return False, f"no RQ worker named {name_prefix}* is registered"
    name, age = min(ages.items(), key=lambda item: item[1])
    liveness = protocol_timings().liveness
    if age == float("inf"):
        return False, f"worker {name} has no heartbeat to trust (none, unreadable, or dated ahead)"
    if age > liveness:
        return False, f"worker {name} sent its last heartbeat {age:.0f} s ago (more than {liveness:g} s)"
    return True, f"worker {name} sent a heartbeat {age:.0f} s ago"


def learner_is_healthy(connection: redis.Redis, run_name: str) -> tuple[bool, str]:
    """Whether run ``run_name`` is in Redis and its learner's heartbeat deadline has not passed, and why not."""
    keys = RunKeys(run_name)
    config, deadline = connection.mget([keys.config, keys.learner_deadline])
    if config is None:
        return False, f"no run {run_name!r} in Redis"
    if not learner_alive(deadline):
        return False, f"the learner of run {run_name} is past its heartbeat deadline (learner_timeout)"
    return True, f"the learner of run {run_name} is alive"
