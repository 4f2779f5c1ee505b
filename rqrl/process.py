"""Child processes that cannot outlive the learner that started them."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import signal
import threading
import time
from collections.abc import Sequence
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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
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
    import sys

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
"""How long the clean-up after SIGTERM may take before the process exits anyway (under compose's 60 s
stop_grace_period for the learner, so the container never needs SIGKILL)."""


def terminate_like_ctrl_c(grace_seconds: float = SHUTDOWN_GRACE_SECONDS) -> None:
    """Make SIGTERM raise Terminated in the main thread, once: a second SIGTERM is ignored, so it cannot cut
    the clean-up short (SIGKILL still can). Should the clean-up hang, a watchdog prints every thread's stack
    and exits 143 after ``grace_seconds``: a stop always ends, and says where it was stuck."""

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Thread(target=_exit_after, args=(grace_seconds,), name="rqrl-shutdown-watchdog",
                         daemon=True).start()
        raise Terminated("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def _exit_after(seconds: float) -> None:
    """The shutdown watchdog: after ``seconds``, the stacks of every thread to stderr, then exit 143."""
    import faulthandler
    import sys

    time.sleep(seconds)
    sys.stderr.write(f"rqrl: the clean-up after SIGTERM did not finish within {seconds:.0f} s; exiting 143 "
                     f"without it (the last checkpoint stands). Where each thread was:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(143)
