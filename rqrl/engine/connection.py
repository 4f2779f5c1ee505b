"""Redis clients that ride out a Redis restart: redis-py's own retry with exponential backoff.

Commands that fail with a connection or timeout error are retried for about ``outage_seconds``;
only then does the error reach the caller. A retried command may run twice, which rqrl's writes
tolerate: pushes are idempotent per rollout id, weights are write-once per version.
"""

from __future__ import annotations

import contextlib
import math
import ssl
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from rqrl.errors import RedisRefusedError, RedisUnavailableError

_T = TypeVar("_T")

DEFAULT_OUTAGE_SECONDS = 60.0
_BACKOFF_CAP_SECONDS = 1.0


def refused_login(error: BaseException) -> bool:
    """A refused login or an untrusted certificate, which redis-py reports as connection errors."""
    return isinstance(error, (redis.AuthenticationError, redis.exceptions.AuthorizationError)) or isinstance(
        error.__context__, ssl.SSLCertVerificationError)


class _OutageRetry(Retry):
    """Retry through outages, but not through a refused login or an untrusted certificate, which
    redis-py also reports as connection errors and which no amount of waiting will fix."""

    def call_with_retry(
        self,
        do: Callable[[], _T],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> _T:
        def retryable(error: Exception) -> bool:
            if refused_login(error):
                return False
            return is_retryable(error) if is_retryable else True

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def redact_url(url: str | None) -> str | None:
    """``url`` with its password replaced by ``***``, for messages and files."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, outage_seconds: float = DEFAULT_OUTAGE_SECONDS) -> redis.Redis:
    """A client for ``url`` that retries through outages of up to about ``outage_seconds``."""
    retries = max(1, math.ceil(outage_seconds / _BACKOFF_CAP_SECONDS))
    retry = _OutageRetry(ExponentialWithJitterBackoff(cap=_BACKOFF_CAP_SECONDS, base=0.05), retries)
    return redis.Redis.from_url(url, retry=retry, retry_on_error=[redis.ConnectionError, redis.TimeoutError],
                                socket_connect_timeout=5, health_check_interval=30)


@contextlib.contextmanager
def redis_errors(url: str | None, outage_seconds: float) -> Iterator[None]:
    """Raise the redis-py errors that reach the caller after the client's retries as rqrl's own:
    RedisUnavailableError for an outage, RedisRefusedError for a refusal; the cause is kept."""
    try:
        yield
    except redis.RedisError as error:
        where = f"Redis at {redact_url(url)}"
        if refused_login(error):
            raise RedisRefusedError(
                f"{where} refused the connection ({error}); check the user and password in the URL, and for "
                f"rediss:// the CA that signed the server's certificate"
            ) from error
        if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
            raise RedisUnavailableError(
                f"{where} stayed unreachable for about {outage_seconds:.0f} s ({error}); check the server, or raise "
                f"redis_outage_seconds to ride out longer outages"
            ) from error
        raise RedisRefusedError(
            f"{where} refused a command ({type(error).__name__}: {error}); check the URL's user against the ACL "
            f"rules in docs/redis-security.md, and the server's state (memory limit, read-only replica)"
        ) from error
