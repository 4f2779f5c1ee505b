"""A learner's tear-down of its run in Redis, which must not hang on a Redis that is gone, nor hide why it stopped.

A learner stops its run (stop flag, jobs, keys) on the way out: after Ctrl-C, after an error, or after an outage
that outlasted its window. Riding out another full window (60 s per command) there would hold the exit for
minutes, and an error raised from a ``finally`` would replace the one that stopped the run. So the tear-down's
commands ride out an outage until a few seconds after it began, and one that outlasts them ends its Redis part
with a warning that names what was left in Redis and how to delete it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import redis

from rqrl.engine.connection import SHUTDOWN_REDIS_GRACE_SECONDS, redact_url, refused_login, riding_out_briefly
from rqrl.errors import RedisUnavailableError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def tearing_down(client: redis.Redis, url: str | None, run_name: str, *, embedded: bool = False) -> Iterator[None]:
    """The block is run ``run_name``'s tear-down in Redis at ``url``: its commands ride out an outage until
    SHUTDOWN_REDIS_GRACE_SECONDS after it began, and one that lasts longer is logged, not raised (a refused login
    is raised). ``embedded``: the learner's own Redis, which goes with everything in it once stopped.

    The tear-down starts on fresh connections: a signal (Ctrl-C, SIGTERM) between a command and its reply leaves
    that idle connection owing a reply to whatever runs next on it (a pipeline then reads "Wrong number of
    response items")."""
    client.connection_pool.disconnect(inuse_connections=False)
    with riding_out_briefly(client, SHUTDOWN_REDIS_GRACE_SECONDS):
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError, RedisUnavailableError) as error:
            if refused_login(error) or refused_login(error.__cause__ or error):
                raise
            where = f"Redis at {redact_url(url)}"
            if embedded:
                log.warning("run %s: its own %s stopped answering before the run's tear-down (%s); nothing of the "
                            "run is left once it is stopped", run_name, where, error)
            else:
                log.warning("run %s: %s did not answer within %.0f s as the run stopped (%s): the run's keys and "
                            "queued jobs are left there, and its workers stop once they find its learner gone; "
                            "`rqrl stop %s --redis-url URL` deletes them once that Redis answers again", run_name,
                            where, SHUTDOWN_REDIS_GRACE_SECONDS, error, run_name)
