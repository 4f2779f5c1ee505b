"""The learner's side of the out-of-sync queue: what it popped, checked, in order, and acknowledged.

Every entry the learner pops sits on the run's unacknowledged list (see rqrl.trajectories) at an
absolute index. The inbox decodes and checks each entry (foreign, malformed or already delivered
ones are rejected and counted, never unpickled), keeps the good ones in order until a batch takes
them, and acknowledges with its next pop everything below the first record not yet handed over.
"""

from __future__ import annotations

import logging

from rqrl.errors import RecordError
from rqrl.records import RecordSignature, RolloutRecord, decode_record, differing_arrays, record_signature
from rqrl.stats import EpochStatsAggregator, RolloutEvents
from rqrl.trajectories import Popped, TrajectoryQueue

log = logging.getLogger(__name__)


class Inbox:
    """Records popped for one run and not yet handed to the learner's caller."""

    def __init__(self, run_name: str, run_id: str, n_actors: int, n_rollout_steps: int,
                 stats: EpochStatsAggregator):
        self.run_name = run_name
        self.run_id = run_id
        self.n_actors = n_actors
        self.n_rollout_steps = n_rollout_steps
        self.stats = stats
        self.records_rejected = 0
        self._pending: list[RolloutRecord] = []
        self._pending_indices: list[int] = []  # absolute index of each pending record on the unacknowledged list
        self.next_index = 0  # absolute index of the next unacknowledged entry not read yet
        self.done_below = 0  # entries below this index are handed over or rejected: acknowledged at the next pop
        self._last_rollout: dict[int, int] = {}
        self._ended_mid_episode: dict[int, bool] = {}  # actor id -> its last rollout ended inside an episode
        self._signature: RecordSignature | None = None

    def __len__(self) -> int:
        return len(self._pending)

    def last_delivered(self, actor_id: int) -> int:
        """The highest rollout id of ``actor_id`` accepted so far (-1: none)."""
        return self._last_rollout.get(actor_id, -1)

    def pop(self, queue: TrajectoryQueue, count: int) -> Popped:
        """Acknowledge what the learner is done with, pop up to ``count`` rollouts and accept them,
        first reading any entries a retried pop left unseen on the unacknowledged list."""
        popped = queue.pop(count, self.done_below)
        if popped.first_index > self.next_index:  # a pop whose reply was lost
            missed, first = queue.unacknowledged(self.next_index, popped.first_index - 1)
            self.accept(missed, first)
        self.accept(popped.entries, popped.first_index)
        return popped

    def take_over(self, queue: TrajectoryQueue) -> None:
        """A resumed run: what the previous learner popped but did not finish with comes first."""
        entries, first = queue.unacknowledged()
        self.next_index = self.done_below = first
        if entries:
            log.warning("run %s: re-delivering %d rollout(s) the previous learner popped but did not finish with",
                        self.run_name, len(entries))
        self.accept(entries, first)

    def peek(self, count: int) -> list[RolloutRecord]:
        """The next ``count`` records (fewer if fewer are pending), still held here."""
        return self._pending[:count]

    def hand_over(self, count: int) -> None:
        """The first ``count`` records are the caller's now: acknowledged with the next pop."""
        self._pending = self._pending[count:]
        self._pending_indices = self._pending_indices[count:]
        self.done_below = self._pending_indices[0] if self._pending_indices else self.next_index

    def restart_indices(self) -> None:
        """Redis lost the unacknowledged list: indices restart at 0. Pending records keep index 0, so
        nothing popped after them is acknowledged before they are handed over."""
        self._pending_indices = [0] * len(self._pending)
        self.next_index = self.done_below = 0

    def accept(self, blobs: list[bytes], first_index: int) -> None:
        """Decode entries popped onto the unacknowledged list from ``first_index`` on; reject (count and
        log, never raise) anything foreign or malformed."""
        self.next_index = max(self.next_index, first_index + len(blobs))
        for index, blob in enumerate(blobs, start=first_index):
            try:
                record = decode_record(blob, self.run_id)
                self._check_fits_run(record)
            except RecordError as error:
                self.records_rejected += 1
                self.stats.add(RolloutEvents.records_rejected, 1)
                log.warning("rejected a queue entry of run %s: %s", self.run_name, error)
                continue
            self._last_rollout[record.actor_id] = record.rollout_id
            self._note_unmarked_cut(record)
            self._pending.append(record)
            self._pending_indices.append(index)

    def _note_unmarked_cut(self, record: RolloutRecord) -> None:
        """Count episodes a fault cut without a mark: the previous rollout ended mid-episode (its
        worker died), and this one does not continue it. The learner bootstraps from ``next_obs`` at
        every rollout end, so training treats the cut like a truncation either way."""
        if not record.continues_previous and self._ended_mid_episode.get(record.actor_id, False):
            self.stats.add(RolloutEvents.episodes_cut, 1)
            log.info("actor %d's episode was cut by a fault before rollout %d (its actors were re-run)",
                     record.actor_id, record.rollout_id)
        self._ended_mid_episode[record.actor_id] = not (record.terminated[-1] or record.truncated[-1])

    def _check_fits_run(self, record: RolloutRecord) -> None:
        if record.n_steps != self.n_rollout_steps:
            raise RecordError(f"record has {record.n_steps} steps, this run's rollouts have {self.n_rollout_steps}")
        if not 0 <= record.actor_id < self.n_actors:
            raise RecordError(f"record names actor {record.actor_id}, this run has actors 0..{self.n_actors - 1}")
        if record.rollout_id <= self.last_delivered(record.actor_id):
            raise RecordError(f"rollout {record.rollout_id} of actor {record.actor_id} was delivered already")
        signature = record_signature(record)
        if self._signature is None:
            self._signature = signature
        elif signature != self._signature:
            different = differing_arrays(signature, self._signature)
            raise RecordError(f"record's arrays {different} differ in shape or dtype from this run's rollouts")
