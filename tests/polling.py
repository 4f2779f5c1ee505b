"""Waiting for a condition by polling it, instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05,
               message: str | Callable[[], str] = "the condition") -> T:
    """Call ``predicate`` every ``interval`` s until it returns something truthy, and return that; after
    ``timeout`` s raise an AssertionError naming what was awaited (``message``, or a callable that says
    it, e.g. with the last state seen)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
