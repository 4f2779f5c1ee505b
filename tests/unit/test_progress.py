"""Progress: plain lines off a terminal, a bar on one, windowed throughput."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from rqrl.engine.progress import Progress, Throughput, pace_seconds


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_throughput_is_over_the_window_not_since_the_start():
    throughput = Throughput(window=10.0)
    throughput.add(0.0, 0)
    throughput.add(100.0, 100_000)  # 1,000 steps/s for a long time
    for second in range(1, 21):
        throughput.add(100.0 + second, 100_000 + 10 * second)  # then 10 steps/s
    assert throughput.rate() == pytest.approx(10.0)


def test_throughput_needs_two_samples():
    throughput = Throughput()
    assert throughput.rate() is None
    throughput.add(1.0, 5)
    assert throughput.rate() is None


def test_plain_lines_every_interval_and_a_last_one_at_close():
    clock, out = FakeClock(), io.StringIO()
    progress = Progress("run", total=10_000, interval=10.0, stream=out, clock=clock)
    for second in range(1, 26):
        clock.now = float(second)
        progress.update(100 * second, mean_return=1.5, lag=0.5, lag_max=2, queue=3, queue_bound=8, workers=4)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # at 1 s, 11 s and 21 s
    assert lines[1] == ("run: 1,100/10,000 steps (11%), 100 steps/s (last 10 s), return 1.5, lag 0.5 (max 2), "
                        "queue 3/8, workers 4, 11 s")
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1].startswith("run: 2,500/10,000 steps")
    assert "\r" not in out.getvalue()


def test_close_writes_nothing_new_when_the_last_update_was_shown():
    clock, out = FakeClock(), io.StringIO()
    with Progress("run", stream=out, clock=clock) as progress:
        clock.now = 1.0
        progress.update(10)
    assert out.getvalue().splitlines() == ["run: 10 steps, 10 steps/s (last 10 s), 1 s"]


def test_disabled_progress_writes_nothing_but_still_measures():
    clock, out = FakeClock(), io.StringIO()
    with Progress("run", enabled=False, stream=out, clock=clock) as progress:
        clock.now = 2.0
        progress.update(100)
    assert out.getvalue() == ""
    assert progress.throughput.rate() == pytest.approx(50.0)


def test_a_terminal_gets_a_bar_and_log_records_do_not_break_into_it(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        clock = FakeClock()
        progress = Progress("bar", total=1000, stream=terminal, clock=clock)
        assert progress.is_bar
        clock.now = 1.0
        progress.update(500, mean_return=3.0, queue=1)
        logging.getLogger("rqrl.test").warning("a warning while the bar shows")
        progress.close()
        assert root.handlers[-1] is handler, "logging is restored at close"
    finally:
        root.removeHandler(handler)
    written = terminal.getvalue()
    assert "return 3.0" in written and "queue 1" in written
    # tqdm.write clears the bar, prints the record on a line of its own, and redraws the bar
    assert "\na warning while the bar shows\n" in written.replace("\r", "\n")
    assert not any(line.startswith("bar") and "a warning" in line for line in written.replace("\r", "\n").split("\n"))


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match="interval > 0"):
        Progress("run", interval=0)


def test_pace_sleeps_most_of_the_expected_delivery_time_counted_from_the_emptying():
    # 2,048 steps at 100,000 steps/s take 20.48 ms; 0.8 (PACE_SHARE) of that from the emptying at t=10.000
    assert pace_seconds(10.0, 10.0, 2048, 100_000.0) == pytest.approx(0.016384)
    assert pace_seconds(10.0, 10.010, 2048, 100_000.0) == pytest.approx(0.006384)  # 10 ms of it have passed
    assert pace_seconds(10.0, 10.5, 2048, 100_000.0) == 0.0  # a learner back from a long training step
    assert pace_seconds(10.0, 10.0, 2048, 1_000.0) == 0.05  # slow workers: capped
    assert pace_seconds(10.0, 10.0, 2048, 1_000.0, cap=0.01) == 0.01


@pytest.mark.parametrize("emptied_at, steps, rate", [(None, 2048, 1e5), (10.0, 0, 1e5), (10.0, 2048, None),
                                                     (10.0, 2048, 0.0)])
def test_pace_is_zero_when_the_queue_was_not_emptied_nothing_is_needed_or_the_rate_is_unknown(emptied_at, steps,
                                                                                              rate):
    assert pace_seconds(emptied_at, 10.0, steps, rate) == 0.0


def test_the_runs_redis_is_announced_even_without_progress_and_without_its_password():
    stream = io.StringIO()
    progress = Progress("IMPALA", enabled=False, stream=stream)
    progress.announce_redis("r1", "redis://:hunter2@host:6379/0")
    progress.announce_redis("r1", None)  # an injected connection: nothing to say
    assert stream.getvalue() == "run r1 on Redis redis://:***@host:6379/0: rqrl status --redis-url " \
                                "redis://:***@host:6379/0 --run r1\n"
