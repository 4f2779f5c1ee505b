"""CallAhead: one call on a background thread, its result or error taken later, and nothing left running."""

from __future__ import annotations

import functools
import logging
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
    frame it calls, the standard library's included), as a Ctrl-C or SIGTERM landing there would; whether it had
    that many. Not while CallAhead makes and starts its thread, where it holds the signals back, nor in a ``__del__``
    or weakref callback the garbage collector runs meanwhile (CPython drops what those raise)."""
    count = 0
    held = {threading.Thread.__init__.__code__, threading.Thread.start.__code__}

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        nonlocal count
        caller: FrameType | None = frame
        while caller is not None:
            code = caller.f_code
            if code in held or code.co_name == "__del__" or code.co_filename.endswith("_weakrefset.py"):
                return None  # signals are masked there (process.start_thread_holding_signals), or would be dropped
            caller = caller.f_back
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
        pass
    finally:
        sys.settrace(None)
    return count >= instruction


def _hand_off(ahead: CallAhead[int], value: int) -> None:
    ahead.start(lambda: value)
    ahead.take()


def _goes_on(ahead: CallAhead[int], instruction: int, interrupted: str) -> None:
    """After an interrupt at ``instruction`` of ``interrupted``: the call in flight, if any (its value is 2), is
    taken, another one is started and taken, and close() keeps to its bound."""
    where = f"after an interrupt at instruction {instruction} of {interrupted}"
    if ahead.in_flight:
        assert ahead.take() == 2, f"the call in flight {where}"
    ahead.start(lambda: 3)
    assert ahead.take() == 3, f"the hand-off {where}"
    started = time.monotonic()
    ahead.close()
    assert time.monotonic() - started < 2.0, f"close() waited past its bound {where}"


def _sweep(attempt: Callable[[int], bool]) -> int:
    """``attempt(instruction)`` for instruction 1, 2, ... until one runs to its end uninterrupted; how many ran."""
    instruction = 0
    while attempt(instruction := instruction + 1):
        pass
    return instruction


@pytest.mark.timeout(30)
def test_a_ctrl_c_at_any_instruction_of_a_hand_off_leaves_nothing_stuck():
    """A learner hands a call over every batch, so a SIGTERM lands in a hand-off sooner or later: at each instruction
    of a start and take in turn (the first, which starts the thread, and a later one), the interrupt leaves a caller
    that goes on (a notebook after Ctrl-C) with working hand-offs, and close() within its bound.
    ThreadPoolExecutor's hand-off, interrupted inside its idle semaphore's acquire, left that lock held; the thread
    then waited on it forever, and close() with it (`docker compose stop` ran into the learner's watchdog)."""

    def attempt(instruction: int, warm: bool) -> bool:
        ahead: CallAhead[int] = CallAhead("test-ahead-interrupted", close_seconds=1.0)
        if warm:
            _hand_off(ahead, 1)
        interrupted = _interrupt_at(instruction, functools.partial(_hand_off, ahead, 2))
        _goes_on(ahead, instruction, "a hand-off")
        return interrupted

    assert _sweep(functools.partial(attempt, warm=False)) > 20
    assert _sweep(functools.partial(attempt, warm=True)) > 20


@pytest.mark.timeout(30)
def test_a_ctrl_c_at_any_instruction_of_close_leaves_the_next_hand_off_working(caplog):
    """A second Ctrl-C during close (a call in flight, done or not): what is left lets a caller that goes on take
    the call's result, and start and take another."""
    caplog.set_level(logging.ERROR, logger="rqrl.engine.ahead")  # the warning of a call left running: not swept

    def attempt(instruction: int, gate_open: bool) -> bool:
        gate = threading.Event()
        if gate_open:
            gate.set()
        ahead: CallAhead[int] = CallAhead("test-ahead-close", close_seconds=0.002)
        ahead.start(lambda: gate.wait(5) and 2)
        interrupted = _interrupt_at(instruction, ahead.close)
        gate.set()
        _goes_on(ahead, instruction, "close")
        return interrupted

    assert _sweep(functools.partial(attempt, gate_open=True)) > 20
    assert _sweep(functools.partial(attempt, gate_open=False)) > 20


def test_results_taken_when_ready_leave_nothing_behind():
    """The usual pop-ahead: the call is done before its take, whose wait then reads no doorbell. Each take clears
    them, so a run of a million batches does not keep a million of them."""
    ahead: CallAhead[int] = CallAhead("test-ahead-ready")
    for value in range(50):
        ahead.start(lambda value=value: value)
        while not ahead._outcomes:  # done before the take
            time.sleep(0.001)
        assert ahead.take() == value
    assert ahead._done.empty() and not ahead._outcomes
    ahead.close()
