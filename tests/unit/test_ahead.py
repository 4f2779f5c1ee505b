"""CallAhead: one call on a background thread, its result or error taken later, and nothing left running."""

from __future__ import annotations

import functools
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

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


def _interrupt_at(instruction: int, action: Callable[[], object]) -> bool:
    """Run ``action`` with a KeyboardInterrupt raised at its ``instruction``-th Python instruction (counted over every
    frame it calls, the standard library's included), as a Ctrl-C or SIGTERM landing there would; whether it came."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
            if count == instruction:
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        action()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def _hand_off(ahead: CallAhead[int]) -> None:
    ahead.start(lambda: 2)
    ahead.take()


@pytest.mark.timeout(20)
def test_a_ctrl_c_at_any_instruction_of_a_hand_off_leaves_nothing_stuck():
    """A learner hands a call over every batch, so a SIGTERM lands in a hand-off sooner or later: at each instruction
    of a start and take in turn, the interrupt leaves close() within its bound and the next hand-off working.
    ThreadPoolExecutor's hand-off, interrupted inside its idle semaphore's acquire, left that lock held; the thread
    then waited on it forever, and close() with it (`docker compose stop` ran into the learner's watchdog)."""
    instruction = 0
    while True:
        instruction += 1
        ahead: CallAhead[int] = CallAhead("test-ahead-interrupted", close_seconds=1.0)
        ahead.start(lambda: 1)
        assert ahead.take() == 1  # the thread runs: the hand-off below is one of many
        interrupted = _interrupt_at(instruction, functools.partial(_hand_off, ahead))
        started = time.monotonic()
        ahead.close()
        assert time.monotonic() - started < 2.0, f"close() waited past its bound after instruction {instruction}"
        ahead.start(lambda: 3)
        assert ahead.take() == 3, f"the hand-off after an interrupt at instruction {instruction}"
        ahead.close()
        if not interrupted:  # past the hand-off's last instruction: each one was tried
            break
    assert instruction > 20
