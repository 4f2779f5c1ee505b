"""One call run ahead on a thread of its own while the caller does other work, its result taken later.

A learner's loop alternates between fetching a batch and training on it. Fetching the next batch while it
trains hides the fetch where the step leaves the CPU free (a learner waiting on its GPU):
``benchmarks/pop_ahead.py`` measures how much. ``CallAhead`` holds at most one such call; its error, if any, is
raised where the result is taken.

The caller and the thread hand calls and results over through ``queue.SimpleQueue``, written in C, and a dict,
never through Python-level locks: the learner hands a call over every batch, and a SIGTERM or Ctrl-C raised in
its thread in the middle of a Python-level hand-off can leave a lock held that the other thread then waits on
forever. ThreadPoolExecutor's did (its idle semaphore): the learner's stop hung until its watchdog ended it,
without stopping its run, 1 stop in 15 of a ``docker compose stop`` loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from rqrl.engine.connection import SHUTDOWN_REDIS_GRACE_SECONDS, riding_out_briefly_in_process
from rqrl.engine.process import start_thread_holding_signals

log = logging.getLogger(__name__)

T = TypeVar("T")
CLOSE_SECONDS = 10.0
"""How long ``close`` waits for the call in flight by default (a pop ahead takes well under a second)."""
_Outcome = tuple[bool, Any]
"""(True, the call's result) or (False, the exception it raised)."""


class CallAhead(Generic[T]):
    """At most one call in flight on a daemon thread named ``name``; ``take`` waits for it, ``close`` for at most
    ``close_seconds``."""

    def __init__(self, name: str, close_seconds: float = CLOSE_SECONDS):
        self.name, self.close_seconds = name, close_seconds
        self._calls: queue.SimpleQueue[tuple[int, Callable[..., T], tuple[object, ...]] | None] | None = None
        self._thread: threading.Thread | None = None
        self._done: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._outcomes: dict[int, _Outcome] = {}
        self._tickets = 0
        self._in_flight: int | None = None  # the ticket of the call whose result is still to be taken

    @property
    def in_flight(self) -> bool:
        """Whether a call was started and its result not taken yet."""
        return self._in_flight is not None

    def start(self, call: Callable[..., T], *args: object) -> None:
        """Run ``call(*args)`` in the background; the previous call's result must have been taken."""
        if self._in_flight is not None:
            raise RuntimeError("a call is in flight already: take() its result before starting another")
        if self._calls is None:
            calls: queue.SimpleQueue[tuple[int, Callable[..., T], tuple[object, ...]] | None] = queue.SimpleQueue()
            thread = start_thread_holding_signals(_serve, (calls, self._outcomes, self._done), self.name)
            self._calls, self._thread = calls, thread  # only once it runs: a start cut short leaves no queue unread
        self._tickets += 1
        self._calls.put((self._tickets, call, args))
        # a Ctrl-C right here leaves the call running unclaimed: the next start's ticket is another one, and the
        # outcome of this one is dropped at the next take
        self._in_flight = self._tickets

    def take(self) -> T | None:
        """The call's result once it is done (None if none was started); its exception, if it raised one. A wait cut
        short (a KeyboardInterrupt) leaves the call in flight, for the next take."""
        ticket = self._in_flight
        if ticket is None:
            return None
        self._wait(ticket, None)
        return self._claim(ticket)

    def close(self) -> None:
        """Wait up to ``close_seconds`` for the call in flight (its result is dropped; its error only logged) and for
        the thread to end (a call still running is left to it, with a warning); a later ``start`` makes a new one.
        A result no one takes is not worth an outage window either: while it waits, the process's Redis clients
        ride out an outage for a few seconds only, and get their window back after."""
        deadline = time.monotonic() + self.close_seconds
        ticket, calls, thread = self._in_flight, self._calls, self._thread
        self._calls, self._thread = None, None  # first: a close cut short leaves no queue whose thread is ending
        with riding_out_briefly_in_process(SHUTDOWN_REDIS_GRACE_SECONDS):
            if ticket is not None and self._wait(ticket, self.close_seconds):
                try:
                    self._claim(ticket)
                except Exception as error:  # the caller is shutting down; its own error, if any, is the one to raise
                    log.debug("the call in flight at shutdown failed: %s", error)
            if calls is not None:
                calls.put(None)  # the thread ends once its call in hand, if any (one a Ctrl-C left unclaimed), returns
            if thread is not None and thread.is_alive():  # not alive: never started (a start cut short)
                thread.join(max(0.0, deadline - time.monotonic()))
        if thread is not None and thread.is_alive():
            log.warning("%s: the call in flight did not end within %.0f s; leaving it to its thread", self.name,
                        self.close_seconds)
        self._in_flight = None
        self._done, self._outcomes = queue.SimpleQueue(), {}  # a thread left running keeps the old ones

    def _wait(self, ticket: int, timeout: float | None) -> bool:
        """Whether call ``ticket`` ended within ``timeout`` seconds (None: however long it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while ticket not in self._outcomes:  # a doorbell read before a Ctrl-C is not needed again: the dict says
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                self._done.get(timeout=remaining)
            except queue.Empty:
                pass
        return True

    def _claim(self, ticket: int) -> T:
        """Call ``ticket``'s result, or its exception raised; the call is no longer in flight."""
        succeeded, value = self._outcomes[ticket]
        self._in_flight = None
        self._outcomes.clear()  # with any a Ctrl-C left unclaimed: older tickets, the only others there can be
        _drain(self._done)  # the doorbells of calls that were done before their take (the usual case)
        if not succeeded:
            raise value
        result: T = value
        return result


def _drain(doorbells: queue.SimpleQueue[int]) -> None:
    """Empty ``doorbells`` (each rings after its outcome is filed: the dict, not the bell, says what is done)."""
    while True:
        try:
            doorbells.get_nowait()
        except queue.Empty:
            return


def _serve(calls: queue.SimpleQueue[tuple[int, Callable[..., Any], tuple[object, ...]] | None],
           outcomes: dict[int, _Outcome], done: queue.SimpleQueue[int]) -> None:
    """The thread: run each call handed over, file its outcome under its ticket and ring; end at None."""
    while (request := calls.get()) is not None:
        ticket, call, args = request
        try:
            outcome: _Outcome = (True, call(*args))
        except BaseException as error:  # raised where the result is taken
            outcome = (False, error)
        outcomes[ticket] = outcome
        done.put(ticket)
        del request, call, args, outcome  # no reference kept to the last call's arguments or result
