"""Warnings about what a Redis writer can repeat at will (junk entries, malformed values), logged at a bounded
rate: at most one line per interval, saying how many were held back since the last one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

LOG_INTERVAL_SECONDS = 10.0


class BoundedLog:
    """One recurring warning of ``logger``, at most once every ``interval`` seconds.

    >>> import logging
    >>> bounded = BoundedLog(logging.getLogger("demo"), interval=60, clock=lambda: 0.0)
    >>> bounded.warning("junk %d", 1), bounded.warning("junk %d", 2), bounded.held_back
    (True, False, 1)
    """

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.interval, self.clock = logger, interval, clock
        self._last = -float("inf")
        self.held_back = 0
        """Warnings not logged since the last line."""
        self.count = 0
        """Warnings in all, logged or not."""

    def warning(self, message: str, *args: object) -> bool:
        """Log ``message % args`` unless one was logged within the interval; whether it was logged."""
        self.count += 1
        now = self.clock()
        if now - self._last < self.interval:
            self.held_back += 1
            return False
        more = f" ({self.held_back} more since the last message)" if self.held_back else ""
        self._last, self.held_back = now, 0
        self.logger.warning(message + "%s", *args, more)
        return True
