"""Inbox against a real Redis: what the learner accepts, rejects, hands over and acknowledges."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from rqrl.engine.codec import RECORD_MAGIC, records_key, sign, verified_view
from rqrl.engine.keys import RunKeys
from rqrl.engine.trajectories import TrajectoryQueue
from rqrl.maze.group_records import decode_group, encode_group, encode_signed_group
from rqrl.maze.inbox import Inbox
from rqrl.maze.records import RecordSpec, RolloutRecord, record_signature
from rqrl.maze.stats import EpochStatsAggregator, RolloutEvents
from tests.factories import rollout_record

RUN_ID = "run-id-1"
KEY = records_key("inbox-secret", RUN_ID)
STEPS = 4


def signed(record: RolloutRecord, run_id: str = RUN_ID) -> bytes:
    """``record`` as a worker with the secret pushes it."""
    return encode_signed_group([record], run_id, records_key("inbox-secret", run_id))


def encoded(actor_id: int, rollout_id: int, run_id: str = RUN_ID, steps: int = STEPS) -> bytes:
    return signed(rollout_record(steps, obs=np.full((steps, 2), rollout_id), actor_id=actor_id,
                                 rollout_id=rollout_id, continues_previous=rollout_id > 0), run_id)


def decode(blob: bytes) -> RolloutRecord:
    return decode_group(verified_view(blob, KEY, RECORD_MAGIC), RUN_ID)[0]


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


def test_a_pop_ahead_acknowledges_nothing_of_the_batch_in_hand(connection, run_name):
    """RunOptions.pop_ahead: the next batch is popped while the caller holds this one; a learner that dies then
    leaves both batches to the one that resumes the run."""
    first, queue = inbox_and_queue(connection, run_name)
    connection.rpush(RunKeys(run_name).trajectories, *[encoded(actor, rollout) for rollout in range(3)
                                                       for actor in (0, 1)])
    first.pop(queue, 2)
    first.hand_over(2)
    popped, decoded = first.pop_ahead(queue, 2)  # the caller holds rollouts 0; this acknowledges nothing of them
    assert len(first) == 0 and first.next_index == 2, "pop_ahead changed the inbox"
    first.receive(queue, popped, decoded)
    assert ids(first.peek(10)) == [(0, 1), (1, 1)]
    entries, index = queue.unacknowledged()
    assert index == 0 and [decode(entry).rollout_id for entry in entries] == [0, 0, 1, 1]
    second, _ = inbox_and_queue(connection, run_name)
    second.take_over(queue)
    assert ids(second.peek(10)) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    first.hand_over(2)  # the caller asked for the next batch: rollouts 0 are done, rollouts 1 in hand
    first.receive(queue, *first.pop_ahead(queue, 2))
    entries, index = queue.unacknowledged()
    assert index == 2 and [decode(entry).rollout_id for entry in entries] == [1, 1, 2, 2]


def test_what_a_lost_pop_ahead_moved_is_read_by_the_next_pop(connection, run_name):
    """A pop ahead whose result never reached the inbox (a Redis error, a Ctrl-C): its entries wait on the
    unacknowledged list, and the next pop reads them first, in order, with junk among them rejected."""
    inbox, queue = inbox_and_queue(connection, run_name)
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, 0), b"junk", encoded(1, 0), encoded(0, 1))
    inbox.pop_ahead(queue, 3)  # dropped
    inbox.pop(queue, 1)
    assert ids(inbox.peek(10)) == [(0, 0), (1, 0), (0, 1)]
    assert inbox.records_rejected == 1 and inbox.next_index == 4


def test_an_episode_a_fault_cut_is_counted_once(connection, run_name):
    inbox, queue = inbox_and_queue(connection, run_name)
    # rollout 1 of actor 0 does not continue rollout 0, which ended inside an episode
    cut = signed(rollout_record(STEPS, actor_id=0, rollout_id=1, continues_previous=False))
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, 0), cut, encoded(0, 2))
    inbox.pop(queue, 3)
    assert inbox.stats.get_stats_value(RolloutEvents.episodes_cut, name="sum") == 1


# --- records tagged with the run's key that do not fit the run (a buggy worker; defence in depth) ----------


def bad(actor_id: int, rollout_id: int, **changes) -> bytes:
    """A tagged record of ``actor_id``/``rollout_id`` with ``changes`` to its fields."""
    record = rollout_record(STEPS, actor_id=actor_id, rollout_id=rollout_id)
    return signed(dataclasses.replace(record, **changes))


def probed_spec() -> RecordSpec:
    return RecordSpec(n_steps=STEPS, n_actors=2, signature=record_signature(rollout_record(STEPS)),
                      action_bounds=(0, 2))


def test_a_float64_record_first_pins_nothing(connection, run_name):
    for spec in (probed_spec(), None):  # with the learner's probe, and without one (the first accepted sets it)
        connection.flushall()
        inbox, queue = inbox_and_queue(connection, run_name, spec)
        float64 = bad(0, 0, obs=np.zeros((STEPS, 2)), next_obs=np.zeros(2), final_obs=np.zeros((0, 2)),
                      rewards=np.full(STEPS, np.nan))
        connection.rpush(RunKeys(run_name).trajectories, float64, encoded(0, 0), encoded(1, 0), encoded(0, 1))
        inbox.pop(queue, 10)
        assert ids(inbox.peek(10)) == [(0, 0), (1, 0), (0, 1)]
        assert inbox.rejected_by_reason == {"invalid": 1}


def test_an_absurd_rollout_id_is_refused_and_does_not_block_the_actor(connection, run_name):
    inbox, queue = inbox_and_queue(connection, run_name, max_rollout_gap=10)
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, 10**9), encoded(0, 0), encoded(1, 11), encoded(1, 0),
                     encoded(0, 1), encoded(0, 11))
    inbox.pop(queue, 10)
    assert ids(inbox.peek(10)) == [(0, 0), (1, 0), (0, 1), (0, 11)]  # 11 = 1 + 10: at the bound
    assert inbox.rejected_by_reason == {"invalid": 2}
    assert (inbox.last_delivered(0), inbox.last_delivered(1)) == (11, 0)


def test_refused_records_of_an_actor_move_its_id_bound_along(connection, run_name):
    """A worker whose rollouts are refused for a while (NaN log-probs, say) is not locked out afterwards."""
    inbox, queue = inbox_and_queue(connection, run_name, max_rollout_gap=3)
    refused = [bad(0, rollout, log_probs=np.full(STEPS, np.nan, np.float32)) for rollout in range(10)]
    connection.rpush(RunKeys(run_name).trajectories, *refused, encoded(0, 10))
    inbox.pop(queue, 20)
    assert ids(inbox.peek(10)) == [(0, 10)] and inbox.rejected_by_reason == {"invalid": 10}


def test_a_resumed_inbox_takes_each_actors_first_id_as_its_base(connection, run_name):
    first, queue = inbox_and_queue(connection, run_name)
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, 5000), encoded(1, 7000))
    first.pop(queue, 2)  # the learner dies holding them
    resumed = new_inbox(run_name, resumed=True)
    resumed.take_over(queue)
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, 10**9), encoded(0, 5001))
    resumed.pop(queue, 10)
    assert ids(resumed.peek(10)) == [(0, 5000), (1, 7000), (0, 5001)]
    assert resumed.rejected_by_reason == {"invalid": 1}


def test_records_of_versions_the_learner_has_not_published_are_refused(connection, run_name):
    inbox, queue = inbox_and_queue(connection, run_name)
    connection.rpush(RunKeys(run_name).trajectories, bad(0, 0, policy_version=2), bad(0, 1, policy_version=2**63),
                     bad(1, 0, policy_version=1))
    inbox.pop(queue, 10)
    assert ids(inbox.peek(10)) == [(1, 0)] and inbox.rejected_by_reason == {"invalid": 2}
    inbox.published_version = 2
    connection.rpush(RunKeys(run_name).trajectories, bad(0, 2, policy_version=2))
    inbox.pop(queue, 10)
    assert ids(inbox.peek(10)) == [(1, 0), (0, 2)]


def test_rejections_are_counted_by_reason_and_logged_at_a_bounded_rate(connection, run_name, caplog, monkeypatch):
    inbox, queue = inbox_and_queue(connection, run_name)
    keys = RunKeys(run_name)
    unsigned = encode_group([rollout_record(STEPS)], RUN_ID)
    connection.rpush(keys.trajectories, *[unsigned] * 30, signed_garbage(), encoded(0, 0), encoded(0, 0),
                     bad(1, 0, rewards=np.full(STEPS, np.inf, np.float32)))
    with caplog.at_level(logging.WARNING, logger="rqrl.maze.inbox"):
        inbox.pop(queue, 100)
        assert inbox.rejected_by_reason == {"unauthenticated": 30, "malformed": 1, "duplicate": 1, "invalid": 1}
        assert inbox.records_rejected == 33 and inbox.stats.get_stats_value(RolloutEvents.records_rejected,
                                                                            name="sum") == 33
        assert len(caplog.messages) == 1 and "unauthenticated" in caplog.messages[0]
        monkeypatch.setattr(inbox._rejections_log, "interval", 0.0)
        connection.rpush(keys.trajectories, unsigned)
        inbox.pop(queue, 100)
    assert len(caplog.messages) == 2 and "(32 more since the last message)" in caplog.messages[1]


def signed_garbage() -> bytes:
    """Bytes tagged with the run's key that are no record (a worker bug, not an attacker)."""
    return sign(b"not a safetensors buffer", KEY, RECORD_MAGIC)


def test_a_negative_rollout_id_moves_no_bound(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=100)
    inbox = new_inbox(run_name, resumed=True)
    connection.rpush(RunKeys(run_name).trajectories, encoded(0, -5), encoded(0, 5000))
    inbox.pop(queue, 10)
    assert ids(inbox.peek(10)) == [(0, 5000)] and inbox.rejected_by_reason == {"invalid": 1}


def test_a_gap_in_an_actors_rollout_ids_is_counted_and_the_rollout_after_it_continues_nothing(run_name):
    inbox = new_inbox(run_name)
    inbox.accept([encoded(0, 0), encoded(0, 1), encoded(0, 4), encoded(0, 5)], first_index=0)
    records = inbox.peek(4)
    assert ids(records) == [(0, 0), (0, 1), (0, 4), (0, 5)]
    assert inbox.rollouts_lost == 2
    assert inbox.stats.get_stats_value(RolloutEvents.rollouts_lost, name="sum") == 2
    assert [record.continues_previous for record in records] == [False, True, False, True]


def test_an_actor_whose_tagged_rollouts_keep_arriving_past_the_bound_is_followed_after_three(run_name):
    """A forged progress makes a worker with the secret carry on from a far rollout id: the first
    tagged records past the bound are refused, then the actor's base follows them and the skip is
    counted as lost, so the actor is not starved for good."""
    inbox = new_inbox(run_name, max_rollout_gap=100)
    inbox.accept([encoded(0, 0), encoded(0, 1)], first_index=0)
    inbox.accept([encoded(0, 10_000 + step) for step in range(4)], first_index=2)
    assert ids(inbox.peek(10)) == [(0, 0), (0, 1), (0, 10_002), (0, 10_003)]
    assert inbox.rejected_by_reason["invalid"] == 2
    assert inbox.rollouts_lost == 10_000


def test_a_single_far_rollout_between_real_ones_stays_refused(run_name):
    inbox = new_inbox(run_name, max_rollout_gap=100)
    inbox.accept([encoded(0, 0), encoded(0, 10_000), encoded(0, 1), encoded(0, 10_001), encoded(0, 2)], first_index=0)
    assert ids(inbox.peek(10)) == [(0, 0), (0, 1), (0, 2)]
    assert inbox.rejected_by_reason["invalid"] == 2 and inbox.rollouts_lost == 0
