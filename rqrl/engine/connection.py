"""Redis clients that ride out a Redis restart: redis-py's own retry with exponential backoff.

Commands that fail with a connection or timeout error, or that a full Redis refuses (``maxmemory``
reached: OOM), are retried for ``outage_seconds`` from their first failure (and at most one backoff
of 1 s more); only then does the error reach the caller. The window is a time, not a count of
retries: backoffs start at 50 ms, so a count made 3 s ride out 0.1-0.5 s, and redis-py retries a
health check's PING inside a command's retry, which made 60 s up to two minutes.
A retried command may run twice, which rqrl's writes tolerate: pushes are idempotent per rollout
id, weights are write-once per version. A command refused for memory did not run (Redis checks
memory before a command or script starts, and a transaction with a refused command runs none).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import PythonRespSerializer
from redis.exceptions import OutOfMemoryError
from redis.retry import Retry

from rqrl.engine.bounded_log import BoundedLog
from rqrl.errors import ConfigError, RedisOutOfMemoryError, RedisRefusedError, RedisUnavailableError

_T = TypeVar("_T")
log = logging.getLogger(__name__)
_OUT_OF_MEMORY_LOG = BoundedLog(log)

DEFAULT_OUTAGE_SECONDS = 60.0
SHUTDOWN_REDIS_GRACE_SECONDS = 3.0
"""How long a process that stops (a worker after SIGTERM, a learner's tear-down, `rqrl train` after a signal) still
rides out a Redis outage for its last writes, instead of the whole outage window."""
_BACKOFF_CAP_SECONDS = 1.0
_UNCOUNTED_RETRIES = 2**31 - 1
"""redis-py's count of retries, set out of reach: the outage window ends them (``_OutageRetry``)."""


def refused_login(error: BaseException) -> bool:
    """A refused login or an untrusted certificate, which redis-py reports as connection errors."""
    return isinstance(error, (redis.AuthenticationError, redis.exceptions.AuthorizationError)) or isinstance(
        error.__context__, ssl.SSLCertVerificationError)


def out_of_memory_advice(where: str) -> str:
    """What a Redis that refuses writes for memory means, and what to do about it."""
    return (f"{where} is out of memory: it refuses writes because it reached its maxmemory; free memory there "
            f"(a run's keys: `rqrl stop`), or raise it (CONFIG SET maxmemory, or maxmemory in redis.conf)")


class _GiveUp:
    """When a client stops riding out outages (``math.inf``: never); one per client, shared by its connections."""

    def __init__(self) -> None:
        self.at = math.inf
        self.stops = 0  # the process's: how often it was asked to stop (stop_riding_out_in_process)
        self.server_gone: Callable[[], object] | None = None  # truthy once the server can never answer again


_PROCESS_GIVE_UP = _GiveUp()
"""Every client's in this process, once the process is asked to stop (see ``stop_riding_out_in_process``)."""


class _CallWindow(threading.local):
    """This thread's command in retry: its outage window's end, kept through the retries redis-py nests inside it
    (a health check's PING, a reconnect), so a nested retry ends with the command's window rather than starting
    one of its own. The window closes when the command returns or raises, not when a nested retry gets through
    (a reconnect that succeeds to a Redis still refusing the command for memory is no end of the outage)."""

    def __init__(self) -> None:
        self.depth = 0
        self.ends_at: float | None = None


_CALL_WINDOW = _CallWindow()


class _CappedBackoff(ExponentialWithJitterBackoff):
    """redis-py's backoff, whose ``2**failures`` overflows a float after 1,024 failures (about 17 minutes of an
    outage at 1 s each): the exponent stops growing long before that, as the backoff is capped at 1 s anyway."""

    def compute(self, failures: int) -> float:
        return super().compute(min(failures, 32))


class _OutageRetry(Retry):
    """Retry through outages and a full Redis, but not through a refused login or an untrusted certificate,
    which redis-py also reports as connection errors and which no amount of waiting will fix. A full Redis
    is said at once (at a bounded rate), so a stall is never silent. Nor past ``give_up.at``: a process shutting
    down (see ``stop_riding_out``)."""

    def __init__(self, backoff: _CappedBackoff, url: str, outage_seconds: float):
        super().__init__(backoff, _UNCOUNTED_RETRIES, (redis.ConnectionError, redis.TimeoutError, OutOfMemoryError))
        self.where = f"Redis at {redact_url(url)}"
        self.outage_seconds = outage_seconds
        self.give_up = _GiveUp()

    def __deepcopy__(self, memo: dict[int, Any]) -> _OutageRetry:
        """redis-py gives each connection a deep copy of the client's retry: the copies share ``give_up``."""
        memo[id(self.give_up)] = self.give_up
        clone = copy.copy(self)
        clone.__dict__ = copy.deepcopy(self.__dict__, memo)
        return clone

    def call_with_retry(
        self,
        do: Callable[[], _T],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> _T:
        def retryable(error: Exception) -> bool:
            now = time.monotonic()
            if _CALL_WINDOW.ends_at is None:  # the command's first failure opens its window
                _CALL_WINDOW.ends_at = now + self.outage_seconds
            give_up_at = min(self.give_up.at, _PROCESS_GIVE_UP.at, _CALL_WINDOW.ends_at)
            if refused_login(error) or now > give_up_at or (self.give_up.server_gone and self.give_up.server_gone()):
                return False
            if isinstance(error, OutOfMemoryError):
                _OUT_OF_MEMORY_LOG.warning("%s; waiting up to %.0f s for memory", out_of_memory_advice(self.where),
                                           give_up_at - now)
            return is_retryable(error) if is_retryable else True

        _CALL_WINDOW.depth += 1
        try:
            return super().call_with_retry(do, fail, retryable, with_failure_count)
        finally:
            _CALL_WINDOW.depth -= 1
            if _CALL_WINDOW.depth == 0:
                _CALL_WINDOW.ends_at = None


def redact_url(url: str | None) -> str | None:
    """``url`` with its password replaced by ``***``, for messages and files."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


REDIS_SCHEMES = ("redis", "rediss", "unix")
FIRST_CONTACT_SECONDS = 5.0
"""How long a run that starts waits for its Redis to answer before it says nothing does."""


def check_redis_url(url: str) -> str:
    """``url`` if it is a Redis URL, else ConfigError saying what one looks like."""
    scheme = urllib.parse.urlsplit(url).scheme if "://" in url else ""
    if scheme not in REDIS_SCHEMES:
        what = f"the scheme {scheme}://" if scheme else "no scheme"
        raise ConfigError(f"Redis URL {redact_url(url)!r} has {what}: use redis://HOST:6379/0 (rediss:// for TLS) or "
                          f"unix:///path/to/redis.sock")
    return url


def first_contact(url: str, seconds: float = FIRST_CONTACT_SECONDS) -> None:
    """Ping ``url`` for up to ``seconds``: a run that starts against a Redis where nothing answers fails now, in one
    line, rather than after its outage window. Refusals (password, ACL, TLS) are left to the caller's checks."""
    probe = redis.Redis.from_url(check_redis_url(url), socket_connect_timeout=min(seconds, 2.0),
                                 socket_timeout=min(seconds, 2.0))
    deadline = time.monotonic() + seconds
    try:
        while True:
            try:
                probe.ping()
                return
            except (redis.ConnectionError, redis.TimeoutError) as error:
                if refused_login(error):
                    return  # it answered, with a refusal the caller's checks name
                if time.monotonic() > deadline:
                    raise RedisUnavailableError(
                        f"nothing answers at Redis {redact_url(url)} ({error}): start redis-server there, or check "
                        f"the host, port or socket path; given no Redis URL (no --redis-url or redis_url=, no "
                        f"REDIS_URL) rqrl starts a private Redis") from error
                time.sleep(0.25)
            except redis.RedisError:
                return  # it answered: whatever it said is the caller's to report
    finally:
        probe.close()


def connect(url: str, outage_seconds: float = DEFAULT_OUTAGE_SECONDS) -> redis.Redis:
    """A client for ``url`` whose commands ride out an outage (or a full Redis) for ``outage_seconds``, and that
    sends large values without copying them (``send_large_values_uncopied``)."""
    check_redis_url(url)
    retry = _OutageRetry(_CappedBackoff(cap=_BACKOFF_CAP_SECONDS, base=0.05), url, outage_seconds)
    client = redis.Redis.from_url(url, retry=retry, socket_connect_timeout=5, health_check_interval=30,
                                  retry_on_error=[redis.ConnectionError, redis.TimeoutError, OutOfMemoryError])
    send_large_values_uncopied(client)
    return client


LARGE_VALUE_BYTES = 6000
"""Values over this many bytes are sent as they are, after their header, rather than copied into one buffer."""


def send_large_values_uncopied(client: redis.Redis) -> None:
    """Give ``client``'s connections, before it makes any, redis-py's own Python command packer, which sends each
    value over LARGE_VALUE_BYTES as a buffer of its own, uncopied. With hiredis installed redis-py packs every
    command into one buffer in C instead, a copy of each value: a learner's SET of a Nature CNN's 6.7 MB weights
    took 6.9 ms of CPU, against 2.5 this way, and a worker's push of a 1 MB entry 0.66 against 0.40
    (``benchmarks/send_cost.py``). Replies are still parsed by hiredis. Values must be bytes, str, int or float,
    as redis-py documents: this packer takes ``len`` of a memoryview as its size in bytes, which holds only for one
    of single bytes (``view.cast("B")``)."""
    packer = PythonRespSerializer(LARGE_VALUE_BYTES, client.get_encoder().encode)
    client.connection_pool.connection_kwargs["command_packer"] = packer


def stop_riding_out(client: redis.Redis, grace_seconds: float) -> None:
    """Let ``client`` retry through an outage for at most ``grace_seconds`` more (a client from ``connect``; others
    are left as they are): a process shutting down gets a short window for its last writes, not the full
    outage window, so a Redis that is gone does not hold up its exit."""
    retry = client.connection_pool.connection_kwargs.get("retry")
    if isinstance(retry, _OutageRetry):
        retry.give_up.at = min(retry.give_up.at, time.monotonic() + grace_seconds)


def give_up_once_gone(client: redis.Redis, server_gone: Callable[[], object]) -> None:
    """Let ``client`` (one from ``connect``) stop retrying at once when ``server_gone()`` is truthy: a server that can
    never answer again (an embedded redis-server that exited) is not waited for through an outage window."""
    retry = client.connection_pool.connection_kwargs.get("retry")
    if isinstance(retry, _OutageRetry):
        retry.give_up.server_gone = server_gone


def stop_riding_out_in_process(grace_seconds: float) -> None:
    """``stop_riding_out`` for every client of ``connect`` in this process, made or to be made: what a process
    asked to stop (SIGTERM, Ctrl-C) does, so no thread of it, busy with Redis or not, holds the exit for an
    outage window."""
    _PROCESS_GIVE_UP.at = min(_PROCESS_GIVE_UP.at, time.monotonic() + grace_seconds)
    _PROCESS_GIVE_UP.stops += 1


@contextlib.contextmanager
def riding_out_briefly_in_process(grace_seconds: float) -> Iterator[None]:
    """Within the block every client of ``connect`` in this process, in any thread, rides out an outage until
    ``grace_seconds`` from its start, not longer: what a learner does while it waits for a call whose result it
    drops (``CallAhead.close``), so a Redis that is gone does not hold the caller for an outage window. After
    it the window is back, for a process that goes on (a notebook), unless the process was asked to stop
    meanwhile."""
    before, stops = _PROCESS_GIVE_UP.at, _PROCESS_GIVE_UP.stops
    _PROCESS_GIVE_UP.at = min(before, time.monotonic() + grace_seconds)
    try:
        yield
    finally:
        if _PROCESS_GIVE_UP.stops == stops:
            _PROCESS_GIVE_UP.at = before


@contextlib.contextmanager
def riding_out_briefly(client: redis.Redis, grace_seconds: float) -> Iterator[None]:
    """Within the block, ``client`` rides out an outage until ``grace_seconds`` from its start, not longer, nor
    shorter where the process was asked to stop before it (its tear-down still gets the grace); afterwards the
    client has its full outage window back, for an object that may start again."""
    retry = client.connection_pool.connection_kwargs.get("retry")
    before, process_before = (retry.give_up.at if isinstance(retry, _OutageRetry) else None), _PROCESS_GIVE_UP.at
    end = time.monotonic() + grace_seconds
    stop_riding_out(client, grace_seconds)
    if process_before < end:
        _PROCESS_GIVE_UP.at = end
    try:
        yield
    finally:
        if isinstance(retry, _OutageRetry) and before is not None:
            retry.give_up.at = before
        if process_before < end:
            _PROCESS_GIVE_UP.at = min(_PROCESS_GIVE_UP.at, process_before)


@contextlib.contextmanager
def redis_errors(url: str | None, outage_seconds: float) -> Iterator[None]:
    """Raise the redis-py errors that reach the caller after the client's retries as rqrl's own:
    RedisUnavailableError for an outage (RedisOutOfMemoryError for a full Redis), RedisRefusedError for a
    refusal; the cause is kept."""
    try:
        yield
    except redis.RedisError as error:
        where = f"Redis at {redact_url(url)}"
        if isinstance(error, OutOfMemoryError):
            raise RedisOutOfMemoryError(f"{out_of_memory_advice(where)}; it stayed full for about {outage_seconds:.0f} "
                                        f"s, rqrl's window for riding out an outage") from error
        if refused_login(error):
            raise RedisRefusedError(
                f"{where} refused the connection ({error}); check the user and password in the URL, and for "
                f"rediss:// the CA that signed the server's certificate"
            ) from error
        if isinstance(error, redis.exceptions.InvalidResponse):
            raise RedisUnavailableError(
                f"{where} answered in something other than Redis's protocol ({error}): another service listens at "
                f"that host and port; check the URL's port (Redis's default is 6379)"
            ) from error
        if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
            raise RedisUnavailableError(
                f"{where} stayed unreachable for about {outage_seconds:.0f} s ({error}); check the server, or raise "
                f"redis_outage_seconds to ride out longer outages"
            ) from error
        raise RedisRefusedError(
            f"{where} refused a command ({type(error).__name__}: {error}); check the URL's user against the ACL "
            f"rules in docs/redis-security.md, and the server's state (a read-only replica?)"
        ) from error
