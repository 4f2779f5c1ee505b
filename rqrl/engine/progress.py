"""Progress a person can read live and from a log: a tqdm bar on a terminal; elsewhere (a file, a pipe, a
container log) one plain line every ``interval`` seconds. Both show windowed steps/s, the mean return,
policy lag, queue depth and workers alive. Learners, ``rqrl demo`` and samplers share it.

>>> import io
>>> out = io.StringIO()  # not a terminal: plain lines
>>> with Progress("demo", total=1000, interval=10.0, stream=out, clock=iter([0.0, 1.0]).__next__) as progress:
...     progress.update(500, mean_return=20.0, lag=1.0, queue=2, workers=4)
>>> out.getvalue().splitlines()[0]
'demo: 500/1,000 steps (50%), 500 steps/s (last 10 s), return 20.0, lag 1.0, queue 2, workers 4, 1 s'
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TextIO

__all__ = ["Progress", "Throughput"]

BAR_REFRESH_SECONDS = 0.5


class Throughput:
    """Steps per second over the last ``window`` seconds (not an average since the start)."""

    def __init__(self, window: float = 10.0):
        if not window > 0:
            raise ValueError(f"expected window > 0, got {window}")
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, steps: int) -> None:
        """Record the cumulative step count ``steps`` at time ``now``."""
        self._samples.append((now, steps))
        # keep one sample at or before the window's start, so the rate spans the whole window
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Steps per second between the oldest kept sample and the newest; None before two samples."""
        if len(self._samples) < 2:
            return None
        (start, first), (end, last) = self._samples[0], self._samples[-1]
        return (last - first) / (end - start) if end > start else None


class StepRates:
    """A learner's env steps per second over 10 s and 60 s, under the names its heartbeat publishes them by for
    ``rqrl status`` (every family's learner: the same names, the same windows)."""

    WINDOWS = {"steps_per_second_10s": 10.0, "steps_per_second_60s": 60.0}

    def __init__(self) -> None:
        self.windows = {name: Throughput(seconds) for name, seconds in self.WINDOWS.items()}

    def add(self, now: float, steps: int) -> None:
        """Record the cumulative step count ``steps`` at time ``now`` in every window."""
        for throughput in self.windows.values():
            throughput.add(now, steps)

    def recent(self) -> float | None:
        """Steps per second over the shortest window; None before two samples."""
        return self.windows["steps_per_second_10s"].rate()

    def facts(self) -> dict[str, float]:
        """The rates known so far (none before two samples: no made-up 0 for ``rqrl status`` to show)."""
        return {name: rate for name, throughput in self.windows.items() if (rate := throughput.rate()) is not None}


PACE_SHARE = 0.8
"""A consumer waiting for steps sleeps this share of their expected delivery time: early enough that a steady
stream is not kept waiting."""
MAX_PACE_SECONDS = 0.05


def pace_seconds(emptied_at: float | None, now: float, steps_needed: int, steps_per_second: float | None,
                 cap: float = MAX_PACE_SECONDS) -> float:
    """How long a consumer that emptied its queue at ``emptied_at`` sleeps before it pops again for
    ``steps_needed`` more steps arriving at ``steps_per_second``: PACE_SHARE of their expected delivery time
    counted from the emptying, at most ``cap``; 0 if any of it is unknown or that time has passed."""
    if emptied_at is None or not steps_per_second or steps_per_second <= 0 or steps_needed <= 0:
        return 0.0
    return max(0.0, min(emptied_at + PACE_SHARE * steps_needed / steps_per_second - now, cap))


class Progress:
    """One run's progress on ``stream`` (default stderr): a live bar if it is a terminal, else a plain line
    every ``interval`` seconds and one at the end; nothing if not ``enabled``. While the bar shows, console
    log records go through ``tqdm.write`` so they never break into it."""

    def __init__(self, description: str, *, total: int | None = None, initial: int = 0, enabled: bool = True,
                 interval: float = 10.0, window: float = 10.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if not interval > 0:
            raise ValueError(f"expected interval > 0, got {interval}")
        self.description, self.total, self.enabled, self.interval = description, total, enabled, interval
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.throughput = Throughput(window)
        self.started = clock()
        self.throughput.add(self.started, initial)
        self._bar: Any = None
        self._redirect: contextlib.ExitStack | None = None
        self._last_shown = -float("inf")
        self._pending: str | None = None  # the newest line not yet written (non-terminal mode)
        if enabled and _is_terminal(self.stream):
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", unit_scale=True, desc=description,
                             dynamic_ncols=True, file=self.stream)
            self._redirect = contextlib.ExitStack()
            self._redirect.enter_context(logging_redirect_tqdm())

    @property
    def is_bar(self) -> bool:
        """Whether progress shows as a live bar (a terminal) rather than plain lines."""
        return self._bar is not None

    def update(self, env_steps: int, *, mean_return: float | None = None, lag: float | None = None,
               lag_max: float | None = None, queue: int | None = None, queue_bound: int | None = None,
               workers: int | None = None) -> None:
        """Record the cumulative ``env_steps`` and the newest figures; redraw or print when due."""
        now = self.clock()
        self.throughput.add(now, env_steps)
        if not self.enabled:
            return
        figures = self._figures(mean_return, lag, lag_max, queue, queue_bound, workers)
        if self._bar is not None:
            if now - self._last_shown < BAR_REFRESH_SECONDS:
                return
            self._last_shown = now
            self._bar.n = min(env_steps, self.total) if self.total is not None else env_steps
            self._bar.set_postfix_str(", ".join(figures), refresh=False)
            self._bar.refresh()
            return
        self._pending = self.line(env_steps, figures, now)
        if now - self._last_shown >= self.interval:
            self._last_shown = now
            self._write_pending()

    def note(self, text: str) -> None:
        """A line for the person watching (above the bar on a terminal), shown even without progress."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def announce_redis(self, run_name: str, redis_url: str | None) -> None:
        """Say where the run's Redis is, so `rqrl status` and `rqrl stop` can reach it from another shell."""
        from rqrl.engine.connection import redact_url

        if redis_url:
            self.note(f"run {run_name} on Redis {redact_url(redis_url)}: rqrl status --redis-url "
                      f"{redact_url(redis_url)} --run {run_name}")

    def line(self, env_steps: int, figures: list[str], now: float) -> str:
        """One plain progress line."""
        if self.total:
            steps = f"{env_steps:,}/{self.total:,} steps ({100 * env_steps / self.total:.0f}%)"
        else:
            steps = f"{env_steps:,} steps"
        rate = self.throughput.rate()
        speed = f"{rate:,.0f} steps/s (last {self.throughput.window:g} s)" if rate is not None else "- steps/s"
        return ", ".join([f"{self.description}: {steps}", speed, *figures, f"{now - self.started:.0f} s"])

    @staticmethod
    def _figures(mean_return: float | None, lag: float | None, lag_max: float | None, queue: int | None,
                 queue_bound: int | None, workers: int | None) -> list[str]:
        figures = []
        if mean_return is not None:
            figures.append(f"return {mean_return:.1f}")
        if lag is not None:
            figures.append(f"lag {lag:.1f}" + (f" (max {lag_max:.0f})" if lag_max is not None else ""))
        if queue is not None:
            figures.append(f"queue {queue}" + (f"/{queue_bound}" if queue_bound is not None else ""))
        if workers is not None:
            figures.append(f"workers {workers}")
        return figures

    def _write_pending(self) -> None:
        if self._pending is not None:
            self.stream.write(self._pending + "\n")
            self.stream.flush()
            self._pending = None

    def close(self) -> None:
        """Close the bar (restoring logging), or write the last line not yet shown."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.close()
            self._redirect = None
        self._write_pending()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal a bar can be drawn on (one that reports 0 columns, as a pty nobody sized
    does, gets plain lines: tqdm would draw an empty bar)."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's fake terminal): trust isatty
        return True

