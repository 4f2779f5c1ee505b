"""CallAhead: one call on a background thread, its result or error taken later, and nothing left running."""

from __future__ import annotations

import signal
import threading

import pytest

from rqrl.engine.ahead import CallAhead


def test_the_call_runs_on_its_own_thread_while_the_caller_goes_on():
    gate, threads = threading.Event(), []

    def call(value: int) -> int:
        threads.append(threading.current_thread().name)
        gate.wait(10)
        return value * 2

    ahead: CallAhead[int] = CallAhead("test-ahead")
    ahead.start(call, 21)
    assert ahead.in_flight
    gate.set()  # the caller got here while the call waited
    assert ahead.take() == 42
    assert not ahead.in_flight and ahead.take() is None
    assert threads[0].startswith("test-ahead") and threads[0] != threading.current_thread().name
    ahead.close()


def test_a_second_start_before_take_is_refused():
    ahead: CallAhead[int] = CallAhead("test-ahead")
    ahead.start(lambda: 1)
    with pytest.raises(RuntimeError, match="take"):
        ahead.start(lambda: 2)
    assert ahead.take() == 1
    ahead.close()


def test_an_error_is_raised_where_the_result_is_taken_and_only_logged_at_close():
    def fail() -> int:
        raise ValueError("boom")

    ahead: CallAhead[int] = CallAhead("test-ahead")
    ahead.start(fail)
    with pytest.raises(ValueError, match="boom"):
        ahead.take()
    ahead.start(fail)
    ahead.close()  # the error of the call in flight is dropped
    assert not ahead.in_flight


def test_close_ends_the_thread_and_a_later_start_makes_a_new_one():
    ahead: CallAhead[str] = CallAhead("test-ahead-restart")
    ahead.start(lambda: threading.current_thread().name)
    ahead.close()
    assert not any(thread.name.startswith("test-ahead-restart") for thread in threading.enumerate())
    ahead.start(lambda: "again")
    assert ahead.take() == "again"
    ahead.close()


def test_a_wait_cut_short_by_ctrl_c_leaves_the_call_for_the_next_take():
    gate = threading.Event()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    ahead: CallAhead[str] = CallAhead("test-ahead")
    ahead.start(lambda: gate.wait(10) and "done")
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            ahead.take()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ahead.in_flight, "the call still runs: its result is the next take's"
    gate.set()
    assert ahead.take() == "done"
    ahead.close()
