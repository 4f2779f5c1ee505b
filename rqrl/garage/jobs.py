"""The garage sampler's RQ job: runs the logical workers of one group for one ``obtain_*`` call.

A worker process keeps each logical worker warm (its ``LogicalWorker``, and the update chains it has
applied) in a per-run context, so consecutive calls only apply the new updates; a logical worker
that lands on another process is rebuilt there from the factory and its chains. Before every
episode, a seeded logical worker is reseeded with ``((version - 1) << 32) | k`` (``k`` its episode
index in the call), so episode ``k`` of a call is the same wherever and after whatever it runs:
the first ever is seeded with ``seed + worker_number``.

The job runs its workers' episodes round robin and pushes each (``rqrl.garage.store``) until the
call is done or superseded, each worker's quota is met (``n`` episodes; or, for obtain_samples,
``num_samples`` steps of its own, which is as many as the sampler can ever use of it), or another
job waits and the slice has run ``min_job_seconds`` (then it enqueues its continuation). It holds its
group's lease (``rqrl.engine.leases``) throughout, so the sampler's reaper re-runs the group from its
recorded progress if the process dies. Job arguments are plain JSON: (run name, group id, version).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis

from rqrl.engine.codec import RECORD_MAGIC, records_key, sign, weights_key
from rqrl.engine.enqueue import SAMPLER_JOB_FUNCTION, enqueue_with_lease
from rqrl.engine.group_job import GroupJob, WarmContexts, check_group_arguments
from rqrl.engine.jobs import (
    JobSlice,
    fit_again,
    load_signed,
    shutdown_requested,
)
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import SAMPLER_KIND, RunConfig
from rqrl.errors import ForbiddenJobError, LeaseLostError, RecordError, RunStoppedError, WorkerUnfitError
from rqrl.garage.episodes import EpisodeBatch, encode_episodes
from rqrl.garage.lockstep import Lockstep, lockstep_ready
from rqrl.garage.store import (
    AGENT,
    ENV,
    EXACT,
    ChainEntry,
    EpisodePush,
    SamplerCall,
    SamplerStore,
    decode_update,
    plan_chain,
)
from rqrl.garage.worker import LogicalWorker, WorkerFactory

log = logging.getLogger(__name__)

OTHERS_LEAD = 2
"""Samples mode: episodes a logical worker may run ahead of the slowest worker of other groups (its own
group's are stepped together and kept within one); what runs further ahead would only be dropped."""
PACE_SECONDS = 0.01
"""How often a job whose workers are held back reads the call's progress."""
OVER_CHECK_SECONDS = 0.1
"""How often a stepping job asks whether its call is over: its episodes in flight are then dropped at once
rather than run to their end (a Pong episode takes seconds) and refused."""



def enqueue_sampler_group(connection: redis.Redis, config: RunConfig, group_id: int, version: int,
                          holder: str | None = None) -> str:
    """Enqueue the job that runs ``group_id`` for call ``version``, handing it the group's lease first (so
    the reaper never sees it waiting without one); with ``holder`` (a continuation) only while that job
    still holds the group, else LeaseLostError."""
    job_id = RunKeys(config.run_name).sampler_job_id(group_id, version, uuid.uuid4().hex[:8])
    return enqueue_with_lease(connection, config, SAMPLER_JOB_FUNCTION, group_id, version, job_id, holder,
                              f"rqrl sampler {config.run_name} workers {config.actor_groups[group_id]} call {version}")


@dataclass
class _Warm:
    """A logical worker kept warm in this process, and the chains it has applied."""

    worker: LogicalWorker
    agent_chain: list[ChainEntry] = field(default_factory=list)
    env_chain: list[ChainEntry] = field(default_factory=list)


@dataclass
class SamplerContext:
    """What a worker process keeps of one sampler run: its config, factory, keys and warm logical workers."""

    config: RunConfig
    factory: WorkerFactory
    keys: RunKeys
    secret: bytes
    records_key: bytes
    weights_key: bytes
    workers: dict[int, _Warm] = field(default_factory=dict)

    def prepared(self, store: SamplerStore, worker_number: int, call: SamplerCall) -> LogicalWorker | None:
        """Logical worker ``worker_number`` with the call's updates applied; None if the call's updates are
        gone (the sampler moved on)."""
        warm = self.workers.get(worker_number)
        if warm is None:
            warm = self.workers[worker_number] = _Warm(self.factory(worker_number))
        _, agent_entries = plan_chain(warm.agent_chain, call.agent_chains[worker_number])
        rebuild_env, env_entries = plan_chain(warm.env_chain, call.env_chains[worker_number])
        keys = [self.keys.sampler_update(v, AGENT, scope) for v, scope, _ in agent_entries]
        keys += [self.keys.sampler_update(v, ENV, scope) for v, scope, _ in env_entries]
        blobs = store.read_blobs(keys)
        if any(blob is None for blob in blobs):
            return None
        updates = [decode_update(blob, self.secret, self.weights_key, key)
                   for key, blob in zip(keys, blobs, strict=True) if blob is not None]
        worker = warm.worker
        try:
            if rebuild_env and worker.env is not None:
                worker.env.close()
                worker.env = None
            for update in updates[len(agent_entries):]:
                worker.update_env(update)
            for update in updates[:len(agent_entries)]:
                worker.update_agent(update)
        except BaseException:
            self.drop(worker_number)
            raise
        warm.agent_chain = list(call.agent_chains[worker_number])
        warm.env_chain = list(call.env_chains[worker_number])
        return worker

    def drop(self, worker_number: int) -> None:
        """Forget a logical worker (it may be mid-episode): it is rebuilt from its chains next time."""
        warm = self.workers.pop(worker_number, None)
        if warm is not None:
            warm.worker.shutdown()

    def close(self) -> None:
        for worker_number in list(self.workers):
            self.drop(worker_number)


CONTEXTS: WarmContexts[SamplerContext] = WarmContexts()
"""This worker process's warm sampler runs."""


def load_sampler_context(connection: redis.Redis, config: RunConfig) -> SamplerContext:
    """The warm context of the run, rebuilt if the run was restarted under the same name."""
    context = CONTEXTS.get(config.run_name, config.run_id)
    if context is not None:
        return context
    keys = RunKeys(config.run_name)
    blob = connection.get(keys.env_factory)
    if not isinstance(blob, bytes):
        raise RunStoppedError(f"sampler run {config.run_name!r} has no worker factory in Redis")
    secret, (factory,) = load_signed(config.run_name, blob)
    if not isinstance(factory, WorkerFactory):
        raise RecordError(f"sampler run {config.run_name!r} stores a {type(factory).__name__}, not a WorkerFactory")
    return CONTEXTS.add(config.run_name, SamplerContext(
        config=config, factory=factory, keys=keys, secret=secret, records_key=records_key(secret, config.run_id),
        weights_key=weights_key(secret, config.run_id)))


def run_sampler_group(run_name: str, group_id: int, version: int) -> dict[str, Any]:
    """RQ job: run the episodes of one sampler group's logical workers for call ``version``."""
    return SamplerGroupJob(run_name, group_id, version).run()


class SamplerGroupJob(GroupJob):
    """One slice of one sampler group for one call: its logical workers' episodes, pushed until each worker's
    quota is met, the call is over, or the group has to move."""

    group_kind = "sampler group"

    def __init__(self, run_name: str, group_id: int, version: int):
        super().__init__(run_name, group_id, version)
        self.version = version
        self.pushed = 0
        self.members: list[int] = []
        self.current: tuple[int, int] = (-1, 0)
        """(logical worker, episode) being run: named in a failure report."""
        self.workers: dict[int, LogicalWorker] = {}
        self.next_k: dict[int, int] = {}
        self.steps: dict[int, int] = {}

    def check_arguments(self) -> None:
        if self.config.extra.get("kind") != SAMPLER_KIND:
            raise ForbiddenJobError(f"refusing a sampler job for run {self.run_name!r}, which is not a sampler run")
        check_group_arguments(self.config, self.group_id, self.version, least=1, what="call")

    def counts(self) -> dict[str, Any]:
        return {"episodes": self.pushed}

    def enqueue_continuation(self, holder: str) -> None:
        enqueue_sampler_group(self.connection, self.config, self.group_id, self.version, holder=holder)

    def forget_group(self) -> None:
        context = CONTEXTS.peek(self.run_name)
        if context is not None:
            for w in self.members:
                context.drop(w)

    def forget_run(self) -> None:
        CONTEXTS.drop(self.run_name)

    def failure_fields(self, error: BaseException) -> dict[str, Any]:
        worker_number, episode = self.current
        return {"actor_ids": self.members, "rollout_id": episode, "worker_number": worker_number,
                "version": self.version,
                "error": f"logical worker {worker_number}, episode {episode} of call {self.version}: "
                         f"{type(error).__name__}: {error}"}

    def stale(self) -> dict[str, Any]:
        """The call is over or superseded: what this job did, and that it stopped for that."""
        return {**self.counts(), "stale": True}

    def work(self) -> dict[str, Any]:
        self.members = self.config.actor_groups[self.group_id]
        self.store = store = SamplerStore(self.connection, self.keys)
        if store.current_version() != self.version:  # a job left queued by an earlier call: leave the lease alone
            return self.stale()
        self.held = self.take_lease()
        context = self.context = load_sampler_context(self.connection, self.config)
        call = store.read_call(self.version, self.config.n_actors, context.weights_key)
        if call is None or store.current_version() != self.version:
            return self.stale()
        self.call = call
        progress = store.progress(self.version)
        self.next_k = {w: progress.get(w, (0, 0))[0] for w in self.members}
        self.steps = {w: progress.get(w, (0, 0))[1] for w in self.members}
        for w in self.members:
            self.current = (w, self.next_k[w])
            prepared = _prepare(context, store, w, call)
            if prepared is None:
                return self.stale()
            self.workers[w] = prepared
        fit_again(self.connection, self.keys)
        self.slice = JobSlice(self.connection, self.config)
        self.active = [w for w in self.members if not self.quota_met(w)]
        if self.active and lockstep_ready([self.workers[w] for w in self.active]):
            result = LockstepTurns(self, progress).run()
            if result is not None:
                return result
        return self._one_by_one()

    def _one_by_one(self) -> dict[str, Any]:
        """The active workers' episodes round robin, each stepped on its own."""
        watch = _CallWatch(self)
        while self.active:
            for w in list(self.active):
                self.current = (w, self.next_k[w])
                self.reseed(w)
                try:
                    episode = self.workers[w].rollout(on_step=watch.step)
                except _CallOver:  # dropped unfinished (rollout clears it): nobody would take it
                    self.store.count_dropped(1)
                    return self.stale()
                stop = self.push(w, episode)
                if stop is not None:
                    return stop
                if self.quota_met(w):
                    self.active.remove(w)
            self.slice.heartbeat()
            if self.active and self.slice.should_yield():
                return self.yield_group()
        return self.counts()

    def yield_group(self) -> dict[str, Any]:
        """Hand the rest of the call's work for this group to a continuation."""
        self.continue_later()
        return {**self.counts(), "yielded": True}

    def quota_met(self, w: int) -> bool:
        call = self.call
        return self.next_k[w] >= call.count if call.mode == EXACT else self.steps[w] >= call.count

    def reseed(self, w: int) -> None:
        if getattr(self.workers[w], "seed", None) is not None:
            self.workers[w].reseed(((self.version - 1) << 32) | self.next_k[w])

    def push(self, w: int, batch: EpisodeBatch) -> dict[str, Any] | None:
        """Push episode ``next_k[w]`` of ``w``; a result to return when the job must stop."""
        k, length = self.next_k[w], int(batch.lengths.sum())
        blob = sign(encode_episodes(batch, {"worker": str(w), "episode": str(k), "version": str(self.version)}),
                    self.context.records_key, RECORD_MAGIC)
        result = self.store.push(self.version, self.group_id, w, k, length, blob, self.held.holder)
        if result in (EpisodePush.STALE, EpisodePush.STOPPED):
            return {**self.counts(), "stale": result == EpisodePush.STALE, "stopped": result == EpisodePush.STOPPED}
        if result == EpisodePush.LEASE_LOST:
            raise LeaseLostError(f"sampler group {self.group_id} was taken over by another job")
        self.pushed += result == EpisodePush.PUSHED
        if result not in (EpisodePush.PUSHED, EpisodePush.DUPLICATE):
            raise RecordError(f"the episode push script answered {result}")
        self.next_k[w], self.steps[w] = k + 1, self.steps[w] + length
        self.held.touch()
        return None


class _CallOver(Exception):
    """The call a job's episode in flight was for is over (raised from a step, caught by the job)."""


class _CallWatch:
    """Whether a stepping job's call is over, asked of Redis at most every OVER_CHECK_SECONDS."""

    def __init__(self, job: SamplerGroupJob):
        self.job, self.checked = job, time.monotonic()

    def over(self) -> bool:
        now = time.monotonic()
        if now - self.checked <= OVER_CHECK_SECONDS:
            return False
        self.checked = now
        return self.job.store.call_over(self.job.version)

    def step(self) -> None:
        """A one-by-one episode's ``on_step``: keeps the job's lease alive through a long episode, and raises
        _CallOver once the call is over."""
        self.job.held.touch()
        if self.over():
            raise _CallOver


class LockstepTurns:
    """A sampler job's active workers stepped together (rqrl.garage.lockstep), one batched forward per step.

    In samples mode the call takes a round-robin prefix, so a worker starts episode k only once every worker of
    its group has pushed episode k - 2 (a lead of one episode, as in rollouts) and every other logical worker of
    the call k - 1 - OTHERS_LEAD (progress read at most every PACE_SECONDS while it holds someone back)."""

    def __init__(self, job: SamplerGroupJob, progress: dict[int, tuple[int, int]]):
        self.job = job
        self.group = Lockstep([job.workers[w] for w in job.active])
        self.yielding = False
        self.waiting = list(job.active)
        """Workers between episodes, held back while they are ahead (samples mode)."""
        self.others = _lowest_elsewhere(progress, job.call, job.members)
        self.paced = time.monotonic()
        self.watch = _CallWatch(job)

    def run(self) -> dict[str, Any] | None:
        """Step until every worker is done or the job yields; a result to return, or None to go on one by one
        (an env drew from a global RNG: what was in flight is re-run on each worker's own streams)."""
        try:
            while True:
                outcome = self.turn()
                if isinstance(outcome, dict):
                    return outcome
                if outcome is True or (not self.group.running and (not self.waiting or self.yielding)):
                    break
        finally:
            self.group.abandon()  # a job that stops early (stale, yield, error) leaves no half-collected episode
            self.group.close()
        if self.yielding and self.job.active:
            return self.job.yield_group()
        return None

    def turn(self) -> dict[str, Any] | bool | None:
        """One step of the group: a result to return, True to leave the lockstep, None to go on (``run()`` leaves
        it too once no worker runs and none may start)."""
        job = self.job
        if self.pace():
            job.store.count_dropped(len(self.group.running))  # dropped unfinished (run() abandons them)
            return job.stale()
        self.begin_waiting()
        if not self.group.running:
            if not self.waiting or self.yielding:
                return None
            if shutdown_requested() or job.slice.jobs_waiting():  # every worker here is ahead of the other
                self.yielding = True  # groups: give the process back (shutdown) or to a waiting job, else wait
                return None
            time.sleep(PACE_SECONDS)
            job.held.touch()
            job.slice.heartbeat()
            return None
        try:
            finished = self.group.step()
        except Exception:
            if self.group.current is not None:
                job.current = (self.group.current, job.next_k[self.group.current])
            raise
        job.held.touch()  # a long episode is not a hung job
        if finished and not self.group.globals_untouched():  # an env drew from a global RNG: re-run one by one
            self.group.abandon()
            return True
        return self.push_finished(finished)

    def pace(self) -> bool:
        """Read the call's progress when a waiting worker is too far ahead of the others, and whether the call is
        over every OVER_CHECK_SECONDS; True if it is."""
        job = self.job
        if self.yielding:
            return False
        if job.call.mode == EXACT or time.monotonic() - self.paced <= PACE_SECONDS or not any(
                job.next_k[w] > self.others + OTHERS_LEAD for w in self.waiting):
            return self.watch.over()
        self.others, over = _pace(job.store, job.version, job.call, job.members)
        self.paced = self.watch.checked = time.monotonic()
        return over

    def begin_waiting(self) -> None:
        """Start the next episode of each waiting worker that is not too far ahead."""
        job = self.job
        lowest = min((job.next_k[w] for w in job.active), default=0)
        for w in [] if self.yielding else sorted(self.waiting):
            if job.call.mode == EXACT or (job.next_k[w] <= lowest + 1 and job.next_k[w] <= self.others + OTHERS_LEAD):
                self.waiting.remove(w)
                job.current = (w, job.next_k[w])
                job.reseed(w)
                self.group.begin(job.workers[w])

    def push_finished(self, finished: list[LogicalWorker]) -> dict[str, Any] | None:
        """Push the episodes that ended this step; a result to return when the job must stop."""
        job = self.job
        for worker in finished:
            w = worker.worker_number
            job.current = (w, job.next_k[w])
            stop = job.push(w, worker.collect_episode())
            if stop is not None:
                return stop
            if job.quota_met(w):
                job.active.remove(w)
            else:
                self.waiting.append(w)
        if finished:
            job.slice.heartbeat()
            self.yielding = self.yielding or (bool(job.active) and job.slice.should_yield())  # let the rest finish
        return None


def _prepare(context: SamplerContext, store: SamplerStore, worker: int, call: SamplerCall) -> LogicalWorker | None:
    """The logical worker with the call's updates applied; WorkerUnfitError if their code does not import here."""
    try:
        return context.prepared(store, worker, call)
    except ImportError as error:
        raise WorkerUnfitError(
            f"this worker cannot load sampler run {context.config.run_name!r}'s agents or envs "
            f"({type(error).__name__}: {error}); install their code in this worker's environment (docs/service.md)"
        ) from error


def _lowest_elsewhere(progress: dict[int, tuple[int, int]], call: SamplerCall, members: list[int]) -> int:
    """The fewest episodes pushed by a logical worker outside ``members`` that still has steps to give."""
    member_set = set(members)
    counts = [k for w, (k, steps) in ((w, progress.get(w, (0, 0))) for w in range(len(call.agent_chains)))
              if w not in member_set and steps < call.count]
    return min(counts, default=1 << 62)


def _pace(store: SamplerStore, version: int, call: SamplerCall, members: list[int]) -> tuple[int, bool]:
    progress, over = store.pace(version)
    return _lowest_elsewhere(progress, call, members), over
