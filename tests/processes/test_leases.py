"""Faults on workers: killed or hung workers' actor groups are re-run elsewhere, nothing is lost
and nothing is delivered twice (real Redis, real `rqrl worker` processes).

The tests here start processes; the in-process ones are in tests/integration/test_leases.py.
"""

from __future__ import annotations

import collections
import functools
import itertools
import signal
import time

import pytest

from rqrl import MissingStatsError, RolloutEvents
from tests import fixtures
from tests.integration.test_leases import actors_on_workers  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)

# actors for `rqrl worker` processes: one actor per job, jobs that yield every 0.2 s so groups move between workers


def assert_each_actor_delivered_a_contiguous_run_once(delivered: list[tuple[int, int]], n_actors: int) -> None:
    counts = collections.Counter(delivered)
    duplicates = [pair for pair, count in counts.items() if count > 1]
    assert duplicates == [], f"rollouts delivered twice: {duplicates[:10]}"
    for actor in range(n_actors):
        rollouts = sorted(rollout for a, rollout in delivered if a == actor)
        assert rollouts == list(range(len(rollouts))), f"actor {actor} has gaps: {rollouts}"


def pairs(records) -> list[tuple[int, int]]:
    return [(a, r) for record in records
            for a, r in zip(record.actor_id.tolist(), record.rollout_id.tolist(), strict=True)]


def test_sigkilled_workers_jobs_are_rerun_elsewhere_with_nothing_lost_or_doubled(
        connection, redis_url, run_name, workers):
    processes = [workers.start(f"w{index}") for index in range(4)]
    workers.wait_registered(connection, 4)
    delivered: list[tuple[int, int]] = []
    last_seen: dict[int, float] = {}
    delivered_by: set[str] = set()

    def collect(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            record = actors.collect_outputs("cpu").record
            delivered_by.update(record.worker)
            now = time.monotonic()
            for actor, rollout in zip(record.actor_id.tolist(), record.rollout_id.tolist(), strict=True):
                delivered.append((actor, rollout))
                last_seen[actor] = now

    with actors_on_workers(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(3.0)
        killed_at = time.monotonic()
        for process in processes[:2]:  # a container kill: no warm shutdown, no clean-up
            process.send_signal(signal.SIGKILL)

        def reruns() -> float:
            try:
                return actors.get_stats_value(RolloutEvents.groups_rerun, name="sum")
            except MissingStatsError:  # none recorded in this epoch yet
                return 0

        def every_actor_delivered_again_after_a_rerun() -> bool:  # the killed jobs' leases lapse, the reaper re-runs
            collect(0.5)
            return all(last_seen[actor] > killed_at for actor in range(4)) and reruns() >= 1

        wait_until(every_actor_delivered_again_after_a_rerun, 60, interval=0, message=lambda: (
            f"every actor delivering after the kill, with a group re-run; last seen "
            f"{ {actor: round(last_seen[actor] - killed_at, 1) for actor in range(4)} } s after it"))
        rate_without = len(delivered)
        delivered_by.clear()
        for index in range(2):  # workers come back
            workers.start(f"back{index}")
        collect(1.0)
        assert len(delivered) > rate_without

        def a_replacement_delivered() -> bool:  # jobs yield every min_job_seconds, so groups move to newcomers
            collect(0.5)
            return bool(delivered_by & {"back0", "back1"})

        wait_until(a_replacement_delivered, 60, interval=0,
                   message=lambda: f"a rollout run by a replacement worker; ran on {sorted(delivered_by)}")
    assert_each_actor_delivered_a_contiguous_run_once(delivered, 4)


def test_the_rerun_starts_within_15_seconds_of_the_kill(connection, redis_url, run_name, workers):
    victim = workers.start("victim")
    workers.wait_registered(connection, 1)
    with actors_on_workers(redis_url, run_name, n_actors=1, batch_size=1) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        for _ in range(3):
            assert actors.collect_outputs("cpu").record.worker == ("victim",)
        workers.start("rescuer")
        workers.wait_registered(connection, 2)
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        # drain what the victim pushed before dying, then wait for the rescuer's first rollout
        wait_until(lambda: actors.collect_outputs("cpu").record.worker == ("rescuer",), 15, interval=0,
                   message="the rescuer's first rollout")
        assert time.monotonic() - killed_at < 15


def test_a_rerun_says_where_its_rollouts_do_not_continue_the_delivered_ones(connection, redis_url, run_name,
                                                                            workers):
    victim = workers.start("victim")
    workers.wait_registered(connection, 1)
    long_episodes = functools.partial(fixtures.CountingEnv, length=1_000_000)  # obs: step count in the episode
    with actors_on_workers(redis_url, run_name, env_factory=long_episodes, policy=fixtures.mlp_policy(obs_size=1),
                           n_actors=1, batch_size=1) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record for _ in range(3)]
        workers.start("rescuer")
        workers.wait_registered(connection, 2)
        # collect fast so the victim pushes rollouts quicker than its lease records progress: the
        # rescuer re-runs from the last recorded rollout and recomputes some delivered ones
        records += [actors.collect_outputs("cpu").record for _ in range(40)]
        # as if the victim's last progress write were a second old: the rescuer re-runs from rollout 1
        # and recomputes rollouts the victim delivered; its pushes of those are refused as duplicates (set once
        # the victim is dead, which cannot write progress any more, and within the lease window the reaper waits)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        connection.set(actors.keys.progress(0), 1)

        def rescued() -> bool:
            records.append(actors.collect_outputs("cpu").record)
            return records[-1].worker == ("rescuer",)

        if records[-1].worker != ("rescuer",):
            wait_until(rescued, 60, interval=0, message="the rescuer's first rollout")
        records += [actors.collect_outputs("cpu").record for _ in range(3)]
        cuts = actors.get_stats_value(RolloutEvents.episodes_cut, name="sum")
    assert [int(record.rollout_id[0]) for record in records] == list(range(len(records)))
    for previous, current in itertools.pairwise(records):
        follows_on = float(current.obs[0, 0, 0]) == float(previous.next_obs[0, 0])
        assert bool(current.continues_previous[0]) == follows_on, f"rollout {int(current.rollout_id[0])}"
    first_rescued = next(record for record in records if record.worker == ("rescuer",))
    assert not bool(first_rescued.continues_previous[0])
    assert float(first_rescued.obs[0, 0, 0]) != 0.0, "expected the rescuer to deliver after refused duplicates"
    assert cuts == 1, "the episode the kill cut is counted once"


def test_a_worker_hung_in_env_step_is_timed_out_and_its_group_rerun(connection, redis_url, run_name, workers,
                                                                      tmp_path):
    for index in range(2):
        workers.start(f"w{index}")
    workers.wait_registered(connection, 2)
    env_factory = functools.partial(fixtures.make_hang_once_env, str(tmp_path / "hung"))
    with actors_on_workers(redis_url, run_name, env_factory=env_factory, policy=fixtures.mlp_policy(obs_size=1),
                           n_actors=1, batch_size=1, hang_seconds=2.0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        started = time.monotonic()
        rollouts = [int(actors.collect_outputs("cpu").record.rollout_id[0]) for _ in range(4)]
        assert (tmp_path / "hung").exists(), "the env never hung"
        assert rollouts == [0, 1, 2, 3]
        assert time.monotonic() - started < 30
        assert actors.get_stats_value(RolloutEvents.groups_rerun, name="sum") >= 1
        (tmp_path / "hung.release").touch()  # the hung worker steps on: stopping it need not wait for SIGKILL


@pytest.mark.parametrize("resumed_batch_size", [2, 1])
def test_a_restarted_learner_takes_over_its_run_and_workers_never_notice(connection, redis_url, run_name, workers,
                                                                         resumed_batch_size):
    worker = workers.start("steady")
    workers.wait_registered(connection, 1)
    first = actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2)
    first.start()
    first.broadcast_updated_policy(first.policy.state_dict())
    before = [first.collect_outputs("cpu").record for _ in range(3)]
    first.broadcast_updated_policy(first.policy.state_dict())
    version_before = first.policy_version
    keys, bound = first.keys, first.config.queue_bound
    first.connection.close()  # the learner dies holding its last batch: no stop(), its keys stay in Redis
    del first
    # the learner stays away until the worker has filled the queue: it waits for room, not for the learner
    wait_until(lambda: connection.llen(keys.trajectories) >= bound, 60,
               message=f"the worker filling the queue to its bound {bound}")

    with actors_on_workers(redis_url, run_name, n_actors=2, batch_size=resumed_batch_size, resume=True) as second:
        assert second.policy_version == version_before, "the resumed learner counts lag from the run's version"
        second.broadcast_updated_policy(second.policy.state_dict())
        assert second.policy_version == version_before + 1
        after = [second.collect_outputs("cpu").record for _ in range(8 // resumed_batch_size)]
        assert second.records_rejected == 0, "records made for the first learner must stay readable"
    assert worker.poll() is None, "the worker noticed the learner restart"
    held = pairs(before[-1:])
    assert pairs(after)[:len(held)] == held, "the batch the dead learner held was not delivered again first"
    assert_each_actor_delivered_a_contiguous_run_once(pairs(before[:-1] + after), 2)
    assert max(r for _, r in pairs(after)) >= 3


def test_a_live_learner_whose_run_another_resumes_stops_and_leaves_the_run_to_it(connection, redis_url, run_name,
                                                                                 workers):
    from rqrl import RunTakenOverError

    workers.start("steady")
    workers.wait_registered(connection, 1)
    with actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2) as first:
        first.broadcast_updated_policy(first.policy.state_dict())
        for _ in range(3):
            first.collect_outputs("cpu")
            first.broadcast_updated_policy(first.policy.state_dict())
        with actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2, resume=True) as second:
            with pytest.raises(RunTakenOverError, match="taken over by another learner"):
                first.broadcast_updated_policy(first.policy.state_dict())  # refused, nothing published
            with pytest.raises(RunTakenOverError, match="resume a run only once its learner has stopped"):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # its next heartbeat (at most a second apart) finds out
                    first.collect_outputs("cpu")
            first.stop()
            assert connection.exists(second.keys.config), "the taken-over learner's stop() deleted the run"
            version = second.policy_version
            for _ in range(6):
                second.broadcast_updated_policy(second.policy.state_dict())
                second.collect_outputs("cpu")
            assert second.policy_version == version + 6
            assert second.records_rejected == 0, "rollouts of the second learner's weights were refused"
            with pytest.raises(MissingStatsError):  # what the first popped as it found out went to the second
                second.get_stats_value(RolloutEvents.rollouts_lost, name="sum")
    assert connection.keys(f"rqrl:{run_name}:*") == [], "the second learner's stop() cleans the run up"


def test_acknowledged_batches_are_not_delivered_again(connection, redis_url, run_name, workers):
    workers.start("steady")
    workers.wait_registered(connection, 1)
    first = actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2)
    first.start()
    first.broadcast_updated_policy(first.policy.state_dict())
    before = [first.collect_outputs("cpu").record for _ in range(3)]
    assert len(connection.lrange(first.keys.unacknowledged, 0, -1)) in (2, 4), (
        "only the last batch is unacknowledged, and the next one if it was popped ahead (RunOptions.pop_ahead)")
    first.connection.close()
    del first
    with actors_on_workers(redis_url, run_name, n_actors=2, batch_size=2, resume=True) as second:
        after = [second.collect_outputs("cpu").record for _ in range(3)]
    assert_each_actor_delivered_a_contiguous_run_once(pairs(before[:-1] + after), 2)


def test_when_every_worker_is_killed_the_learner_says_so(connection, redis_url, run_name, workers):
    from rqrl import NoWorkersError
    from rqrl.engine.timings import protocol_timings

    victim = workers.start("only")
    workers.wait_registered(connection, 1)
    with actors_on_workers(redis_url, run_name, n_actors=1, batch_size=1, no_worker_timeout=1.0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")
        assert actors.workers_alive(cached=False) == 1
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(NoWorkersError):
            while True:
                actors.collect_outputs("cpu")
        assert time.monotonic() - killed_at < protocol_timings().liveness + 15
        assert connection.scard("rq:workers:rqrl") == 1, "RQ itself still lists the killed worker"
