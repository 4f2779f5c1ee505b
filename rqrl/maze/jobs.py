"""The RQ job function: the one place where transport (Redis) and rollouts meet.

A job runs one actor group's rollouts for a *slice*: it keeps going in place for as long as its
group need not move, and yields (cuts its running episodes, marked ``truncated``, and enqueues its
own continuation at the queue's tail) only when it must: another job waits on a queue its worker
serves (checked every ``min_job_seconds`` once the slice has run that long), or its worker was
asked to shut down. ``max_job_seconds`` ends no slice by itself: past it, with nothing waiting, a
new slice starts in place and the episodes go on. The run stopping and a lost lease end a job
without a continuation. Envs, policies and weights stay warm in the worker process between jobs,
so a continuation that lands on the same worker only costs the RQ round trips. Job arguments are
plain JSON.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import torch

from rqrl.engine.codec import records_key, weights_key
from rqrl.engine.enqueue import enqueue_group
from rqrl.engine.group_job import GroupJob, StopCheck, WarmContexts, check_group_arguments
from rqrl.engine.jobs import (
    JobSlice,
    fit_again,
    load_signed,
    read_config,
    shutdown_requested,
    worker_label,
)
from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import recorded_progress, start_rollout
from rqrl.engine.policy import ActFunction, Policy, make_act_function
from rqrl.engine.run_config import RunConfig
from rqrl.engine.trajectories import PendingRollout, PushReport, SentPush, TrajectoryQueue
from rqrl.engine.weights import SentFetch, WeightStore
from rqrl.engine.worker_times import WorkerTimes
from rqrl.errors import (
    ForbiddenJobError,
    RunStoppedError,
    WorkerUnfitError,
)
from rqrl.maze.group_records import encode_signed_steps, entry_stream, records_per_entry
from rqrl.maze.rollout import ActorGroup, EnvFactory, GroupRollout

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """What a worker keeps warm for one run: config, env factory, policy, weights, actor groups, and the keys
    it signs records with and checks weights against (derived from the secret and the run id)."""

    config: RunConfig
    env_factory: EnvFactory
    policy: Policy
    keys: RunKeys
    records_key: bytes
    weights_key: bytes
    weights_version: int | None = None
    weights_checked_at: float = -math.inf
    """When (time.monotonic) this worker last read the answer to a check for weights newer than weights_version."""
    act: ActFunction | None = None
    groups: dict[int, ActorGroup] = field(default_factory=dict)

    def group(self, group_id: int) -> ActorGroup:
        if group_id not in self.groups:
            actor_ids = self.config.actor_groups[group_id]
            self.groups[group_id] = ActorGroup(
                self.env_factory,
                actor_ids,
                [self.config.actor_env_seeds[a] for a in actor_ids],
                [self.config.actor_agent_seeds[a] for a in actor_ids],
                self.config.n_rollout_steps,
            )
        group = self.groups[group_id]
        self.act_for(group)
        return group

    def act_for(self, group: ActorGroup) -> ActFunction:
        """The policy's act function, made once (for the action space of the run's envs)."""
        if self.act is None:
            self.act = make_act_function(self.policy, group.action_space)
        return self.act

    def weights_due(self) -> bool:
        """Whether to check for new weights before the next rollout: always before any came, else once the run's
        weights_refresh_seconds have passed since a check was last answered (a check sent and then dropped unread,
        as when its push waited for room, does not count)."""
        return (self.weights_version is None
                or time.monotonic() - self.weights_checked_at >= self.config.weights_refresh_seconds)

    def close(self) -> None:
        for group in self.groups.values():
            group.close()
        self.groups.clear()


CONTEXTS: WarmContexts[RunContext] = WarmContexts()
"""This worker process's warm runs."""


def load_context(connection: redis.Redis, run_name: str) -> RunContext:
    """The warm context of ``run_name``, rebuilt if the run was restarted under the same name."""
    keys = RunKeys(run_name)
    config = read_config(connection, run_name)
    context = CONTEXTS.get(run_name, config.run_id)
    if context is not None:
        return context
    env_factory_blob, policy_blob = connection.mget([keys.env_factory, keys.policy])
    # None: the run is gone; workers connect without decode_responses, so a value is bytes
    if not isinstance(env_factory_blob, bytes) or not isinstance(policy_blob, bytes):
        raise RunStoppedError(f"run {run_name!r} has no env factory or policy in Redis")
    secret, (policy, env_factory) = load_signed(run_name, policy_blob, env_factory_blob)
    if isinstance(policy, torch.nn.Module):
        policy.eval()
    return CONTEXTS.add(run_name, RunContext(
        config=config, env_factory=env_factory, policy=policy, keys=keys,
        records_key=records_key(secret, config.run_id), weights_key=weights_key(secret, config.run_id)))


def _wait_for_weights(context: RunContext, store: WeightStore, is_stopped: Callable[[], bool],
                      beat: Callable[[], None], sent: SentFetch | None = None) -> int | None:
    """Load the latest weights (the reply to ``sent``, a check sent ahead, if given); block until the learner has
    broadcast a first version (actors may start before it). Returns the version loaded, or None if the worker was
    asked to shut down meanwhile."""
    if sent is None and not context.weights_due():  # weights held, and checked less than refresh seconds ago
        return context.weights_version
    poll = 0.01
    while True:
        fetched = sent.result() if sent is not None else store.fetch_if_newer(context.weights_version)
        sent = None
        context.weights_checked_at = time.monotonic()
        if fetched is not None:
            version, state_dict = fetched
            context.policy.load_state_dict(state_dict)
            context.weights_version = version
        if context.weights_version is not None:
            return context.weights_version
        if is_stopped():
            raise RunStoppedError(f"run {context.keys.run_name!r} stopped before any weights were broadcast")
        if shutdown_requested():
            return None
        beat()
        time.sleep(poll)
        poll = min(poll * 2, 0.5)


class _ShutdownWhileFull(Exception):
    """The worker is shutting down and the queue stayed full: the job hands its group back undelivered."""


def run_actor_group(run_name: str, group_id: int, rollout_id: int) -> dict[str, Any]:
    """RQ job: run rollouts of one actor group and push them to the run's out-of-sync queue."""
    return ActorGroupJob(run_name, group_id, rollout_id).run()


class ActorGroupJob(GroupJob):
    """One slice of one actor group: rollouts pushed to the out-of-sync queue until the group has to move."""

    group_kind = "actor group"

    def __init__(self, run_name: str, group_id: int, rollout_id: int):
        super().__init__(run_name, group_id, rollout_id)
        self.first_rollout = rollout_id
        self.refused: set[int] = set()
        """Actors whose last rollout here was already delivered by an earlier job."""
        self.in_flight: tuple[list[SentPush], list[tuple[PendingRollout, list[int]]], int] | None = None
        """The last rollout's push, sent but not yet confirmed: its reply is read after the next rollout is stepped,
        so the worker does not idle waiting for Redis (one entry per rollout: the common case)."""
        self.queue_was_full = False
        """The last push waited for room in the queue, or left too little for another rollout: the next rollout's
        entries are pushed (room asked for first), not sent ahead."""
        self.weights_check: SentFetch | None = None
        """Sent after a rollout, read before the next one."""
        self.delivered_next = rollout_id
        """The rollout after the last one the queue took (or refused as delivered already)."""
        self.times = WorkerTimes()
        """Where the time went since the last rollout was counted (published with the worker's steps/s)."""
        self.shutdown_waiting_since: float | None = None
        """When a wait for room first found the worker shutting down (see _wait_for_room)."""

    def check_arguments(self) -> None:
        kind = self.config.extra.get("kind")
        if kind is not None:
            raise ForbiddenJobError(f"refusing an actor-group job for run {self.run_name!r}, a {kind} run")
        check_group_arguments(self.config, self.group_id, self.position, least=0, what="rollout")

    def counts(self) -> dict[str, Any]:
        return {"rollouts": self.position - self.first_rollout}

    def enqueue_continuation(self, holder: str) -> None:
        enqueue_group(self.connection, self.config, self.group_id, self.position, holder=holder)

    def forget_group(self) -> None:
        context = CONTEXTS.peek(self.run_name)
        dropped = context.groups.pop(self.group_id, None) if context is not None else None
        if dropped is not None:
            dropped.close()

    def forget_run(self) -> None:
        CONTEXTS.drop(self.run_name)

    def failure_fields(self, error: BaseException) -> dict[str, Any]:
        groups = self._config.actor_groups if self._config is not None else []
        actor_ids = groups[self.group_id] if 0 <= self.group_id < len(groups) else []
        return {"actor_ids": actor_ids, "rollout_id": self.position}

    def work(self) -> dict[str, Any]:
        # the lease first: unpickling and building envs can take a while, and the reaper must not mistake a job
        # that is still starting for a dead one
        lease = self.take_lease()
        self.context = context = load_context(self.connection, self.run_name)
        self.config = config = context.config
        self.position = self.first_rollout = self.delivered_next = start_rollout(
            self.keys, self.group_id, self.position, recorded_progress(self.connection, self.keys, self.group_id))
        self.group = _build_group(context, self.group_id)
        self.act = context.act_for(self.group)
        fit_again(self.connection, self.keys)
        self.store = WeightStore(self.connection, self.keys, context.weights_key, config.weights_ttl_seconds)
        self.queue = TrajectoryQueue(self.connection, self.keys, config.queue_entries,
                                     marker_grace_seconds=2 * config.lease_seconds)
        self.send_ahead = _send_ahead_limit(self.connection)
        self.slice = JobSlice(self.connection, config)
        self.is_stopped = StopCheck(self.connection, self.keys, self.job.id)
        self.label, self.fence = worker_label(), (self.keys.lease(self.group_id), lease.holder)
        try:
            return self._rollouts()
        finally:
            if self.in_flight is not None:  # the job ends before it needed the outcome (stopped, failed, lost)
                for sent in self.in_flight[0]:
                    sent.abandon()
            if self.weights_check is not None:
                self.weights_check.abandon()

    def _rollouts(self) -> dict[str, Any]:
        """Rollouts under the latest weights until the run stops or the group has to move."""
        while True:
            started = time.perf_counter()
            weights_version = _wait_for_weights(self.context, self.store, self.is_stopped, self.beat,
                                                self.weights_check)
            self.times.weights += time.perf_counter() - started
            self.weights_check = None
            if self.is_stopped():
                return {**self.counts(), "stopped": True}
            if weights_version is None:  # shut down before any weights came (so before any push): hand it back
                self.continue_later()
                return {**self.counts(), "stopped": False}
            yield_now = self.slice.should_yield()
            try:
                self._rollout(weights_version, yield_now)
            except _ShutdownWhileFull:  # the learner makes no room: hand back what the queue did not take
                self.position = self.delivered_next
                self.continue_later()
                return {**self.counts(), "stopped": False, "undelivered": True}
            if yield_now:
                self.continue_later()
                return {**self.counts(), "stopped": False}

    def _rollout(self, weights_version: int, cut: bool) -> None:
        """Step one rollout of the group and send its entries; ``cut``: the last one of this job."""
        started = time.perf_counter()
        rollout = self.group.run_group(self.act, self.position, weights_version, cut_at_end=cut, worker=self.label)
        stepping = time.perf_counter() - started
        self._settle()
        if not cut and self.context.weights_due():  # the next rollout's weights, asked after any wait for room in
            # the queue: the reply is read once this push is on its way
            self.weights_check = self.store.send_fetch(self.context.weights_version)
        # a re-run recomputes rollouts an earlier job delivered; the first new one does not continue the delivered
        # one before it, and says so
        continues = [rollout.continues_previous and actor not in self.refused for actor in rollout.actor_ids]
        encoding = time.perf_counter()
        entries = _group_entries(rollout, continues, self.group_id, self.config.run_id, self.context.records_key)
        encoding = time.perf_counter() - encoding
        self.queue.bound = self.config.entries_bound(len(entries[0][1]))
        # the last rollout of a job is pushed, not left in flight; and while the queue is full, sending ahead would
        # move payloads to Redis only to have them refused and sent again (with a learner slower than its worker,
        # 1.7-1.95x the bytes it popped): ``push`` asks for room first, and the worker waits for the learner anyway
        sent = [] if cut or self.queue_was_full else self._send(entries)
        self.position += 1
        if len(sent) == len(entries):
            self.in_flight = (sent, entries, self.position)
        else:  # some entry could not be sent ahead: push the others, then settle those sent
            try:
                report = self.queue.push([entry for entry, _ in entries[len(sent):]], self.is_stopped,
                                         on_wait=self._wait_for_room, token=self.token, lease=self.fence)
                if sent:
                    report = _combined([report, *self._finish(sent)])
            except BaseException:  # stopped, the lease lost, or handed back: close what was not read
                for push in sent:
                    push.abandon()
                raise
            self._delivered(entries, report, self.position)
            if report.waited_seconds > 0 and self.weights_check is not None:  # the check predates the wait for
                self.weights_check.abandon()  # room, during which the learner may have published: ask afresh
                self.weights_check = None
        # the rest of the rollout's time went on its pushes (those it sent and the last one's, settled), less the
        # waits for room, which _delivered moved from push to room
        self.times.step += stepping
        self.times.encode += encoding
        self.times.push += time.perf_counter() - started - stepping - encoding
        self.slice.heartbeat(len(rollout.actor_ids) * self.config.n_rollout_steps, self.times)
        self.times = WorkerTimes()

    def beat(self) -> None:
        """Keep RQ's heartbeats and the group's lease alive while the job waits."""
        self.slice.heartbeat()
        if self.lease is not None:
            self.lease.touch()

    def _wait_for_room(self) -> None:
        """A push's wait for room in a full queue (every 0.2 s): beat; once the run's shutdown_push seconds have
        passed since a wait first found the worker shutting down, _ShutdownWhileFull (a learner gone or hung never
        makes room, and the worker must exit within its stop grace period)."""
        self.beat()
        if not shutdown_requested():
            return
        now = time.monotonic()
        if self.shutdown_waiting_since is None:
            self.shutdown_waiting_since = now
        elif now - self.shutdown_waiting_since >= (patience := self.config.timings.shutdown_push):
            log.warning("worker %s: shutting down, and run %s's queue stayed full for %.0f s: handing actor group %d "
                        "back from rollout %d, undelivered", self.label, self.run_name, patience, self.group_id,
                        self.delivered_next)
            raise _ShutdownWhileFull

    def _delivered(self, entries: list[tuple[PendingRollout, list[int]]], report: PushReport,
                   next_rollout_id: int) -> None:
        """Note the actors whose rollout an earlier job had delivered already, and the group's progress."""
        self.times.room += report.waited_seconds  # spent inside a push: moved from its time to room
        self.times.push -= report.waited_seconds
        duplicates = {entry.stream_id for entry in report.duplicates}
        self.refused = {actor for entry, actors in entries if entry.stream_id in duplicates for actor in actors}
        self.delivered_next = next_rollout_id
        # a push that waited, or left no room for another rollout's entries, says the learner is the bottleneck
        self.queue_was_full = report.waited_seconds > 0 or (report.room_left is not None
                                                             and report.room_left < len(entries))
        if self.lease is not None:
            self.lease.record_progress(next_rollout_id)

    def _send(self, entries: list[tuple[PendingRollout, list[int]]]) -> list[SentPush]:
        """Send the entries' pushes without waiting for the replies, so the next rollout steps meanwhile (a
        group's entries go each on a connection of its own, at most ``send_ahead`` of them); the first ones
        sent, up to one that could not be."""
        sent = []
        for entry, _ in entries[:self.send_ahead]:
            push = self.queue.send(entry, self.token, self.fence)
            if push is None:
                break
            sent.append(push)
        return sent

    def _finish(self, sent: list[SentPush]) -> list[PushReport]:
        """The outcome of each push sent ahead (pushing again what the queue was full for or lost the reply of)."""
        return [self.queue.finish(push, self.is_stopped, on_wait=self._wait_for_room) for push in sent]

    def _settle(self) -> None:
        """Confirm the in-flight pushes (pushing again what the queue was full for or lost the reply of)."""
        if self.in_flight is not None:
            sent, sent_entries, next_rollout_id = self.in_flight
            self.in_flight = None
            try:
                reports = self._finish(sent)
            except BaseException:
                for push in sent:  # those not read yet: close their connections
                    push.abandon()
                raise
            self._delivered(sent_entries, _combined(reports), next_rollout_id)


def _combined(reports: list[PushReport]) -> PushReport:
    """One report of several pushes: the seconds they waited, every duplicate, and the least room any left."""
    rooms = [report.room_left for report in reports if report.room_left is not None]
    return PushReport(sum(report.waited_seconds for report in reports),
                      tuple(duplicate for report in reports for duplicate in report.duplicates),
                      min(rooms) if rooms else None)


MAX_SENT_AHEAD = 64
"""Most entries of one rollout sent ahead, each holding a connection until its reply is read: a larger group (many
envs of images: 224 envs of 84x84 random frames made 100 entries a rollout) pushes the rest in turn."""


def _send_ahead_limit(connection: redis.Redis) -> int:
    """Entries sent ahead at most: MAX_SENT_AHEAD, and half the connection pool (redis-py's default holds 100) so
    that the pushes, weight fetches and lease beats that follow always find a connection."""
    pool_size = connection.connection_pool.max_connections or 2 * MAX_SENT_AHEAD
    return max(1, min(MAX_SENT_AHEAD, pool_size // 2))


def _group_entries(rollout: GroupRollout, continues: list[bool], group_id: int, run_id: str,
                   key: bytes) -> list[tuple[PendingRollout, list[int]]]:
    """A group's rollouts as queue entries of at most ENTRY_BYTES (whole rollouts; one if a rollout is larger),
    each on its part's stream, with the actors it holds; ``continues``: each actor's continues_previous. Each entry
    is encoded straight from the group's buffers."""
    size, actor_ids = records_per_entry(rollout.first_record), rollout.actor_ids
    starts = range(0, len(actor_ids), size)
    return [(PendingRollout(entry_stream(group_id, part), rollout.rollout_id, encode_signed_steps(
                rollout.steps.actors(start, start + size), actor_ids[start:start + size],
                continues[start:start + size], rollout.policy_version, rollout.rollout_id, rollout.worker, run_id,
                key)), actor_ids[start:start + size]) for part, start in enumerate(starts)]


def _build_group(context: RunContext, group_id: int) -> ActorGroup:
    """The run's envs of one actor group; WorkerUnfitError if their code does not import on this worker."""
    try:
        return context.group(group_id)
    except ImportError as error:
        raise WorkerUnfitError(
            f"this worker cannot build run {context.keys.run_name!r}'s envs ({type(error).__name__}: {error}); "
            f"install the env's package in this worker's environment (docs/service.md)"
        ) from error
