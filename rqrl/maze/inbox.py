"""The learner's side of the out-of-sync queue: what it popped, checked, in order, and acknowledged.

Every entry the learner pops sits on the run's unacknowledged list (see rqrl.engine.trajectories) at an
absolute index. The inbox checks each entry's tag under the run's records key before it parses
anything, then decodes it (never unpickling) and checks every field against the run (see
``Inbox.accept``); what fails is rejected, counted by reason and logged, never raised, and changes
nothing about what is accepted later. An entry holds one rollout or an actor group's rollouts of one
rollout id (``rqrl.maze.group_records``), which share its index. It keeps the good records in order until a
batch takes them, and acknowledges with its next pop everything below the first record not yet handed
over: a group's entry stays unacknowledged until every one of its rollouts has been handed over.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter

import gymnasium

from rqrl.engine.bounded_log import BoundedLog
from rqrl.engine.codec import MAX_ID
from rqrl.engine.policy import ActFunction
from rqrl.engine.trajectories import Popped, TrajectoryQueue
from rqrl.errors import RecordError, SignatureError
from rqrl.maze.group_records import DecodedEntry, decode_signed_entry
from rqrl.maze.records import RecordSpec, RolloutRecord, record_signature
from rqrl.maze.rollout import ActorGroup
from rqrl.maze.stats import EpochStatsAggregator, RolloutEvents

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 5.0
REBASE_AFTER = 3  # tagged records in a row past the rollout-id bound before an actor's base follows them
"""At most one rejection warning per this many seconds; the next one says how many went unlogged."""

Decoded = DecodedEntry | SignatureError | RecordError
"""A popped entry, decoded, or the error that rejects it."""

REJECTION_REASONS = ("unauthenticated", "malformed", "invalid", "duplicate")
"""Why entries are rejected: no valid tag under the run's records key; tagged but undecodable; a field that
does not fit the run (``Inbox.accept``); a rollout id that was delivered already."""


def probe_spec(env: gymnasium.Env, act: ActFunction, n_steps: int, n_actors: int) -> RecordSpec:
    """The run's RecordSpec from the learner's own env and policy: one step of ``env`` laid out as workers lay out
    their rollouts, so records are checked against what the learner expects, not against the first one that
    arrives. If the probe step fails, the spec has no signature (the first record accepted sets it)."""
    space = env.action_space
    bounds = (int(space.start), int(space.start + space.n)) if isinstance(space, gymnasium.spaces.Discrete) else None
    try:
        record = ActorGroup(lambda: env, [0], [0], [0], 1).run(act, 0, 0, cut_at_end=True)[0]
    except Exception as error:  # the env or policy's own errors show on the workers, with their traceback
        log.info("could not probe the run's record layout (%s: %s); the first record accepted sets it",
                 type(error).__name__, error)
        return RecordSpec(n_steps=n_steps, n_actors=n_actors, action_bounds=bounds)
    return RecordSpec(n_steps=n_steps, n_actors=n_actors, signature=record_signature(record), action_bounds=bounds)


class Inbox:
    """Records popped for one run and not yet handed to the learner's caller.

    ``key`` is the run's records key (``rqrl.engine.codec.records_key``); ``spec`` what every record must look
    like (the learner's probe fills in its signature; without one the first record accepted sets it);
    ``max_rollout_gap`` how far past an actor's last rollout seen a rollout id may be. ``resumed`` is for
    a learner taking over a run whose rollout ids it does not know: each actor's first record sets its
    base (a new run's actors start at rollout 0). ``published_version`` is the newest weights version the
    learner published (records of later versions are refused); the learner moves it as it publishes.
    """

    def __init__(self, run_name: str, run_id: str, spec: RecordSpec, stats: EpochStatsAggregator, *, key: bytes,
                 max_rollout_gap: int, resumed: bool = False):
        self.run_name = run_name
        self.run_id = run_id
        self.spec = spec
        self.stats = stats
        self.key = key
        self.max_rollout_gap = max_rollout_gap
        self.published_version = 0
        self.records_rejected = 0
        self.records_per_entry: int | None = None  # the most rollouts an entry held so far (None: none read yet)
        self.rollouts_lost = 0  # rollout ids an actor's stream skipped (see _mark_gap)
        self._beyond_bound: dict[int, int] = {}  # actor -> tagged records in a row past the rollout-id bound
        self.rejected_by_reason: Counter[str] = Counter()
        self._pending: list[RolloutRecord] = []
        self._pending_indices: list[int] = []  # absolute index of each pending record on the unacknowledged list
        self.next_index = 0  # absolute index of the next unacknowledged entry not read yet
        self.done_below = 0  # entries below this index are handed over or rejected: acknowledged at the next pop
        self.held_from = 0  # the first index of the batch the caller holds: a pop made before it asks for the next
        # batch (pop_ahead) acknowledges only below it
        self._last_rollout: dict[int, int] = {}
        # actor id -> highest rollout id of a tagged, in-bounds record, accepted or not: the base of the id bound
        self._last_seen: dict[int, int] = {} if resumed else dict.fromkeys(range(spec.n_actors), -1)
        self._ended_mid_episode: dict[int, bool] = {}  # actor id -> its last rollout ended inside an episode
        self._rejections_log = BoundedLog(log, LOG_INTERVAL_SECONDS)

    def __len__(self) -> int:
        return len(self._pending)

    def last_delivered(self, actor_id: int) -> int:
        """The highest rollout id of ``actor_id`` accepted so far (-1: none)."""
        return self._last_rollout.get(actor_id, -1)

    def pop(self, queue: TrajectoryQueue, count: int) -> Popped:
        """Acknowledge what the learner is done with, pop up to ``count`` rollouts and accept them,
        first reading any entries a retried pop left unseen on the unacknowledged list."""
        popped = queue.pop(count, self.done_below)
        self.receive(queue, popped, self.decode(popped.entries))
        return popped

    def pop_ahead(self, queue: TrajectoryQueue, count: int) -> tuple[Popped, list[Decoded]]:
        """Pop up to ``count`` rollouts while the caller still holds its batch (acknowledging only what came before
        it) and decode them; touches nothing here, so it may run on another thread. ``receive`` takes the result."""
        popped = queue.pop(count, self.held_from)
        return popped, self.decode(popped.entries)

    def decode(self, blobs: list[bytes]) -> list[Decoded]:
        """Each entry's rollouts, or the error that rejects it (a SignatureError: not tagged under the run's key)."""
        decoded: list[Decoded] = []
        for blob in blobs:
            try:
                decoded.append(decode_signed_entry(blob, self.run_id, self.key, self.spec))
            except (SignatureError, RecordError) as error:
                decoded.append(error)
        return decoded

    def receive(self, queue: TrajectoryQueue, popped: Popped, decoded: list[Decoded]) -> None:
        """Accept what a pop took (``decoded``: its entries, decoded), first reading any entries a retried pop
        left unseen on the unacknowledged list."""
        self._note_oversized(popped.oversized, queue.max_entry_bytes)
        if popped.first_index > self.next_index:  # a pop whose reply was lost
            missed, first = queue.unacknowledged(self.next_index, popped.first_index - 1)
            self.accept(missed, first)
        self.accept_decoded(decoded, popped.first_index)

    def take_over(self, queue: TrajectoryQueue) -> None:
        """A resumed run: what the previous learner popped but did not finish with comes first."""
        entries, first = queue.unacknowledged()
        self.next_index = self.done_below = self.held_from = first
        self._last_seen = {}  # the previous learner's rollout ids are unknown here: each actor's first sets its base
        if entries:
            log.warning("run %s: re-delivering %d rollout(s) the previous learner popped but did not finish with",
                        self.run_name, len(entries))
        self.accept(entries, first)

    def peek(self, count: int) -> list[RolloutRecord]:
        """The next ``count`` records (fewer if fewer are pending), still held here."""
        return self._pending[:count]

    def hand_over(self, count: int) -> None:
        """The first ``count`` records are the caller's now: acknowledged with the next pop."""
        self.held_from = self.done_below
        self._pending = self._pending[count:]
        self._pending_indices = self._pending_indices[count:]
        self.done_below = self._pending_indices[0] if self._pending_indices else self.next_index

    def restart_indices(self) -> None:
        """Redis lost the unacknowledged list: indices restart at 0. Pending records keep index 0, so
        nothing popped after them is acknowledged before they are handed over."""
        self._pending_indices = [0] * len(self._pending)
        self.next_index = self.done_below = self.held_from = 0

    def accept(self, blobs: list[bytes], first_index: int) -> None:
        """Check and decode entries popped onto the unacknowledged list from ``first_index`` on (see
        ``accept_decoded``)."""
        self.accept_decoded(self.decode(blobs), first_index)

    def accept_decoded(self, entries: list[Decoded], first_index: int) -> None:
        """Take decoded entries popped onto the unacknowledged list from ``first_index`` on; reject (count, log,
        never raise) what is not tagged under the run's key, malformed, does not fit the run or was delivered
        already."""
        self.next_index = max(self.next_index, first_index + len(entries))
        for index, entry in enumerate(entries, start=first_index):
            if isinstance(entry, SignatureError):
                self._reject("unauthenticated", entry)
                continue
            if isinstance(entry, RecordError):
                self._reject("malformed", entry)
                continue
            self.records_per_entry = max(self.records_per_entry or 0, len(entry.records))
            for record in entry.records:  # one, or an actor group's: they share the entry's index
                reason, problem = self._check(record, entry.problem)
                if problem is not None:
                    self._reject(reason, problem)
                    continue
                record = self._mark_gap(record)
                self._last_rollout[record.actor_id] = record.rollout_id
                self._note_unmarked_cut(record)
                self._pending.append(record)
                self._pending_indices.append(index)

    def _check(self, record: RolloutRecord, content: RecordError | None) -> tuple[str, RecordError | None]:
        """("", None) for a record that fits the run, else the reason and the error naming the field; ``content``
        is what ``decode_signed_entry`` found wrong with the entry's arrays (None: nothing). A tagged record within
        the id bound moves its actor's base even when refused: a worker whose rollouts are refused for a while
        must not push later ones out of bounds."""
        actor, rollout = record.actor_id, record.rollout_id
        if 0 <= actor < self.spec.n_actors and 0 <= rollout < MAX_ID:  # else check_record refuses it
            seen = max(self._last_seen.get(actor, rollout - 1), self.last_delivered(actor))
            if rollout > seen + self.max_rollout_gap:
                self._beyond_bound[actor] = self._beyond_bound.get(actor, 0) + 1
                if self._beyond_bound[actor] < REBASE_AFTER:
                    return "invalid", RecordError(
                        f"rollout {rollout} of actor {actor} is more than {self.max_rollout_gap} past its last "
                        f"rollout seen ({seen}); was the group's progress in Redis tampered with?")
                # tagged records keep arriving from there: a worker with the secret made them (from a forged
                # progress, say); follow them, and the ids skipped are counted as lost, not refused forever
                log.warning("actor %d's rollouts jumped from %d to %d; following them (the skipped ids count as "
                            "rollouts_lost)", actor, seen, rollout)
            self._beyond_bound[actor] = 0
            self._last_seen[actor] = max(seen, rollout)
        if content is not None:
            return "invalid", content
        if rollout <= self.last_delivered(actor):
            return "duplicate", RecordError(f"rollout {rollout} of actor {actor} was delivered already")
        if record.policy_version > self.published_version:
            return "invalid", RecordError(
                f"rollout {rollout} of actor {actor} claims policy version {record.policy_version}, the learner has "
                f"published up to {self.published_version}")
        if self.spec.signature is None:  # no probe: the first record that passed every check sets the arrays
            self.spec = dataclasses.replace(self.spec, signature=record_signature(record))
        return "", None

    def _note_oversized(self, dropped: int, limit: int) -> None:
        """Count entries the pop dropped in Redis for their size (-1: this Redis user may not measure them)."""
        if dropped < 0:
            self._rejections_log.warning(
                "run %s: the learner's Redis user may not measure queue entries (MEMORY USAGE, SORT, LSET), so an "
                "oversized entry would be read whole; grant them (docs/redis-security.md)", self.run_name)
        for _ in range(max(dropped, 0)):
            self._reject("oversized", RecordError(f"an entry over {limit / 2**20:.0f} MB was dropped in Redis, unread"))

    def _reject(self, reason: str, error: Exception) -> None:
        self.records_rejected += 1
        self.rejected_by_reason[reason] += 1
        self.stats.add(RolloutEvents.records_rejected, 1)
        self._rejections_log.warning("rejected a queue entry of run %s (%s): %s", self.run_name, reason, error)

    def _mark_gap(self, record: RolloutRecord) -> RolloutRecord:
        """The last line against silent gaps: ids an actor's stream skipped were lost in Redis (the
        fenced re-run makes this rare). Count them; the rollout after them cannot continue an episode."""
        previous = self._last_rollout.get(record.actor_id)
        if previous is None or record.rollout_id <= previous + 1:
            return record
        lost = record.rollout_id - previous - 1
        self.rollouts_lost += lost
        self.stats.add(RolloutEvents.rollouts_lost, lost)
        log.warning("actor %d's rollouts %d..%d never arrived (lost in Redis): counted as rollouts_lost; rollout %d "
                    "starts afresh", record.actor_id, previous + 1, record.rollout_id - 1, record.rollout_id)
        return dataclasses.replace(record, continues_previous=False) if record.continues_previous else record

    def _note_unmarked_cut(self, record: RolloutRecord) -> None:
        """Count episodes a fault cut without a mark: the previous rollout ended mid-episode (its
        worker died), and this one does not continue it. The learner bootstraps from ``next_obs`` at
        every rollout end, so training treats the cut like a truncation either way."""
        if not record.continues_previous and self._ended_mid_episode.get(record.actor_id, False):
            self.stats.add(RolloutEvents.episodes_cut, 1)
            log.info("actor %d's episode was cut by a fault before rollout %d (its actors were re-run)",
                     record.actor_id, record.rollout_id)
        self._ended_mid_episode[record.actor_id] = not (record.terminated[-1] or record.truncated[-1])
