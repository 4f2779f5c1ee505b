"""SEED actors and inference servers as RQ jobs on ``rqrl worker`` processes, on any machine.

With ``Config.queue_name`` set, the trainer enqueues one job per actor and per server instead of
starting local processes. Job arguments are plain JSON (run name, index, token); what the job
runs (settings, signed environment and model factories) it reads from Redis with the worker's
RQRL_SECRET. A job runs until the run stops.

Liveness and fencing are the engine's group leases (rqrl.engine.leases), as for the other families: each actor
and server is a group (actors 0..actor_processes-1, then the servers), its lease is handed to the job when it is
enqueued (rqrl.engine.enqueue.enqueue_leased), and a running job holds it under its own holder, refreshed by
GroupLease's thread, so it lapses within ProtocolTimings.seed_alive once the job dies. The job's own loop sends
RQ's heartbeats. A job stops on its own once its lease names another job (the trainer gave its place to a newer
one) or the run stops.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import get_current_job
from rq.job import Job

from rqrl.engine.enqueue import SEED_ACTOR_JOB_FUNCTION, SEED_SERVER_JOB_FUNCTION, enqueue_leased
from rqrl.engine.jobs import back_off, beat_worker, fit_again, load_signed, read_config, sideline
from rqrl.engine.keys import PREFIX, RunKeys
from rqrl.engine.leases import GroupLease, lease_holder
from rqrl.engine.rq_safety import failed_registry, rollout_queue
from rqrl.engine.supervisor import Supervisor
from rqrl.engine.timings import protocol_timings
from rqrl.errors import RunStoppedError, WorkerUnfitError
from rqrl.seed.actor import Actor
from rqrl.seed.inference import InferenceServer
from rqrl.seed.store import SeedRun

log = logging.getLogger(__name__)

ACTOR_JOB = SEED_ACTOR_JOB_FUNCTION
SERVER_JOB = SEED_SERVER_JOB_FUNCTION


def job_id(keys: RunKeys, name: str, token: str) -> str:
    """RQ job id of one actor or server (``name``: actor-0, server-1, ...) of a run."""
    return f"{PREFIX}_{keys.run_name}_seed_{name}_{token}"


def group_of(name: str, actor_processes: int) -> int:
    """The lease group of ``name``: actor i is group i, server j group actor_processes + j."""
    kind, index = name.split("-")
    return int(index) if kind == "actor" else actor_processes + int(index)


def enqueue(connection: redis.Redis, queue_name: str, keys: RunKeys, name: str, token: str,
            actor_processes: int) -> str:
    """Hand ``name``'s lease to a new job and enqueue it (an older job of ``name`` loses the lease and stops);
    returns the job id."""
    kind, index = name.split("-")
    return enqueue_leased(connection, keys, queue_name, ACTOR_JOB if kind == "actor" else SERVER_JOB,
                          (keys.run_name, int(index), token), group_of(name, actor_processes),
                          job_id(keys, name, token), protocol_timings().seed_alive,
                          f"rqrl {keys.run_name} SEED {name}")


def running(connection: redis.Redis, keys: RunKeys, groups: dict[str, int], job_ids: dict[str, str]) -> dict[str, bool]:
    """Which of the named groups a started job of ``job_ids`` holds (a handed-over lease names the job id alone;
    a running job's holder is ``job id#token``)."""
    names = list(groups)
    holders = connection.mget([keys.lease(groups[name]) for name in names]) if names else []
    return {name: isinstance(holder, bytes) and holder.decode(errors="replace").startswith(job_ids[name] + "#")
            for name, holder in zip(names, holders, strict=True)}


@contextlib.contextmanager
def _liveness(run: SeedRun, name: str, token: str, on_fenced: Callable[[], None]) -> Iterator[None]:
    """Hold ``name``'s group lease while the body runs; call ``on_fenced`` once another job holds it or the run
    stops."""
    job = get_current_job()
    assert job is not None, "checked by _joined"
    timings = protocol_timings()
    lease = GroupLease(run.connection, run.keys, group_of(name, run.settings()["actor_processes"]),
                       lease_holder(job.id, token), timings.seed_alive, hang_seconds=math.inf)
    lease.acquire()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(timings.seed_beat):
            if lease.lost or run.stopped():
                on_fenced()
                return

    thread = threading.Thread(target=watch, name=f"rqrl-seed-{name}-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        lease.release()


def _rate_limited(function: Callable[[], None], seconds: float) -> Callable[[], None]:
    last = [-float("inf")]

    def call() -> None:
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            function()

    return call


def _joined(run_name: str, name: str, factory: str) -> tuple[SeedRun, Any] | None:
    """The run this job joins and its signed ``factory`` (``model`` or ``environment``), verified and unpickled;
    None if the run stopped or was cleaned up before the job started (a job dequeued while the trainer stopped):
    such a job ends at once and successfully, so RQ keeps no failed job of a finished run. A worker that cannot
    verify or import the factory (no or another RQRL_SECRET, the env's code missing) is sidelined as the other
    families' workers are (rqrl.engine.jobs.sideline): it reports itself to the run, waits its back-off so that
    another worker takes the job the trainer enqueues in its place, and raises WorkerUnfitError."""
    job = get_current_job()
    if job is None:
        raise RunStoppedError("SEED jobs run on rqrl workers only")
    keys = RunKeys(run_name)
    blob = job.connection.get(keys.seed(factory))
    run: SeedRun | None = None
    try:
        if isinstance(blob, bytes):
            secret, [loaded] = load_signed(run_name, blob)
            run = SeedRun.attach(job.connection, keys, secret)
    except RunStoppedError:
        pass
    except WorkerUnfitError as error:
        sideline(job.connection, keys, job.id, error)
        back_off(run_name)
        raise
    if run is None or run.stopped() or not run.connection.exists(run.keys.seed("settings")):
        log.info("run %s ended before its %s job started: nothing to do", run_name, name)
        return None
    fit_again(run.connection, run.keys)
    return run, loaded


def run_seed_actor(run_name: str, actor_index: int, token: str) -> None:
    """Job: one actor (``actor_threads`` env threads) until the run stops or another job takes its place."""
    joined = _joined(run_name, f"actor-{actor_index}", "environment")
    if joined is None:
        return
    run, environment = joined
    actor = Actor(run, actor_index, environment=environment)
    with _liveness(run, f"actor-{actor_index}", token, actor.stop.set):
        actor.run_forever(tick=_rate_limited(beat_worker, protocol_timings().heartbeat))


def run_seed_server(run_name: str, server_index: int, token: str) -> None:
    """Job: one inference server until the run stops or another job takes its place."""
    import torch

    joined = _joined(run_name, f"server-{server_index}", "model")
    if joined is None:
        return
    run, model_factory = joined
    settings = run.settings()
    torch.set_num_threads(settings["inference_threads"])
    server = InferenceServer(run, model_factory(), f"server-{server_index}.{token}",
                             settings["inference_batchsize"], settings["inference_delay"],
                             settings["inference_device"], settings["broadcast_period"])
    stop = threading.Event()
    with _liveness(run, f"server-{server_index}", token, stop.set):
        server.run_forever(stop, tick=_rate_limited(beat_worker, protocol_timings().heartbeat))


@dataclass
class PlacedJob:
    """The newest job of one actor or server, as the trainer tracks it."""

    token: str
    job_id: str
    left_queue_at: float | None = None
    seen: bool = False
    queued_at: float = field(default_factory=time.monotonic)
    warned: bool = False


class JobFleet:
    """The trainer's side of job mode: enqueue actors and servers, tell which died, clean everything up."""

    def __init__(self, connection: redis.Redis, queue_name: str, keys: RunKeys, actor_processes: int):
        self.connection, self.queue_name, self.keys = connection, queue_name, keys
        self.actor_processes = actor_processes
        self.jobs: dict[str, PlacedJob] = {}
        self.job_ids: list[str] = []  # every job ever enqueued, for the clean-up
        self._supervisor: Supervisor | None = None  # the engine's reader of sidelined workers, once there is a run

    def launch(self, name: str) -> None:
        """Enqueue a job for ``name`` (actor-0, server-1, ...); an older job of ``name`` stops by itself."""
        token = uuid.uuid4().hex[:8]
        placed = PlacedJob(token, enqueue(self.connection, self.queue_name, self.keys, name, token,
                                          self.actor_processes))
        self.jobs[name] = placed
        self.job_ids.append(placed.job_id)

    def dead(self) -> list[tuple[str, str]]:
        """``(name, cause)`` of each job that stopped beating, failed or never started; queued ones just wait, and
        one that its worker refused goes back on the queue (see hand_back_refused)."""
        self.hand_back_refused(throttled=True)
        flags = self._running()
        now = time.monotonic()
        queued: set[str] | None = None
        failed: set[str] | None = None
        found = []
        for name, placed in list(self.jobs.items()):  # as they were: a job the hand-back below re-launched waits
            if self.jobs[name] is not placed:  # launched during this call: on the queue, not yet looked at
                continue
            if flags[name]:
                placed.seen = True
                continue
            if queued is None:
                queued = set(rollout_queue(self.queue_name, self.connection).get_job_ids())
            if placed.job_id in queued:
                self._warn_if_starved(name, placed, now)
                continue  # waiting for a free worker
            if placed.seen:
                found.append((name, f"stopped beating: its worker was killed or its job {placed.job_id} failed "
                                    f"(the worker's log says which)"))
                continue
            if failed is None:
                self.hand_back_refused(throttled=False)  # a refused job fails too, after its worker's back-off
                failed = set(failed_registry(self.queue_name, self.connection).get_job_ids())
                if self.jobs[name] is not placed:  # this one was re-launched just now
                    continue
            if placed.job_id in failed:
                found.append((name, f"failed before it started: job {placed.job_id} is in queue "
                                    f"{self.queue_name!r}'s failed registry (its worker's log says why)"))
                continue
            placed.left_queue_at = placed.left_queue_at or now
            if now - placed.left_queue_at > (job_start := protocol_timings().seed_job_start):
                found.append((name, f"never started: job {placed.job_id} left the queue {job_start:g} s ago"))
        return found

    def hand_back_refused(self, throttled: bool) -> None:
        """Enqueue again each job that its worker refused (rqrl.engine.jobs.sideline: no or another RQRL_SECRET,
        the env's code missing), for another worker; the engine's Supervisor warns once for each such worker and
        raises WorkersRefusedError once every live worker on the queue refused the run."""
        if self._supervisor is None:
            self._supervisor = Supervisor(self.connection, read_config(self.connection, self.keys.run_name),
                                          rollout_queue(self.queue_name, self.connection))
        self._supervisor.check_sidelined_workers(throttled=throttled)
        refused = {report["job_id"]: report["worker"] for report in self._supervisor.sidelined.values()}
        for name, placed in self.jobs.items():
            if (worker := refused.get(placed.job_id)) is not None:
                log.info("run %s: worker %s refused %s's job %s: enqueueing it again for another worker",
                         self.keys.run_name, worker, name, placed.job_id)
                self.launch(name)

    def _running(self) -> dict[str, bool]:
        return running(self.connection, self.keys, {name: group_of(name, self.actor_processes) for name in self.jobs},
                       {name: placed.job_id for name, placed in self.jobs.items()})

    def _warn_if_starved(self, name: str, placed: PlacedJob, now: float) -> None:
        """Every actor and server job holds its worker for the whole run: with fewer workers than jobs the
        rest wait forever, so a job queued for ProtocolTimings.seed_queued_warning gets one warning naming the fix."""
        if placed.warned or now - placed.queued_at < protocol_timings().seed_queued_warning:
            return
        placed.warned = True
        log.warning("run %s: %s's job has waited %.0f s on queue %r for a free worker; job mode runs %d jobs at "
                    "once (inference_servers + actor_processes), each holding a worker for the whole run: start "
                    "at least %d `rqrl worker --queue %s` processes", self.keys.run_name, name, now - placed.queued_at,
                    self.queue_name, len(self.jobs), len(self.jobs), self.queue_name)

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the jobs to see the run's stop flag, then delete every job of the run."""
        deadline = time.monotonic() + timeout
        queue = rollout_queue(self.queue_name, self.connection)
        for identifier in self.job_ids:  # first, so no worker starts a queued job while the others wind down
            queue.remove(identifier)
        while self.jobs and any(self._running().values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        failed = failed_registry(self.queue_name, self.connection)
        for identifier in self.job_ids:  # a killed worker's entry in the started registry is RQ's to clean up
            queue.remove(identifier)
            failed.remove(identifier)
            self.connection.delete(Job.key_for(identifier))
        self.jobs.clear()
        self.job_ids.clear()
