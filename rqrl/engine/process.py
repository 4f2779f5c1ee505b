"""Child processes that cannot outlive the learner that started them."""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeAlias

from rqrl.errors import ConfigError

ProcessContext: TypeAlias = (
    multiprocessing.context.ForkContext | multiprocessing.context.ForkServerContext
    | multiprocessing.context.SpawnContext
)
"""A multiprocessing context that starts processes (``BaseContext``, what get_context(str) returns, has no Process)."""


def process_context(method: str) -> ProcessContext:
    """``multiprocessing.get_context(method)``, typed by the method; ConfigError for one this platform lacks."""
    if method in multiprocessing.get_all_start_methods():
        if method == "fork":
            return multiprocessing.get_context("fork")
        if method == "forkserver":
            return multiprocessing.get_context("forkserver")
        if method == "spawn":
            return multiprocessing.get_context("spawn")
    raise ConfigError(f"unknown start_method {method!r}; choose one of multiprocessing.get_all_start_methods() = "
                      f"{multiprocessing.get_all_start_methods()}")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs. A zombie does not: a learner that exited but whose parent has not reaped it yet
    (a test waiting on its pipes, which our inherited stderr would hold open forever) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):  # no /proc (macOS): os.kill's answer stands
        return True


def exit_when_orphaned(learner_pid: int, poll_seconds: float = 1.0) -> None:
    """Kill this process once the learner that started it has exited.

    A watchdog thread polls the learner's pid (with forkserver or spawn, our parent is the
    forkserver, which can outlive the learner) and our parent pid. The kernel's PR_SET_PDEATHSIG
    is no substitute: it fires when the parent *thread* that started us exits, which kills workers
    started from a short-lived thread.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            if not _alive(learner_pid) or (parent == learner_pid and os.getppid() != parent):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(poll_seconds)

    threading.Thread(target=watch, name="rqrl-orphan-watchdog", daemon=True).start()


def die_with_parent_thread() -> None:
    """preexec_fn for children that cannot run a watchdog (redis-server): the kernel kills the
    child when the thread that started it exits (Linux only; a no-op elsewhere)."""
    import ctypes

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def stop_processes(processes: Sequence[multiprocessing.process.BaseProcess], timeout: float) -> None:
    """SIGTERM (RQ's warm shutdown), then SIGKILL whatever is still alive after ``timeout``."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the same clean shutdown runs (``docker stop``)."""


SHUTDOWN_GRACE_SECONDS = 45.0
"""How long the clean-up after SIGTERM or Ctrl-C may take before the process exits anyway (under compose's
60 s stop_grace_period for the learner, so the container never needs SIGKILL)."""


def terminate_like_ctrl_c(grace_seconds: float = SHUTDOWN_GRACE_SECONDS) -> None:
    """Make SIGTERM raise Terminated in the main thread, once: a second SIGTERM is ignored, so it cannot cut
    the clean-up short (SIGKILL still can). Ctrl-C raises KeyboardInterrupt as always (a second one cuts the
    clean-up short, as a user pressing it twice means). After either, no Redis client of the process rides out an
    outage for more than a few seconds (``rqrl.engine.teardown``). Should the clean-up after either hang, a watchdog
    prints every thread's stack and exits (143, or 130 after Ctrl-C) ``grace_seconds`` later: a stop always
    ends, and says where it was stuck. SIGUSR1 prints every thread's stack at any time. A SIGINT ignored from
    the start (``nohup``, a background job of a script) stays ignored."""
    # here: `rqrl --help` needs no redis-py
    from rqrl.engine.connection import SHUTDOWN_REDIS_GRACE_SECONDS, stop_riding_out_in_process

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _start_shutdown_watchdog(signal.SIGTERM, grace_seconds)
        stop_riding_out_in_process(SHUTDOWN_REDIS_GRACE_SECONDS)  # a thread inside an outage gives up too
        raise Terminated("SIGTERM")

    def on_sigint(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _start_shutdown_watchdog(signal.SIGINT, grace_seconds)
        stop_riding_out_in_process(SHUTDOWN_REDIS_GRACE_SECONDS)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _start_shutdown_watchdog(signum: signal.Signals, seconds: float) -> None:
    """The shutdown watchdog: a thread that, ``seconds`` after the stop signal, prints the stacks of every
    thread to stderr and exits. Should the clean-up hold the GIL so that thread cannot run, faulthandler's
    own C-level timer dumps the stacks and exits 1 ten seconds later."""
    # a second Ctrl-C taken by this sleeping thread would not wake a main thread blocked in a system call
    start_thread_holding_signals(_exit_after, (signum, seconds), "rqrl-shutdown-watchdog")
    faulthandler.dump_traceback_later(seconds + 10.0, exit=True)


def start_thread_holding_signals(target: Callable[..., None], args: tuple[object, ...], name: str) -> threading.Thread:
    """A daemon thread running ``target(*args)``, made and started with SIGINT and SIGTERM blocked, and blocked in
    it for good (a thread inherits the mask), so the kernel hands those signals to the main thread, where Python
    raises them. None is raised inside ``Thread.start`` either, where one can leave threading's own locks held (no
    thread of the process starts again): a signal that came meanwhile is raised once it returns."""
    can_mask = hasattr(signal, "pthread_sigmask")  # POSIX only
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if can_mask else set()
    try:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
    finally:
        if can_mask:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return thread


def _exit_after(signum: signal.Signals, seconds: float) -> None:
    time.sleep(seconds)
    code = 128 + signum  # the shell's exit code for a process ended by the signal: 130 Ctrl-C, 143 SIGTERM
    sys.stderr.write(f"rqrl: the clean-up after {signum.name} did not finish within {seconds:.0f} s; exiting "
                     f"{code} without it (the last checkpoint stands). Where each thread was:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(code)
