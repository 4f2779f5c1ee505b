"""What a learner runs on its own machine: an embedded Redis (when it names none) and worker
processes, stopped by stop(), and by a last-resort finalizer if the learner forgets to."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.process
import os
import signal
import uuid
import weakref

import redis

from rqrl.engine.process import ProcessContext, process_context, stop_processes
from rqrl.engine.server import EmbeddedRedis, redis_errors_naming
from rqrl.engine.worker import run_worker
from rqrl.errors import NoWorkersError


def multiprocessing_context(start_method: str | None) -> ProcessContext:
    """Maze's choice: the given method (ConfigError if this platform has no such method); None: forkserver where
    available, else spawn."""
    if start_method is None:
        start_method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    method = start_method
    context = process_context(method)
    if method == "forkserver":
        start_forkserver()
    return context


def start_forkserver() -> None:
    """Start the forkserver (once per process), preloading the worker's modules, with SIGINT blocked: a Ctrl-C
    while it starts stays pending here, raised once it has started, and is dropped there (forkserver_preload)."""
    multiprocessing.forkserver.set_forkserver_preload(["rqrl.engine.forkserver_preload"])
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def local_worker_prefix(label: str) -> str:
    """How the names of the local workers a learner starts under ``label`` (its run name) begin."""
    return f"rqrl.{label}.local"


class LocalWorkers:
    """An optional embedded Redis and the worker processes a learner started; they cannot outlive it."""

    def __init__(self, start_method: str | None = None, redis_server: str | None = None):
        self.start_method = start_method
        self.redis_server = redis_server
        self.server: EmbeddedRedis | None = None
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._servers: list[EmbeddedRedis] = []  # what the finalizer stops: it must not hold self
        self._finalizer = weakref.finalize(self, _emergency_cleanup, self.processes, self._servers)

    def start_redis(self) -> str:
        """Start the embedded Redis; returns its URL."""
        self.server = EmbeddedRedis(self.redis_server).start()
        self._servers.append(self.server)
        return self.server.url

    def start_workers(self, count: int, redis_url: str, queue_name: str, label: str, secret: str | bytes) -> None:
        """Start ``count`` worker processes on ``queue_name``; they die with this process."""
        context = multiprocessing_context(self.start_method)
        for index in range(count):
            process = context.Process(
                target=run_worker,
                kwargs={"redis_url": redis_url, "queue_names": [queue_name],
                        "name": f"{local_worker_prefix(label)}{index}.{uuid.uuid4().hex[:4]}",
                        "parent_pid": os.getpid(), "secret": secret},
                name=f"rqrl-worker-{index}",
                daemon=False,
            )
            process.start()
            self.processes.append(process)

    def raise_if_all_died(self) -> None:
        """NoWorkersError if every local worker exited, with their exit codes."""
        if self.processes and all(not process.is_alive() for process in self.processes):
            codes = sorted({process.exitcode for process in self.processes}, key=str)
            raise NoWorkersError(f"all {len(self.processes)} local worker processes exited (exit codes {codes}); "
                                 f"{_why_workers_exited(codes)}")

    def stop_workers(self, timeout: float) -> None:
        """SIGTERM the workers (RQ's warm shutdown), SIGKILL what is left after ``timeout``."""
        stop_processes(self.processes, timeout)
        self.processes.clear()

    def give_up_once_redis_exited(self, connection: redis.Redis) -> None:
        """Let ``connection`` stop riding out an outage once the embedded Redis (if any) has exited."""
        if self.server is not None:
            self.server.give_up_once_exited(connection)

    def redis_errors(self, url: str | None, outage_seconds: float) -> contextlib.AbstractContextManager[None]:
        """``rqrl.engine.connection.redis_errors``, naming the embedded Redis when it is what went away."""
        return redis_errors_naming(self.server, url, outage_seconds)

    def stop_redis(self) -> None:
        if self.server is not None:
            self.server.stop()
            self._servers.remove(self.server)
            self.server = None


def _emergency_cleanup(processes: list[multiprocessing.process.BaseProcess], servers: list[EmbeddedRedis]) -> None:
    """Last resort when a run is garbage-collected or the interpreter exits without stop()."""
    stop_processes(processes, 5.0)
    for server in servers:
        server.stop()


def _why_workers_exited(codes: list[int | None]) -> str:
    """Where to look for why local workers with these exit codes ended."""
    signals = [-code for code in codes if code is not None and code < 0]
    if signals and len(signals) == len(codes):
        names = ", ".join(_signal_name(number) for number in signals)
        return (f"they were killed by {names}: by someone, or by the kernel's out-of-memory killer (`dmesg` says); "
                f"start the learner again, with fewer envs per worker if memory ran out")
    return ("their stderr says why (with start_method 'spawn' or 'forkserver', guard your script's entry point "
            "with 'if __name__ == \"__main__\":')")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
