"""Inbox against a real Redis: what the learner accepts, rejects, hands over and acknowledges."""

from __future__ import annotations

import numpy as np

from rqrl.codec import records_key
from rqrl.inbox import Inbox
from rqrl.keys import RunKeys
from rqrl.records import RecordSpec, RolloutRecord, decode_signed_record, encode_signed_record
from rqrl.stats import EpochStatsAggregator, RolloutEvents
from rqrl.trajectories import TrajectoryQueue
from tests.factories import rollout_record

RUN_ID = "run-id-1"
KEY = records_key("inbox-secret", RUN_ID)
STEPS = 4


def signed(record: RolloutRecord, run_id: str = RUN_ID) -> bytes:
    """``record`` as a worker with the secret pushes it."""
    return encode_signed_record(record, run_id, records_key("inbox-secret", run_id))


def encoded(actor_id: int, rollout_id: int, run_id: str = RUN_ID, steps: int = STEPS) -> bytes:
    return signed(rollout_record(steps, obs=np.full((steps, 2), rollout_id), actor_id=actor_id,
                                 rollout_id=rollout_id, continues_previous=rollout_id > 0), run_id)


def decode(blob: bytes) -> RolloutRecord:
    return decode_signed_record(blob, RUN_ID, KEY)


def new_inbox(run_name: str, spec: RecordSpec | None = None, **options) -> Inbox:
    spec = spec or RecordSpec(n_steps=STEPS, n_actors=2)
    options.setdefault("max_rollout_gap", 100)
    inbox = Inbox(run_name, RUN_ID, spec, EpochStatsAggregator(), key=KEY, **options)
    inbox.published_version = 1  # the records of tests.factories.rollout_record are of version 1
    return inbox


def inbox_and_queue(connection, run_name: str, spec: RecordSpec | None = None,
                    **options) -> tuple[Inbox, TrajectoryQueue]:
    return new_inbox(run_name, spec, **options), TrajectoryQueue(connection, RunKeys(run_name), bound=100)


def ids(records: list[RolloutRecord]) -> list[tuple[int, int]]:
    return [(record.actor_id, record.rollout_id) for record in records]


def test_bad_entries_are_rejected_and_acknowledged_with_the_batch_around_them(connection, run_name):
    inbox, queue = inbox_and_queue(connection, run_name)
    keys = RunKeys(run_name)
    connection.rpush(keys.trajectories, encoded(0, 0), b"junk", encoded(1, 0), encoded(0, 0),
                     encoded(0, 1, run_id="another-run"), encoded(0, 1, steps=3), encoded(0, 1))
    popped = inbox.pop(queue, 10)
    assert (popped.size_before, popped.size_after, popped.first_index) == (7, 0, 0)
    assert len(inbox) == 3 and inbox.records_rejected == 4  # junk, a duplicate, a foreign run, a wrong length
    assert inbox.stats.get_stats_value(RolloutEvents.records_rejected, name="sum") == 4
    assert ids(inbox.peek(2)) == [(0, 0), (1, 0)]
    inbox.hand_over(2)
    assert inbox.done_below == 6, "everything before the last pending record is done, rejected entries included"
    inbox.pop(queue, 10)  # acknowledges below 6
    entries, first = queue.unacknowledged()
    assert first == 6 and [(r.actor_id, r.rollout_id) for r in map(decode, entries)] == [(0, 1)]
    assert (inbox.last_delivered(0), inbox.last_delivered(1)) == (1, 0)


def test_a_new_inbox_takes_over_what_the_last_one_did_not_hand_over(connection, run_name):
    first, queue = inbox_and_queue(connection, run_name)
    connection.rpush(RunKeys(run_name).trajectories, *[encoded(actor, 0) for actor in (0, 1)],
                     *[encoded(actor, 1) for actor in (0, 1)])
    first.pop(queue, 2)
    first.hand_over(2)
    first.pop(queue, 2)  # acknowledges the first two; the learner dies holding the next two
    second, _ = inbox_and_queue(connection, run_name)
    second.take_over(queue)
    assert ids(second.peek(10)) == [(0, 1), (1, 1)]
    assert (second.next_index, second.done_below) == (4, 2)


def test_an_episode_a_fault_cut_is_counted_once(connection, run_name):
    inbox, queue = inbox_and_queue(connection, run_name)
    # rollout 1 of actor 0 does not continue rollout 0, which ended inside an episode
    cut = signed(rollout_record(STEPS, actor_id=0, rollout_id=1, continues_previous=False))
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, 0), cut, encoded(0, 2))
    inbox.pop(queue, 3)
    assert inbox.stats.get_stats_value(RolloutEvents.episodes_cut, name="sum") == 1
