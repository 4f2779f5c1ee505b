"""TrajectoryQueue against a real Redis: the bound, exactly-once delivery, waiting producers."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from rqrl.engine.keys import RunKeys
from rqrl.engine.trajectories import (
    MAX_ENTRY_BYTES,
    PendingRollout,
    QueueIndicesLost,
    QueuePush,
    TrajectoryQueue,
)
from rqrl.errors import ConfigError, LeaseLostError, RunStoppedError
from tests.polling import wait_until

PUSHED, FULL, DUPLICATE = QueuePush.PUSHED, QueuePush.FULL, QueuePush.DUPLICATE


def rollout(actor_id: int, rollout_id: int) -> PendingRollout:
    return PendingRollout(actor_id, rollout_id, f"a{actor_id}-r{rollout_id}".encode())


def never_stopped() -> bool:
    return False


def test_try_push_respects_the_bound(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=3)
    assert queue.try_push([rollout(0, 0), rollout(1, 0)]) == [QueuePush.PUSHED, QueuePush.PUSHED]
    assert queue.try_push([rollout(2, 0), rollout(3, 0), rollout(4, 0)]) == [PUSHED, FULL, FULL]
    assert queue.size() == 3
    assert queue.try_push([rollout(3, 0)]) == [QueuePush.FULL]
    assert connection.llen(RunKeys(run_name).trajectories) == 3


def test_a_full_push_leaves_no_marker_so_it_can_be_retried(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=1)
    assert queue.try_push([rollout(0, 0), rollout(1, 0)]) == [QueuePush.PUSHED, QueuePush.FULL]
    assert queue.pop_available(1) == [b"a0-r0"]
    assert queue.try_push([rollout(1, 0)]) == [QueuePush.PUSHED]
    assert queue.pop_available(5) == [b"a1-r0"]


def test_empty_try_push_does_nothing(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=2)
    assert queue.try_push([]) == []
    assert queue.size() == 0


def test_duplicates_are_delivered_once(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=10)
    assert queue.try_push([rollout(0, 5)]) == [QueuePush.PUSHED]
    assert queue.try_push([rollout(0, 5)]) == [QueuePush.DUPLICATE]
    assert queue.try_push([rollout(0, 6), rollout(0, 6), rollout(1, 5)]) == [PUSHED, DUPLICATE, PUSHED]
    assert queue.push([rollout(0, 5), rollout(1, 5)], never_stopped).duplicates == (rollout(0, 5), rollout(1, 5))
    assert queue.pop_available(10) == [b"a0-r5", b"a0-r6", b"a1-r5"]


def test_a_duplicate_stays_refused_after_the_original_was_consumed(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=2)
    queue.try_push([rollout(2, 9)])
    assert queue.pop_available(1) == [b"a2-r9"]
    assert queue.try_push([rollout(2, 9)]) == [QueuePush.DUPLICATE]
    assert queue.try_push([rollout(2, 3)]) == [QueuePush.DUPLICATE]  # older than what the actor already pushed
    assert queue.size() == 0
    assert connection.hgetall(keys.pushed_rollouts) == {b"2": b"9"}  # one field per actor, whatever the count


def test_a_duplicate_of_a_full_queue_is_not_waited_for(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=1)
    queue.try_push([rollout(0, 0)])
    started = time.monotonic()
    report = queue.push([rollout(0, 0)], never_stopped)
    assert report.waited_seconds == 0.0 and report.duplicates == (rollout(0, 0),)
    assert time.monotonic() - started < 0.5
    assert queue.size() == 1


def test_runs_have_separate_queues_and_markers(connection):
    first = TrajectoryQueue(connection, RunKeys("run-a"), bound=1)
    second = TrajectoryQueue(connection, RunKeys("run-b"), bound=1)
    assert first.try_push([rollout(0, 0)]) == [QueuePush.PUSHED]
    assert second.try_push([rollout(0, 0)]) == [QueuePush.PUSHED]
    assert first.pop_available(2) == second.pop_available(2) == [b"a0-r0"]


@pytest.mark.timeout(60)
def test_push_waits_while_full_and_completes_when_a_consumer_pops(connection, redis_url, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=2)
    queue.try_push([rollout(0, 0), rollout(1, 0)])
    popped: list[bytes] = []

    def consume() -> None:
        time.sleep(0.3)  # the point: the consumer comes late, so the push must wait for it
        with redis.Redis.from_url(redis_url) as consumer_connection:
            popped.extend(TrajectoryQueue(consumer_connection, keys, bound=2).pop_available(2))

    consumer = threading.Thread(target=consume)
    started = time.monotonic()
    consumer.start()
    waited = queue.push([rollout(0, 1), rollout(1, 1)], never_stopped).waited_seconds
    elapsed = time.monotonic() - started
    consumer.join(timeout=10)
    assert popped == [b"a0-r0", b"a1-r0"]
    assert elapsed >= 0.25 and waited > 0
    assert queue.pop_available(5) == [b"a0-r1", b"a1-r1"]


def test_push_into_room_does_not_wait(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=4)
    assert queue.push([rollout(0, 0), rollout(1, 0)], never_stopped).waited_seconds == 0.0
    assert queue.size() == 2


def test_push_says_how_much_room_it_left_when_it_read_the_queue_length(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=5)
    assert queue.push([rollout(0, 0), rollout(1, 0)], never_stopped).room_left == 3, "read before pushing two"
    assert queue.push([rollout(2, 0), rollout(3, 0), rollout(4, 0)], never_stopped).room_left == 0
    assert TrajectoryQueue(connection, RunKeys(run_name + "-other"), bound=5).push(
        [rollout(0, 0)], never_stopped).room_left is None, "one rollout goes without reading the length"


@pytest.mark.timeout(60)
def test_push_raises_when_the_run_stops_while_full(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=1)
    queue.try_push([rollout(0, 0)])
    stop = threading.Event()
    waits: list[float] = []
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(RunStoppedError, match=run_name):
        queue.push([rollout(1, 0)], stop.is_set, on_wait=lambda: waits.append(time.monotonic()))
    assert time.monotonic() - started < 5
    assert waits, "on_wait is called while waiting"
    assert queue.pop_available(5) == [b"a0-r0"]  # the waiting rollout was dropped


def test_pop_available(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=5)
    assert queue.pop_available(3) == []
    queue.try_push([rollout(i, 0) for i in range(4)])
    assert queue.pop_available(0) == [] and queue.pop_available(-1) == []
    assert queue.pop_available(3) == [b"a0-r0", b"a1-r0", b"a2-r0"]
    assert queue.pop_available(3) == [b"a3-r0"]
    assert queue.pop_available(3) == []


@pytest.mark.timeout(60)
def test_wait_until_not_empty(connection, redis_url, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=5)
    started = time.monotonic()
    assert queue.wait_until_not_empty(0.2) is False
    assert 0.15 <= time.monotonic() - started < 2

    def produce_later() -> None:
        time.sleep(0.2)  # the point: the rollout arrives while the learner waits
        with redis.Redis.from_url(redis_url) as producer_connection:
            TrajectoryQueue(producer_connection, keys, bound=5).try_push([rollout(2, 0)])

    producer = threading.Thread(target=produce_later)
    producer.start()
    assert queue.wait_until_not_empty(10) is True
    producer.join(timeout=10)
    assert queue.pop_available(5) == [b"a2-r0"]


@pytest.mark.timeout(60)
def test_stress_several_producers_one_consumer_never_exceed_the_bound(connection, redis_url, run_name):
    keys = RunKeys(run_name)
    bound, n_producers, per_producer = 5, 4, 40
    errors: list[BaseException] = []
    max_seen = 0
    stop_watching = threading.Event()

    def produce(actor_id: int) -> None:
        try:
            with redis.Redis.from_url(redis_url) as producer_connection:
                queue = TrajectoryQueue(producer_connection, keys, bound)
                for rollout_id in range(per_producer):
                    # every rollout twice: a retried command must not be delivered twice
                    queue.push([rollout(actor_id, rollout_id), rollout(actor_id, rollout_id)], never_stopped,
                               max_poll_seconds=0.005)
        except BaseException as error:  # noqa: B036 - reported to the main thread
            errors.append(error)

    def watch() -> None:
        nonlocal max_seen
        with redis.Redis.from_url(redis_url) as watcher_connection:
            while not stop_watching.is_set():
                max_seen = max(max_seen, watcher_connection.llen(keys.trajectories))

    producers = [threading.Thread(target=produce, args=(actor,), daemon=True) for actor in range(n_producers)]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for thread in producers:
        thread.start()
    consumer = TrajectoryQueue(connection, keys, bound)
    wait_until(lambda: consumer.size() >= bound, 45, interval=0.01, message=f"producers filling the queue to {bound}")
    received: list[bytes] = []

    def all_received() -> bool:
        nonlocal max_seen
        max_seen = max(max_seen, consumer.size())
        if consumer.wait_until_not_empty(0.5):
            received.extend(consumer.pop_available(1 + len(received) % 3))
        return len(received) >= n_producers * per_producer

    wait_until(all_received, 45, interval=0,
               message=lambda: f"all {n_producers * per_producer} rollouts; {len(received)} received")
    for thread in producers:
        thread.join(timeout=10)
    stop_watching.set()
    watcher.join(timeout=10)
    assert errors == []
    assert len(received) == n_producers * per_producer
    expected = {rollout(actor, rollout_id).payload
                for actor in range(n_producers) for rollout_id in range(per_producer)}
    assert set(received) == expected
    for actor in range(n_producers):  # each producer's rollouts arrive in order
        mine = [payload for payload in received if payload.startswith(f"a{actor}-".encode())]
        assert mine == [rollout(actor, rollout_id).payload for rollout_id in range(per_producer)]
    assert max_seen == bound
    assert consumer.size() == 0


def test_popped_rollouts_stay_unacknowledged_until_the_learner_is_done(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=5)
    queue.try_push([rollout(i, 0) for i in range(3)])
    first = queue.pop(2)
    assert (first.entries, first.first_index, first.size_before, first.size_after) == ([b"a0-r0", b"a1-r0"], 0, 3, 1)
    assert queue.unacknowledged() == ([b"a0-r0", b"a1-r0"], 0)
    second = queue.pop(5, done_below=2)  # done with the first batch
    assert (second.entries, second.first_index, second.head) == ([b"a2-r0"], 2, 2)
    assert queue.unacknowledged() == ([b"a2-r0"], 2)
    queue.pop(5, done_below=2)  # a retried acknowledgement drops nothing more
    assert queue.unacknowledged() == ([b"a2-r0"], 2)
    queue.pop(5, done_below=3)
    assert queue.unacknowledged() == ([], 3)
    assert connection.get(keys.acknowledged) == b"3"


def test_a_pop_whose_reply_was_lost_is_found_again_by_its_index(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=5)
    queue.try_push([rollout(i, 0) for i in range(3)])
    queue.pop(1)  # as if redis-py retried a pop: the first call ran but its reply never arrived
    again = queue.pop(1)
    assert again.first_index == 1 and again.entries == [b"a1-r0"]
    assert queue.unacknowledged(0, again.first_index - 1) == ([b"a0-r0"], 0)
    assert queue.unacknowledged(1) == ([b"a1-r0"], 1)


def test_a_retried_push_is_mine_and_a_recomputed_rollout_is_a_duplicate(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=10)
    assert queue.try_push([rollout(0, 0), rollout(1, 0)], token="job-a") == [QueuePush.PUSHED, QueuePush.PUSHED]
    # the same job's command again (redis-py retried it after a lost reply): not another job's rollout
    assert queue.try_push([rollout(0, 0), rollout(1, 0)], token="job-a") == [QueuePush.MINE, QueuePush.MINE]
    report = queue.push([rollout(0, 0)], never_stopped, token="job-a")
    assert report.duplicates == ()
    # a re-run job recomputing what job-a delivered
    assert queue.try_push([rollout(0, 0)], token="job-b") == [QueuePush.DUPLICATE]
    assert queue.push([rollout(1, 0)], never_stopped, token="job-b").duplicates == (rollout(1, 0),)
    assert queue.try_push([rollout(0, 1)], token="job-b") == [QueuePush.PUSHED]
    assert queue.try_push([rollout(0, 1)], token="job-a") == [QueuePush.DUPLICATE]
    assert queue.try_push([rollout(0, 0)], token="job-b") == [DUPLICATE]  # older than its highest: not a retry
    assert queue.size() == 3


def test_a_consumer_that_never_looks_back_keeps_one_pop_unacknowledged(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=10)
    queue.try_push([rollout(i, 0) for i in range(5)])
    assert queue.pop_available(2) == [b"a0-r0", b"a1-r0"]
    assert queue.pop_available(2) == [b"a2-r0", b"a3-r0"]
    assert queue.unacknowledged() == ([b"a2-r0", b"a3-r0"], 2)
    assert queue.unacknowledged(0, 1) == ([], 2)  # acknowledged already
    assert queue.pop_available(2) == [b"a4-r0"]
    assert queue.unacknowledged() == ([b"a4-r0"], 4)


def test_waiting_for_a_rollout_pops_nothing(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=5)
    assert queue.wait_until_not_empty(0.1) is False
    queue.try_push([rollout(0, 0), rollout(1, 0)])
    assert queue.wait_until_not_empty(0.1) is True
    assert queue.pop_available(5) == [b"a0-r0", b"a1-r0"]
    assert queue.unacknowledged() == ([b"a0-r0", b"a1-r0"], 0)


# ---- the lease fence and junk bookkeeping (issue 9) -------------------------------------------------------


def test_a_fenced_push_goes_through_only_while_the_pusher_holds_the_lease(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=10)
    lease = (keys.lease(0), "job-a#1")
    assert queue.try_push([rollout(0, 0)], lease=lease) == [QueuePush.NOT_HOLDER], "no lease at all (a restarted Redis)"
    connection.set(keys.lease(0), "job-a#1", px=5_000)
    assert queue.try_push([rollout(0, 0), rollout(1, 0)], lease=lease) == [QueuePush.PUSHED, QueuePush.PUSHED]
    connection.set(keys.lease(0), "job-a#2", px=5_000)  # the same job id, run again: another holder
    assert queue.try_push([rollout(0, 1)], lease=lease) == [QueuePush.NOT_HOLDER]
    with pytest.raises(LeaseLostError, match="no longer names job-a#1"):
        queue.push([rollout(0, 1)], never_stopped, lease=lease)
    assert queue.pop_available(10) == [b"a0-r0", b"a1-r0"], "a refused push leaves nothing behind"
    assert connection.hget(keys.pushed_rollouts, 0) == b"0", "nor a marker"


def test_a_marker_that_is_not_a_number_is_overwritten(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=10)
    connection.hset(keys.pushed_rollouts, "0", "abc")
    assert queue.try_push([rollout(0, 3)]) == [QueuePush.PUSHED]
    assert connection.hget(keys.pushed_rollouts, "0") == b"3"


@pytest.mark.parametrize("junk", ["abc", "-4", "1.5"])
def test_an_acknowledged_counter_that_is_no_index_resets_the_indices(connection, run_name, junk):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=10)
    queue.try_push([rollout(0, 0), rollout(0, 1)])
    queue.pop(1)
    connection.set(keys.acknowledged, junk)
    with pytest.raises(QueueIndicesLost, match=keys.acknowledged):
        queue.pop(1, done_below=1)
    assert connection.exists(keys.acknowledged, keys.unacknowledged) == 0
    popped = queue.pop(1)  # realigned: indices start at 0 again
    assert (popped.entries, popped.first_index) == ([b"a0-r1"], 0)
    connection.set(keys.acknowledged, junk)
    with pytest.raises(QueueIndicesLost):
        queue.unacknowledged()


def test_a_rollout_over_the_servers_value_limit_is_refused_before_pushing(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=10)
    assert queue._server_value_limit() == 512 * 2**20, "read from the server (proto-max-bulk-len)"
    assert queue._value_limit() == MAX_ENTRY_BYTES, "the learner's limit, when smaller"
    small = TrajectoryQueue(connection, RunKeys(run_name), bound=10, max_value_bytes=2 * 2**20)
    big = PendingRollout(0, 0, b"x" * (3 * 2**20))
    with pytest.raises(ConfigError, match=r"rollout 0 is 3.0 MB encoded, over the 2 MB .* shorter n_rollout_steps"):
        small.push([rollout(1, 0), big], never_stopped)
    assert small.size() == 0, "nothing of the batch is pushed"


def test_rollouts_over_the_value_limit_together_are_pushed_in_several_calls(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=10, max_value_bytes=10)
    report = queue.push([rollout(0, 0), rollout(1, 0), rollout(2, 0)], never_stopped)  # 5 bytes each
    assert report.duplicates == ()
    assert queue.pop_available(10) == [b"a0-r0", b"a1-r0", b"a2-r0"]


@pytest.mark.parametrize("junk", ["abc", "inf", "1e300", "99999999999999999999", "-1", "1.5"])
def test_an_acknowledged_counter_that_is_no_index_resets_the_list_instead_of_growing_it(connection, run_name, junk):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=5)
    queue.try_push([rollout(0, 0)])
    queue.pop(1)
    connection.set(keys.acknowledged, junk)
    with pytest.raises(QueueIndicesLost):
        queue.pop(1, done_below=1)
    assert not connection.exists(keys.acknowledged) and not connection.exists(keys.unacknowledged)
    queue.try_push([rollout(0, 1)])
    again = queue.pop(1)  # indices restart at 0 and the list is trimmed as before
    assert (again.entries, again.first_index) == ([b"a0-r1"], 0)
    queue.pop(0, done_below=1)
    assert connection.llen(keys.unacknowledged) == 0


def test_waiting_for_a_rollout_does_not_carry_it(connection, run_name):
    """The learner blocks on the doorbell, not the queue: a BLMOVE of the queue onto itself would send a
    whole rollout back to say one waits (measured with Redis's own output byte counter)."""
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=5)
    big = PendingRollout(0, 0, b"x" * 2**20)
    queue.try_push([big])
    sent_before = int(connection.info("stats")["total_net_output_bytes"])
    for _ in range(5):
        assert queue.wait_until_not_empty(1) is True
    sent = int(connection.info("stats")["total_net_output_bytes"]) - sent_before
    assert sent < 2**16, f"five waits moved {sent} bytes out of Redis"
    assert queue.pop_available(5) == [big.payload]


def test_the_doorbell_rings_after_a_push_and_clears_when_a_pop_empties_the_queue(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=5)
    assert connection.llen(keys.doorbell) == 0
    queue.try_push([rollout(0, 0), rollout(1, 0)])
    assert connection.lrange(keys.doorbell, 0, -1) == [b"1"]
    queue.try_push([rollout(2, 0)])
    assert connection.llen(keys.doorbell) == 1  # rung once, however many pushes
    assert queue.pop_available(2) == [b"a0-r0", b"a1-r0"]
    assert connection.llen(keys.doorbell) == 1  # one rollout still waits
    assert queue.pop_available(2) == [b"a2-r0"]
    assert connection.llen(keys.doorbell) == 0
    assert queue.wait_until_not_empty(0.1) is False


def test_a_rollout_the_doorbell_does_not_know_of_is_found_after_one_timeout(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=5)
    connection.rpush(keys.trajectories, b"foreign")  # e.g. the doorbell lost in a restart
    assert queue.wait_until_not_empty(0.1) is True


@pytest.mark.timeout(60)
def test_a_pusher_waiting_on_a_full_queue_does_not_resend_its_rollouts(connection, redis_url, run_name):
    """While the queue is full the pusher asks its length, and then sends only what fits: resending every
    waiting rollout at every poll moved their bytes into Redis again and again."""
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=2)
    queue.try_push([rollout(9, 0), rollout(9, 1)])  # full
    big = [PendingRollout(actor, 0, bytes([actor]) * 2**20) for actor in range(4)]
    errors: list[BaseException] = []

    def push() -> None:
        try:
            with redis.Redis.from_url(redis_url) as pusher_connection:
                TrajectoryQueue(pusher_connection, keys, bound=2).push(big, never_stopped, max_poll_seconds=0.005)
        except BaseException as error:  # noqa: B036 - reported to the main thread
            errors.append(error)

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    time.sleep(0.5)  # the point: the first attempt (4 MB) is over and the pusher polls
    received_before = int(connection.info("stats")["total_net_input_bytes"])
    time.sleep(1.0)
    received = int(connection.info("stats")["total_net_input_bytes"]) - received_before
    assert received < 2**20, f"a waiting pusher sent {received} bytes in one second"
    popped: list[bytes] = []
    wait_until(lambda: popped.extend(queue.pop_available(1)) or len(popped) == 6, 30, interval=0.01,
               message=lambda: f"{len(popped)} of 6 popped")
    pusher.join(timeout=10)
    assert not errors
    assert popped[2:] == [rollout.payload for rollout in big]  # in order, each once


# ---- a push sent now and confirmed after the next rollout (issue 10) --------------------------------------


def test_a_sent_push_is_delivered_once_and_confirmed_later(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=4)
    sent = queue.send(rollout(0, 0), token="job-a")
    assert sent is not None
    wait_until(lambda: queue.size() == 1, 10, message="the sent push running before its reply is read")
    report = queue.finish(sent, never_stopped)
    assert report.waited_seconds == 0.0 and report.duplicates == ()
    assert queue.pop_available(4) == [b"a0-r0"]


@pytest.mark.parametrize("how", ["abandoned", "connection-killed"])
def test_a_sent_push_whose_reply_is_lost_is_pushed_again_without_a_copy(connection, run_name, how):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=4)
    sent = queue.send(rollout(0, 0), token="job-a")
    assert sent is not None
    wait_until(lambda: queue.size() == 1, 10, message="the sent push running")
    if how == "abandoned":
        sent.abandon()  # the reply is never read: finish must find out again
    else:  # the server drops the connection before the reply is read (a restart, a network cut)
        connection.client_kill_filter(_type="normal", skipme=True)
    assert queue.finish(sent, never_stopped).duplicates == ()  # QueuePush.MINE: this token pushed it already
    assert queue.pop_available(4) == [b"a0-r0"]
    assert not connection.connection_pool._in_use_connections, "the sent push's connection went back to the pool"


@pytest.mark.timeout(60)
def test_a_sent_push_into_a_full_queue_waits_for_room_and_is_delivered_once(connection, redis_url, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=1)
    assert queue.try_push([rollout(0, 0)]) == [QueuePush.PUSHED]
    sent = queue.send(rollout(1, 0), token="job-b")
    assert sent is not None
    consumer = TrajectoryQueue(redis.Redis.from_url(redis_url), RunKeys(run_name), bound=1)
    popped: list[bytes] = []
    timer = threading.Timer(0.3, lambda: popped.extend(consumer.pop_available(1)))
    timer.start()
    try:
        report = queue.finish(sent, never_stopped)
    finally:
        timer.join()
    assert report.waited_seconds > 0 and report.duplicates == ()
    assert popped == [b"a0-r0"]
    assert queue.pop_available(4) == [b"a1-r0"]


def test_a_sent_push_into_a_full_queue_gives_up_when_the_run_stops(connection, run_name):
    queue = TrajectoryQueue(connection, RunKeys(run_name), bound=1)
    assert queue.try_push([rollout(0, 0)]) == [QueuePush.PUSHED]
    sent = queue.send(rollout(1, 0), token="job-b")
    assert sent is not None
    with pytest.raises(RunStoppedError):
        queue.finish(sent, lambda: True)
    assert queue.pop_available(4) == [b"a0-r0"]


def test_an_error_inside_a_sent_push_is_raised_and_not_pushed_again(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=4)
    connection.set(keys.pushed_rollouts, "not a hash")  # the push script fails on it, after the RPUSH beside it
    sent = queue.send(rollout(0, 0), token="job-a")
    assert sent is not None
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.finish(sent, never_stopped)
    assert queue.size() == 1, "raised like try_push, not taken for a lost reply and pushed a second time"
    assert not connection.connection_pool._in_use_connections, "the sent push's connection went back to the pool"


def test_a_sent_duplicate_is_reported_and_a_sent_push_without_the_lease_raises(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=4)
    assert queue.try_push([rollout(0, 0)]) == [QueuePush.PUSHED]
    sent = queue.send(rollout(0, 0), token="job-b")
    assert sent is not None
    assert queue.finish(sent, never_stopped).duplicates == (rollout(0, 0),)
    connection.set("lease-key", "job-a#1")
    sent = queue.send(rollout(0, 1), token="job-c", lease=("lease-key", "job-c#1"))
    assert sent is not None
    with pytest.raises(LeaseLostError, match="no longer names job-c#1"):
        queue.finish(sent, never_stopped)
    assert queue.size() == 1


def test_a_pop_drops_oversized_entries_in_redis_unread_and_keeps_its_count(connection, run_name):
    keys = RunKeys(run_name)
    queue = TrajectoryQueue(connection, keys, bound=10, max_entry_bytes=2**20)
    small = [b"a" * 1000, b"b" * 300_000, b"c" * 10]
    connection.rpush(keys.trajectories, small[0], b"x" * (3 * 2**20), small[1], b"y" * (2 * 2**20), small[2])
    popped = queue.pop(3)
    assert popped.entries == small, "the pop took the three small entries, in order, and skipped the big ones"
    assert popped.oversized == 2 and popped.size_after == 0
    assert not connection.exists(keys.scratch)
    connection.rpush(keys.trajectories, *small)  # the whole queue under the limit: nothing measured one by one
    assert queue.pop(2).entries == small[:2] and queue.pop(5).oversized == 0
    too_big = PendingRollout(0, 0, b"z" * (2**20 + 1))
    with pytest.raises(ConfigError, match="over the 1 MB a queue entry may be"):
        queue.push([too_big], never_stopped)


def test_a_learner_user_that_may_not_measure_pops_unscreened(connection, redis_url, run_name):
    keys = RunKeys(run_name)
    user = f"no-measure-{run_name}"
    connection.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["rqrl:*"], commands=[
        "-@all", "+multi", "+exec", "+eval", "+get", "+set", "+del", "+llen", "+ltrim", "+lmove", "+lrem"])
    try:
        limited = redis.Redis.from_url(redis_url, username=user, password="pw")
        queue = TrajectoryQueue(limited, keys, bound=10, max_entry_bytes=1000)
        connection.rpush(keys.trajectories, b"a" * 2000, b"b")
        popped = queue.pop(2)
        assert popped.oversized == -1 and popped.entries == [b"a" * 2000, b"b"], "nothing screened, nothing lost"
    finally:
        connection.acl_deluser(user)
