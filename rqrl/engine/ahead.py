"""One call run ahead on a thread of its own while the caller does other work, its result taken later.

A learner's loop alternates between fetching a batch and training on it. Fetching the next batch while it
trains hides the fetch where the step leaves the CPU free (a learner waiting on its GPU):
``benchmarks/pop_ahead.py`` measures how much. ``CallAhead`` holds at most one such call; its error, if any, is
raised where the result is taken.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from rqrl.engine.connection import SHUTDOWN_REDIS_GRACE_SECONDS, riding_out_briefly_in_process

log = logging.getLogger(__name__)

T = TypeVar("T")


class CallAhead(Generic[T]):
    """At most one call in flight on a background thread named ``name``; ``take`` waits for it."""

    def __init__(self, name: str):
        self.name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # made on first use, again after close()
        self._future: concurrent.futures.Future[T] | None = None

    @property
    def in_flight(self) -> bool:
        """Whether a call was started and its result not taken yet."""
        return self._future is not None

    def start(self, call: Callable[..., T], *args: object) -> None:
        """Run ``call(*args)`` in the background; the previous call's result must have been taken."""
        if self._future is not None:
            raise RuntimeError("a call is in flight already: take() its result before starting another")
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name)
        self._future = self._pool.submit(call, *args)

    def take(self) -> T | None:
        """The call's result once it is done (None if none was started); its exception, if it raised one. A wait cut
        short (a KeyboardInterrupt) leaves the call in flight, for the next take."""
        future = self._future
        if future is None:
            return None
        try:
            return future.result()
        finally:
            if future.done():
                self._future = None

    def close(self) -> None:
        """Wait for the call in flight (its result is dropped; its error only logged) and end the thread; a later
        ``start`` makes a new one. A result no one takes is not worth an outage window: while it waits, the
        process's Redis clients ride out an outage for a few seconds only (a learner stopping with its Redis gone
        returns in seconds), and get their window back after."""
        try:
            with riding_out_briefly_in_process(SHUTDOWN_REDIS_GRACE_SECONDS):
                self.take()
        except Exception as error:  # the caller is shutting down; its own error, if any, is the one to raise
            log.debug("the call in flight at shutdown failed: %s", error)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
