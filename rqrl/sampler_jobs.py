"""The garage sampler's RQ job: runs the logical workers of one group for one ``obtain_*`` call.

A worker process keeps each logical worker warm (its ``LogicalWorker``, and the update chains it has
applied) in a per-run context, so consecutive calls only apply the new updates; a logical worker
that lands on another process is rebuilt there from the factory and its chains. Before every
episode, a seeded logical worker is reseeded with ``((version - 1) << 32) | k`` (``k`` its episode
index in the call), so episode ``k`` of a call is the same wherever and after whatever it runs:
the first ever is seeded with ``seed + worker_number``.

The job runs its workers' episodes round robin and pushes each (``rqrl.sampler_store``) until the
call is done or superseded, each worker's quota is met (``n`` episodes; or, for obtain_samples,
``num_samples`` steps of its own, which is as many as the sampler can ever use of it), or another
job waits and the slice has run ``min_job_seconds`` (then it enqueues its continuation). It holds its
group's lease (``rqrl.leases``) throughout, so the sampler's reaper re-runs the group from its
recorded progress if the process dies. Job arguments are plain JSON: (run name, group id, version).
"""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue, get_current_job
from rq.serializers import JSONSerializer

from rqrl.codec import RECORD_MAGIC, records_key, sign, weights_key
from rqrl.enqueue import ERROR_TTL_SECONDS, SAMPLER_JOB_FUNCTION
from rqrl.episodes import EpisodeBatch, encode_episodes
from rqrl.errors import ForbiddenJobError, LeaseLostError, RecordError, RunStoppedError, WorkerUnfitError
from rqrl.jobs import (
    JobSlice,
    back_off,
    load_signed,
    push_error_report,
    read_config,
    sideline,
    worker_label,
)
from rqrl.keys import RunKeys
from rqrl.leases import GroupLease, hand_over, hand_over_from, lease_holder
from rqrl.lockstep import Lockstep, lockstep_ready
from rqrl.run_config import RunConfig
from rqrl.sampler_store import (
    AGENT,
    DUPLICATE,
    ENV,
    EXACT,
    LEASE_LOST,
    PUSHED,
    STALE,
    STOPPED,
    ChainEntry,
    SamplerCall,
    SamplerStore,
    decode_update,
    plan_chain,
)
from rqrl.sampler_worker import LogicalWorker, WorkerFactory

log = logging.getLogger(__name__)

OTHERS_LEAD = 2
"""Samples mode: episodes a logical worker may run ahead of the slowest worker of other groups (its own
group's are stepped together and kept within one); what runs further ahead would only be dropped."""
PACE_SECONDS = 0.01
"""How often a job whose workers are held back reads the call's progress."""

SAMPLER_KIND = "garage-sampler"
"""``RunConfig.extra["kind"]`` of a sampler run: its job refuses runs of any other kind."""


def enqueue_sampler_group(connection: redis.Redis, config: RunConfig, group_id: int, version: int,
                          holder: str | None = None) -> str:
    """Enqueue the job that runs ``group_id`` for call ``version``, handing it the group's lease first (so
    the reaper never sees it waiting without one); with ``holder`` (a continuation) only while that job
    still holds the group, else LeaseLostError."""
    keys = RunKeys(config.run_name)
    job_id = keys.sampler_job_id(group_id, version, uuid.uuid4().hex[:8])
    if holder is not None:
        if not hand_over_from(connection, keys, group_id, holder, job_id, version, config.lease_seconds):
            raise LeaseLostError(f"sampler group {group_id} is no longer {holder}'s: enqueueing no continuation")
    else:
        with connection.pipeline(transaction=True) as pipe:
            hand_over(pipe, keys, group_id, job_id, version, config.lease_seconds)
            pipe.execute()
    queue = Queue(config.queue_name, connection=connection, serializer=JSONSerializer)
    queue.enqueue(SAMPLER_JOB_FUNCTION, config.run_name, group_id, version, job_id=job_id,
                  description=f"rqrl sampler {config.run_name} workers {config.actor_groups[group_id]} call {version}",
                  result_ttl=0, failure_ttl=ERROR_TTL_SECONDS, job_timeout=-1)
    return job_id


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
        updates = [decode_update(blob, self.secret, self.weights_key) for blob in blobs if blob is not None]
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


_CONTEXTS: dict[str, SamplerContext] = {}
_MAX_CONTEXTS = 4


def load_sampler_context(connection: redis.Redis, config: RunConfig) -> SamplerContext:
    """The warm context of the run, rebuilt if the run was restarted under the same name."""
    context = _CONTEXTS.get(config.run_name)
    if context is not None and context.config.run_id == config.run_id:
        return context
    if context is not None:
        _CONTEXTS.pop(config.run_name).close()
    keys = RunKeys(config.run_name)
    blob = connection.get(keys.env_factory)
    if not isinstance(blob, bytes):
        raise RunStoppedError(f"sampler run {config.run_name!r} has no worker factory in Redis")
    secret, (factory,) = load_signed(config.run_name, blob)
    if not isinstance(factory, WorkerFactory):
        raise RecordError(f"sampler run {config.run_name!r} stores a {type(factory).__name__}, not a WorkerFactory")
    context = SamplerContext(config=config, factory=factory, keys=keys, secret=secret,
                             records_key=records_key(secret, config.run_id),
                             weights_key=weights_key(secret, config.run_id))
    while len(_CONTEXTS) >= _MAX_CONTEXTS:
        _CONTEXTS.pop(next(iter(_CONTEXTS))).close()
    _CONTEXTS[config.run_name] = context
    return context


def _drop_context(run_name: str) -> None:
    context = _CONTEXTS.pop(run_name, None)
    if context is not None:
        context.close()


def run_sampler_group(run_name: str, group_id: int, version: int) -> dict[str, Any]:
    """RQ job: run the episodes of one sampler group's logical workers for call ``version``."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("run_sampler_group must run inside an RQ job")
    connection = job.connection
    keys = RunKeys(run_name)
    lease: GroupLease | None = None
    pushed = 0
    members: list[int] = []
    current: tuple[int, int] = (-1, 0)  # (worker, episode) being run: named in a failure report
    try:
        config = read_config(connection, run_name)
        _check_job_arguments(config, group_id, version)
        members = config.actor_groups[group_id]
        store = SamplerStore(connection, keys)
        if store.current_version() != version:  # a job left queued by an earlier call: leave the lease alone
            return {"episodes": 0, "stale": True}
        held = lease = GroupLease(connection, keys, group_id, lease_holder(job.id, uuid.uuid4().hex),
                                  config.lease_seconds, config.hang_seconds)
        held.acquire()
        call = store.read_call(version, config.n_actors)
        if call is None or store.current_version() != version:
            return {"episodes": 0, "stale": True}
        context = load_sampler_context(connection, config)
        progress = store.progress(version)
        next_k = {w: progress.get(w, (0, 0))[0] for w in members}
        steps = {w: progress.get(w, (0, 0))[1] for w in members}
        workers: dict[int, LogicalWorker] = {}
        for w in members:
            current = (w, next_k[w])
            prepared = _prepare(context, store, w, call)
            if prepared is None:
                return {"episodes": 0, "stale": True}
            workers[w] = prepared

        def quota_met(w: int) -> bool:
            return next_k[w] >= call.count if call.mode == EXACT else steps[w] >= call.count

        def reseed(w: int) -> None:
            if getattr(workers[w], "seed", None) is not None:
                workers[w].reseed(((version - 1) << 32) | next_k[w])

        def push(w: int, batch: EpisodeBatch) -> dict[str, Any] | None:
            """Push episode ``next_k[w]`` of ``w``; a result to return when the job must stop."""
            nonlocal pushed
            k, length = next_k[w], int(batch.lengths.sum())
            blob = sign(encode_episodes(batch, {"worker": str(w), "episode": str(k), "version": str(version)}),
                        context.records_key, RECORD_MAGIC)
            result = store.push(version, group_id, w, k, length, blob, held.holder)
            if result in (STALE, STOPPED):
                return {"episodes": pushed, "stale": result == STALE, "stopped": result == STOPPED}
            if result == LEASE_LOST:
                raise LeaseLostError(f"sampler group {group_id} was taken over by another job")
            pushed += result == PUSHED
            if result not in (PUSHED, DUPLICATE):
                raise RecordError(f"the episode push script answered {result}")
            next_k[w], steps[w] = k + 1, steps[w] + length
            held.touch()
            return None

        work = JobSlice(connection, config)
        active = [w for w in members if not quota_met(w)]
        if active and lockstep_ready([workers[w] for w in active]):
            group = Lockstep([workers[w] for w in active])
            yielding = False
            waiting = list(active)  # workers between episodes, held back while they are ahead (samples mode)
            others = _lowest_elsewhere(progress, call, members)
            paced = time.monotonic()
            try:
                while True:
                    # samples: the call takes a round-robin prefix, so a worker starts episode k only once every
                    # worker of its group has pushed episode k - 2 (a lead of one episode, as in rollouts) and
                    # every other logical worker of the call k - 1 - OTHERS_LEAD (progress read at most every
                    # PACE_SECONDS while it holds someone back)
                    lowest = min((next_k[w] for w in active), default=0)
                    if not yielding and call.mode != EXACT and any(next_k[w] > others + OTHERS_LEAD for w in waiting) \
                            and time.monotonic() - paced > PACE_SECONDS:
                        others, over = _pace(store, version, call, members)
                        paced = time.monotonic()
                        if over:
                            return {"episodes": pushed, "stale": True}
                    for w in [] if yielding else sorted(waiting):
                        if call.mode == EXACT or (next_k[w] <= lowest + 1 and next_k[w] <= others + OTHERS_LEAD):
                            waiting.remove(w)
                            current = (w, next_k[w])
                            reseed(w)
                            group.begin(workers[w])
                    if not group.running:
                        if not waiting or yielding:
                            break
                        # every worker of the group is ahead of the other groups: give the process to a waiting
                        # job, else wait for them
                        if work.jobs_waiting():
                            yielding = True
                            break
                        time.sleep(PACE_SECONDS)
                        held.touch()
                        work.heartbeat()
                        continue
                    try:
                        finished = group.step()
                    except Exception:
                        if group.current is not None:
                            current = (group.current, next_k[group.current])
                        raise
                    held.touch()  # a long episode is not a hung job
                    if finished and not group.globals_untouched():  # an env drew from a global RNG: re-run
                        group.abandon()  # what is in flight as rollouts, on each worker's own streams
                        break
                    for worker in finished:
                        w = worker.worker_number
                        current = (w, next_k[w])
                        stop = push(w, worker.collect_episode())
                        if stop is not None:
                            return stop
                        if quota_met(w):
                            active.remove(w)
                        else:
                            waiting.append(w)
                    if finished:
                        work.heartbeat()
                        yielding = yielding or (bool(active) and work.should_yield())  # then let the rest finish
            finally:
                group.abandon()  # a job that stops early (stale, yield, error) leaves no half-collected episode
                group.close()
            if yielding and active:
                enqueue_sampler_group(connection, config, group_id, version, holder=held.holder)
                return {"episodes": pushed, "yielded": True}
        while active:
            for w in list(active):
                current = (w, next_k[w])
                reseed(w)
                stop = push(w, workers[w].rollout(on_step=held.touch))  # a long episode is not a hung job
                if stop is not None:
                    return stop
                if quota_met(w):
                    active.remove(w)
            work.heartbeat()
            if active and work.should_yield():
                enqueue_sampler_group(connection, config, group_id, version, holder=held.holder)
                return {"episodes": pushed, "yielded": True}
        return {"episodes": pushed}
    except RunStoppedError:
        _drop_context(run_name)
        return {"episodes": pushed, "stopped": True}
    except ForbiddenJobError:
        raise
    except WorkerUnfitError as error:  # this worker's fault, not the episodes': as rqrl.jobs.run_actor_group
        if lease is not None:
            try:
                enqueue_sampler_group(connection, config, group_id, version, holder=lease.holder)
            except LeaseLostError:
                pass
            lease.release()
            lease = None
        _drop_workers(run_name, members)
        sideline(connection, keys, job.id, error)
        back_off(run_name)
        raise
    except LeaseLostError:
        log.warning("job %s lost sampler group %d to another job; stopping", job.id, group_id)
        _drop_workers(run_name, members)
        return {"episodes": pushed, "lost": True}
    except Exception as error:
        still_ours = lease is None or lease.mark_failed()
        lease = None
        _drop_workers(run_name, members)
        if still_ours:
            _report_failure(connection, keys, job.id, members, current, version, error)
        raise
    finally:
        if lease is not None:
            lease.release()


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


def _check_job_arguments(config: RunConfig, group_id: object, version: object) -> None:
    """Refuse what no sampler enqueues: another kind of run, a group outside it, a version below 1."""
    if config.extra.get("kind") != SAMPLER_KIND:
        raise ForbiddenJobError(f"refusing a sampler job for run {config.run_name!r}, which is not a sampler run")
    if not (type(group_id) is int and 0 <= group_id < len(config.actor_groups)):
        raise ForbiddenJobError(f"refusing a sampler job for group {group_id!r}: run {config.run_name!r} has "
                                f"groups 0..{len(config.actor_groups) - 1}")
    if not (type(version) is int and version >= 1):
        raise ForbiddenJobError(f"refusing a sampler job for call {version!r}: expected an int >= 1")


def _drop_workers(run_name: str, members: list[int]) -> None:
    context = _CONTEXTS.get(run_name)
    if context is not None:
        for w in members:
            context.drop(w)


def _report_failure(connection: redis.Redis, keys: RunKeys, job_id: str, members: list[int],
                    current: tuple[int, int], version: int, error: BaseException) -> None:
    """Tell the sampler which logical worker failed, in which episode, and why (with this worker's traceback),
    in the report format of rqrl.jobs (``actor_ids`` are the group's logical workers)."""
    worker_number, episode = current
    report = {
        "job_id": job_id, "group_id": -1, "actor_ids": members, "rollout_id": episode, "worker": worker_label(),
        "worker_number": worker_number, "version": version,
        "error": f"logical worker {worker_number}, episode {episode} of call {version}: {type(error).__name__}: "
                 f"{error}",
        "traceback": traceback.format_exc(),
    }
    push_error_report(connection, keys, report)
