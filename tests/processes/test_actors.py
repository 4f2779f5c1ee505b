"""RedisDistributedActors / SubprocDistributedActors against a real Redis and real worker processes.

The tests here start processes; the in-process ones are in tests/integration/test_actors.py.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from rqrl import (
    ActorFailedError,
    CollectTimeoutError,
    RolloutEvents,
    SubprocDistributedActors,
)
from rqrl.engine.codec import records_key
from rqrl.engine.options import RunOptions
from rqrl.maze.group_records import decode_signed_entry, encode_group
from rqrl.maze.records import RecordSpec
from tests import fixtures
from tests.children import REPO_ROOT, alive, worker_env
from tests.factories import TEST_SECRET, redis_actors, rollout_record
from tests.integration.test_actors import local_actors  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(120)

# actors on the test Redis with local worker processes (one unless a test asks for more) started by fork


def children_alive() -> list[multiprocessing.Process]:
    return [child for child in multiprocessing.active_children() if child.is_alive()]


class MazeImpalaEvents:
    def estimated_queue_sizes(self, before, after):
        """Maze's IMPALA event of that name"""


LEARNER_SCRIPT = """
import sys, time
from rqrl import SubprocDistributedActors
from tests import fixtures
policy = fixtures.mlp_policy()
actors = SubprocDistributedActors(fixtures.make_cartpole, policy, 16, 2, 2, 2.0, sys.argv[1], [0, 1], [2, 3],
                                  n_workers=2)
actors.start()
actors.broadcast_updated_policy(policy.state_dict())
actors.collect_outputs("cpu")
print(" ".join(str(p.pid) for p in actors.local_workers.processes), actors.local_workers.server.process.pid, flush=True)
time.sleep(120)
"""


def test_collect_outputs_returns_time_major_batch_with_all_fields(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_rollout_steps=32, n_actors=4, batch_size=4) as actors:
        policy = actors.policy
        actors.broadcast_updated_policy(policy.state_dict())
        record, size_before, size_after, dequeue_time = actors.collect_outputs("cpu")
        waited = actors.last_wait_seconds
    # the first batch waits for the workers to start: idle time, a part of the collect's time
    assert waited is not None and 0 < waited <= dequeue_time
    assert record.obs.shape == (32, 4, 4)
    assert record.actions.shape == record.rewards.shape == record.terminated.shape == (32, 4)
    assert record.truncated.shape == record.log_probs.shape == (32, 4)
    assert record.logits.shape == (32, 4, 2)
    assert record.next_obs.shape == (4, 4)
    assert record.policy_version.tolist() == [1, 1, 1, 1]
    assert sorted(record.actor_id.tolist()) == [0, 1, 2, 3]
    assert record.terminated.dtype == torch.bool and record.truncated.dtype == torch.bool
    assert isinstance(size_before, int) and isinstance(size_after, int) and dequeue_time >= 0
    # log-probs are those of the logits at the chosen actions
    expected = torch.log_softmax(record.logits, -1).gather(-1, record.actions.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(record.log_probs, expected)


def test_broadcast_versions_reach_workers_and_reads_are_never_torn(connection, redis_url, run_name):
    policy = fixtures.WeightRevealingPolicy()
    with local_actors(redis_url, run_name, policy=policy, n_actors=2, batch_size=2, n_local_workers=2) as actors:
        seen_versions = set()

        def a_batch_holds(version: int) -> bool:
            record = actors.collect_outputs("cpu").record
            for column, record_version in enumerate(record.policy_version.tolist()):
                # every step of a rollout carries the weight of the version it claims
                assert torch.all(record.log_probs[:, column] == float(record_version))
                seen_versions.add(record_version)
            return version in record.policy_version.tolist()

        for version in range(1, 6):
            actors.broadcast_updated_policy(fixtures.revealing_state(version))
            wait_until(functools.partial(a_batch_holds, version), 30, interval=0,
                       message=f"version {version} reaching the workers")
        lag = actors.get_stats_value(RolloutEvents.policy_lag, name="min")
    assert seen_versions >= {1, 2, 3, 4, 5}
    assert lag == 0


def test_workers_check_for_weights_at_most_once_per_refresh_interval(connection, redis_url, run_name):
    """weights_refresh_seconds: with an interval longer than the test, a worker keeps the weights it started with
    while the learner publishes new ones; with the default (0), the next batches carry the new version."""
    policy = fixtures.WeightRevealingPolicy()
    with local_actors(redis_url, run_name, policy=policy, n_actors=2, batch_size=2, n_local_workers=1,
                      weights_refresh_seconds=3600.0) as actors:
        actors.broadcast_updated_policy(fixtures.revealing_state(1))
        for version in range(2, 12):  # more batches than the queue, pop-ahead and a rollout in flight hold
            record = actors.collect_outputs("cpu").record
            assert torch.all(record.log_probs == 1.0), "a worker fetched weights before its interval passed"
            actors.broadcast_updated_policy(fixtures.revealing_state(version))
    assert record.policy_version.tolist() == [1, 1]


def test_actors_started_before_the_first_broadcast_wait_for_it(connection, redis_url, run_name):
    policy = fixtures.WeightRevealingPolicy()
    with local_actors(redis_url, run_name, policy=policy) as actors:
        wait_until(lambda: connection.zcard("rq:wip:rqrl") == 1, message="the worker starting the run's job")
        time.sleep(1.0)  # the point: the job runs with no weights yet, and must wait for them, not fail
        assert actors.queue_size() == 0 and connection.zcard("rq:wip:rqrl") == 1
        actors.broadcast_updated_policy(fixtures.revealing_state(7))
        record = actors.collect_outputs("cpu").record
    assert torch.all(record.log_probs == 7.0)


@pytest.mark.parametrize(("actors_per_job", "bound"), [(1, 6), (2, 3)])
def test_queue_never_exceeds_its_bound_under_fast_producers(connection, redis_url, run_name, actors_per_job, bound):
    """Maze's bound is batch_size 4 * factor 1.5 = 6 rollouts; workers push one entry per actor group, so the
    list holds 6 entries of one rollout, or 3 of two."""
    with local_actors(redis_url, run_name, n_rollout_steps=4, n_actors=8, batch_size=4, actors_per_job=actors_per_job,
                      queue_out_of_sync_factor=1.5, n_local_workers=2) as actors:
        assert actors.max_queue_size == 6 and actors.config.queue_entries == bound
        actors.broadcast_updated_policy(actors.policy.state_dict())
        key = actors.keys.trajectories
        sizes = []

        def filled() -> bool:
            sizes.append(connection.llen(key))
            return sizes[-1] >= bound

        wait_until(filled, 30, interval=0, message=f"producers filling the queue up to its bound {bound}")
        sizes.extend(connection.llen(key) for _ in range(1000))  # producers keep pushing against the full queue
        assert max(sizes) == bound
        for _ in range(5):  # make room repeatedly; producers refill but never overshoot
            actors.collect_outputs("cpu")
            sizes.extend(connection.llen(key) for _ in range(200))
    assert max(sizes) <= bound


def test_a_queue_smaller_than_a_batch_fills_batches_as_rollouts_arrive(connection, redis_url, run_name):
    """Maze's queue_out_of_sync_factor < 1: a queue of 2 for batches of 6; the learner takes rollouts as they
    arrive, every batch is full, no rollout is lost or repeated, and the queue never exceeds its bound."""
    with local_actors(redis_url, run_name, n_rollout_steps=4, n_actors=2, batch_size=6,
                      queue_out_of_sync_factor=0.4, actors_per_job=1, n_local_workers=2) as actors:
        assert actors.max_queue_size == 2
        actors.broadcast_updated_policy(actors.policy.state_dict())
        batches = [actors.collect_outputs("cpu") for _ in range(4)]
        assert connection.llen(actors.keys.trajectories) <= 2
    delivered: dict[int, list[int]] = {}
    for batch in batches:
        assert batch.record.batch_size == 6 and batch.queue_size_before <= 2
        for actor, rollout in zip(batch.record.actor_id.tolist(), batch.record.rollout_id.tolist(), strict=True):
            delivered.setdefault(actor, []).append(rollout)
    assert set(delivered) <= {0, 1}
    for rollouts in delivered.values():  # each actor's rollouts arrive in order, none twice, none skipped
        assert rollouts == list(range(len(rollouts)))
    assert sum(len(rollouts) for rollouts in delivered.values()) == 24


def test_a_maze_shaped_learner_step_runs_on_workers(connection, redis_url, run_name):
    """What a Maze IMPALA learner does with its actors: broadcast its actor-critic's nested state dict (only the
    policy's part reaches the workers), read record.dones, record its own events on the stats aggregator and
    read the episode reward by Maze's names."""
    from rqrl import BaseEnvEvents, LogStatsLevel

    critic = torch.nn.Linear(4, 1)
    with local_actors(redis_url, run_name, policy=fixtures.WeightRevealingPolicy(), n_rollout_steps=64) as actors:
        events = actors.get_epoch_stats_aggregator().create_event_topic(MazeImpalaEvents)
        actors.broadcast_updated_policy({"policy": fixtures.revealing_state(4.0), "critic": critic.state_dict()})
        record, before, after, _ = actors.collect_outputs("cpu")
        events.estimated_queue_sizes(before=before, after=after)
        assert torch.all(record.log_probs == 4.0)  # the policy's weights, not the critic's, reached the workers
        assert torch.equal(record.dones, record.terminated | record.truncated) and bool(record.dones.any())
        assert actors.get_stats_value(MazeImpalaEvents.estimated_queue_sizes, LogStatsLevel.EPOCH,
                                      name="before") == before
        assert actors.get_stats_value(BaseEnvEvents.reward, LogStatsLevel.EPOCH, name="mean") == pytest.approx(
            float(record.episode_returns.double().mean()))


def test_same_seeds_and_weights_give_identical_trajectories(connection, redis_url):
    def collect(run_name, agent_seeds):
        policy = fixtures.mlp_policy(seed=3)
        with local_actors(redis_url, run_name, policy=policy, n_actors=4, batch_size=4, n_local_workers=2,
                          actors_per_job=2, actor_env_seeds=[5, 6, 7, 8], actor_agent_seeds=agent_seeds) as actors:
            actors.broadcast_updated_policy(policy.state_dict())
            rollouts = {}
            # which rollouts a batch holds depends on which worker runs ahead: collect until every actor's first
            # two rollouts are in, so any two runs share those 8 whatever the timing
            wanted = {(actor, rollout) for actor in range(4) for rollout in range(2)}
            for _ in range(20):
                record = actors.collect_outputs("cpu").record
                for column in range(record.batch_size):
                    key = (int(record.actor_id[column]), int(record.rollout_id[column]))
                    rollouts[key] = (record.obs[:, column], record.actions[:, column], record.rewards[:, column])
                if wanted <= set(rollouts):
                    break
            return rollouts

    first = collect("seeds-a", [1, 2, 3, 4])
    second = collect("seeds-b", [1, 2, 3, 4])
    other_agent = collect("seeds-c", [9, 10, 11, 12])
    common = sorted(set(first) & set(second))
    assert len(common) >= 4
    for key in common:
        for a, b in zip(first[key], second[key], strict=True):
            torch.testing.assert_close(a, b)
    shared = sorted(set(first) & set(other_agent))
    assert shared, f"no rollout in common to compare: {sorted(first)} against {sorted(other_agent)}"
    assert any(not torch.equal(first[key][1], other_agent[key][1]) for key in shared), "agent seeds are a no-op"


def test_dict_observation_spaces(connection, redis_url, run_name):
    policy = fixtures.DictPolicy()
    with local_actors(redis_url, run_name, env_factory=fixtures.make_dict_env, policy=policy,
                      n_rollout_steps=30, n_actors=3, batch_size=3) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        record = actors.collect_outputs("cpu").record
    assert record.obs["position"].shape == (30, 3, 2)
    assert record.obs["goal"].shape == (30, 3)
    assert record.next_obs["position"].shape == (3, 2)
    # each env truncates after 20 steps: one final observation per truncated step, at its index
    assert record.truncated[19].all()
    assert record.final_obs["position"].shape[0] == int(record.truncated.sum())
    assert record.final_obs_index.shape == (int(record.truncated.sum()), 2)


def test_frame_stacks_cross_redis_as_unique_frames_and_arrive_whole(connection, redis_url, run_name):
    policy = fixtures.FramePolicy()
    with local_actors(redis_url, run_name, env_factory=fixtures.make_frame_stack_env, policy=policy,
                      n_rollout_steps=24, n_actors=3, batch_size=3) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        actors.collect_outputs("cpu")
        before = connection.info("stats")["total_net_input_bytes"]
        records = [actors.collect_outputs("cpu").record for _ in range(4)]
        pushed = connection.info("stats")["total_net_input_bytes"] - before
    obs_bytes = sum(record.obs.numel() + record.next_obs.numel() for record in records)
    assert pushed < 0.5 * obs_bytes, f"{pushed} bytes into Redis for {obs_bytes} bytes of observations"
    for record in records:
        assert record.obs.dtype == torch.uint8 and record.obs.shape == (24, 3, 4, 12, 12)
        ended = record.terminated | record.truncated
        shifted = (record.obs[1:, :, :3] == record.obs[:-1, :, 1:]).flatten(2).all(-1)
        assert shifted[~ended[:-1]].all(), "within an episode each stack is the last one shifted by a frame"
        last = (record.next_obs[:, :3] == record.obs[-1, :, 1:]).flatten(1).all(-1)
        assert last[~ended[-1]].all()
        assert record.final_obs.shape[0] == int(record.truncated.sum()) > 0


def test_episodes_continue_across_rollouts_of_an_actor(connection, redis_url, run_name):
    # CountingEnv episodes last 50 steps; rollouts are 16 steps, so an episode spans 4 rollouts
    with local_actors(redis_url, run_name, env_factory=fixtures.make_counting_env, n_actors=1, batch_size=1,
                      n_rollout_steps=16, policy=fixtures.mlp_policy(obs_size=1)) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record for _ in range(8)]
        lengths = actors.get_stats_value(RolloutEvents.episode_length)
    obs = torch.cat([record.obs[:, 0, 0] for record in records])
    assert obs[:51].tolist() == [float(i) for i in range(50)] + [0.0]  # counts run on across rollouts
    assert lengths["min"] == lengths["max"] == 50


def test_slice_cut_is_marked_truncated_with_final_obs(connection, redis_url, run_name):
    # two single-actor jobs on one worker: each slice yields to the other, cutting its episode
    with local_actors(redis_url, run_name, env_factory=fixtures.make_counting_env, n_actors=2, batch_size=2,
                      n_rollout_steps=16, actors_per_job=1, min_job_seconds=0.01,
                      policy=fixtures.mlp_policy(obs_size=1)) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record for _ in range(10)]
    cuts = 0
    for record in records:
        for column in range(record.batch_size):
            truncated = record.truncated[:, column]
            if truncated[-1] and record.obs[-1, column, 0] < 49:  # cut, not the env's own episode end
                cuts += 1
    assert cuts > 0
    for record in records:  # every truncation has its final observation
        assert record.final_obs.shape[0] == int(record.truncated.sum())


def test_env_exception_reaches_the_learner_with_job_id_and_traceback(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, env_factory=fixtures.make_failing_env,
                      policy=fixtures.mlp_policy(obs_size=1)) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        with pytest.raises(ActorFailedError) as caught:
            for _ in range(20):
                actors.collect_outputs("cpu")
    error = caught.value
    assert error.job_id.startswith(f"rqrl_{run_name}_g")
    assert "CountingEnv exploded" in error.remote_traceback
    assert "fixtures.py" in error.remote_traceback and "in step" in error.remote_traceback


def test_slow_actors_raise_collect_timeout(connection, redis_url, run_name, tmp_path):
    release = tmp_path / "release"
    with local_actors(redis_url, run_name, env_factory=functools.partial(fixtures.make_slow_env, str(release)),
                      collect_timeout=1.0, policy=fixtures.mlp_policy(obs_size=1)) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        with pytest.raises(CollectTimeoutError, match="collect_timeout"):
            actors.collect_outputs("cpu")
        release.touch()  # the envs step at full speed from here: stopping need not wait out their sleeps


def test_stop_leaves_no_process_job_or_key(connection, redis_url, run_name):
    actors = local_actors(redis_url, run_name, n_local_workers=2, n_actors=4)
    actors.start()
    actors.broadcast_updated_policy(actors.policy.state_dict())
    actors.collect_outputs("cpu")
    pids = [process.pid for process in actors.local_workers.processes]
    actors.stop()
    assert not [child for child in children_alive() if child.pid in pids]
    assert list(connection.scan_iter(match=f"rqrl:{run_name}:*")) == []
    assert [key for key in connection.scan_iter(match="rq:job:*") if run_name.encode() in key] == []
    assert connection.lrange("rq:queue:rqrl", 0, -1) == []


def test_subproc_actors_embedded_redis_is_gone_after_stop():
    policy = fixtures.mlp_policy()
    actors = SubprocDistributedActors(fixtures.make_cartpole, policy, 16, 2, 2, 2.0, "fork", [0, 1], [2, 3])
    with actors:
        actors.broadcast_updated_policy(policy.state_dict())
        assert actors.collect_outputs("cpu").record.rewards.shape == (16, 2)
        server_process = actors.local_workers.server.process
        worker_pids = [process.pid for process in actors.local_workers.processes]
    assert server_process.poll() is not None
    assert not [child for child in children_alive() if child.pid in worker_pids]


def test_subproc_actors_take_run_options_and_merge_workers_into_them():
    policy = fixtures.mlp_policy()
    options = RunOptions(run_name="subproc-options", collect_timeout=30.0, n_local_workers=3)
    with SubprocDistributedActors(fixtures.make_cartpole, policy, 16, 2, 2, 2.0, "fork", [0, 1], [2, 3],
                                  n_workers=1, options=options) as actors:
        assert actors.run_name == "subproc-options" and actors.options.collect_timeout == 30.0
        assert actors.options.n_local_workers == 1, "n_workers wins over the options' n_local_workers"
        assert actors.options.start_method == "fork" and actors.options.actors_per_job == 2
        actors.broadcast_updated_policy(policy.state_dict())
        assert actors.collect_outputs("cpu").record.rewards.shape == (16, 2)
        assert len(actors.local_workers.processes) == 1
        assert actors.local_workers.server is not None, "a private Redis"


def test_two_runs_share_one_redis_without_mixing(connection, redis_url):
    policy_a, policy_b = fixtures.WeightRevealingPolicy(), fixtures.WeightRevealingPolicy()
    with local_actors(redis_url, "run-a", policy=policy_a) as a, local_actors(redis_url, "run-b", policy=policy_b) as b:
        a.broadcast_updated_policy(fixtures.revealing_state(1.0))
        b.broadcast_updated_policy(fixtures.revealing_state(2.0))
        for _ in range(3):
            assert torch.all(a.collect_outputs("cpu").record.log_probs == 1.0)
            assert torch.all(b.collect_outputs("cpu").record.log_probs == 2.0)


def test_rollouts_a_lost_pop_reply_left_unseen_are_still_delivered_once(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_actors=2, batch_size=2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record]
        wait_until(lambda: actors.queue_size() > 0, 30, interval=0.01, message="a rollout in the queue")
        # a pop whose reply never reached the learner (redis-py retried it): its entry sits unseen on
        # the unacknowledged list, and the learner's next pop must notice the gap in the indices
        lost = actors._queue.pop(1, actors._inbox.done_below)
        assert len(lost.entries) == 1
        records += [actors.collect_outputs("cpu").record for _ in range(4)]
        assert actors.records_rejected == 0
    delivered = [(a, r) for record in records
                 for a, r in zip(record.actor_id.tolist(), record.rollout_id.tolist(), strict=True)]
    assert len(delivered) == len(set(delivered)) == 10
    for actor in (0, 1):
        assert sorted(r for a, r in delivered if a == actor) == list(range(5))


def test_the_next_batch_is_popped_while_the_caller_trains_and_the_one_in_hand_stays_unacknowledged(
        connection, redis_url, run_name):
    """RunOptions.pop_ahead (on by default): not after a collect that waited for rollouts (the workers set the
    pace); with the queue full, the next batch leaves it on a thread of its own while the caller holds this one;
    both stay on the unacknowledged list (a learner that dies now leaves both to the next), and the caller's next
    batch is the one popped ahead, acknowledging the one before."""
    def unacknowledged_ids(actors) -> list[tuple[int, int]]:
        key, spec = records_key(TEST_SECRET, actors.config.run_id), RecordSpec(n_steps=4, n_actors=2)
        entries = connection.lrange(actors.keys.unacknowledged, 0, -1)
        records = [record for entry in entries
                   for record in decode_signed_entry(entry, actors.config.run_id, key, spec).records]
        return [(record.actor_id, record.rollout_id) for record in records]

    with local_actors(redis_url, run_name, n_rollout_steps=4, n_actors=2, batch_size=2, actors_per_job=1,
                      n_local_workers=2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")  # waits for the workers to start
        assert actors.last_wait_seconds > 0 and not actors._ahead.in_flight
        wait_until(lambda: connection.llen(actors.keys.trajectories) == 4, 30, message="the queue full (4 rollouts)")
        first = actors.collect_outputs("cpu").record
        assert actors.last_wait_seconds == 0 and actors._ahead.in_flight
        wait_until(lambda: connection.llen(actors.keys.unacknowledged) == 4, 10, message="the next batch popped ahead")
        held = list(zip(first.actor_id.tolist(), first.rollout_id.tolist(), strict=True))
        popped_ahead = unacknowledged_ids(actors)[2:]
        assert unacknowledged_ids(actors)[:2] == held
        second = actors.collect_outputs("cpu").record
        assert list(zip(second.actor_id.tolist(), second.rollout_id.tolist(), strict=True)) == popped_ahead
        wait_until(lambda: unacknowledged_ids(actors)[:2] == popped_ahead, 10,
                   message=lambda: f"the first batch acknowledged; unacknowledged: {unacknowledged_ids(actors)}")


def test_stats_cover_returns_lengths_throughput_lag_queue_and_workers(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_actors=4, batch_size=4, n_local_workers=2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        # on a loaded machine the second worker may register late
        wait_until(lambda: actors.workers_alive(cached=False) == 2, 60, interval=0.1, message="two live workers")
        for _ in range(20):
            actors.collect_outputs("cpu")
        stats = actors.get_epoch_stats_aggregator().reduce()
    for event in ("episode_return", "episode_length", "env_steps_per_second", "policy_lag", "queue_size",
                  "workers_alive", "dequeue_time"):
        assert event in stats, event
    assert stats["env_steps"]["sum"] == 20 * 4 * 16
    assert stats["workers_alive"]["max"] == 2
    assert stats["episode_return"]["min"] >= 8  # CartPole episodes last at least 8 steps


def test_actors_started_from_a_short_lived_thread_keep_their_workers(connection, redis_url, run_name):
    import threading

    actors = local_actors(redis_url, run_name, n_local_workers=1)
    starter = threading.Thread(target=actors.start)
    starter.start()
    starter.join(30)
    try:
        assert not starter.is_alive(), "start() did not return"
        time.sleep(1.5)  # the point: the orphan watchdog polls every second, and must not see an orphan
        assert all(process.is_alive() for process in actors.local_workers.processes)
        actors.broadcast_updated_policy(actors.policy.state_dict())
        assert actors.collect_outputs("cpu").record.rewards.shape == (16, 2)
    finally:
        actors.stop()


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_a_killed_learner_leaves_no_worker_or_redis_behind(start_method):
    learner = subprocess.Popen([sys.executable, "-c", LEARNER_SCRIPT, start_method], cwd=REPO_ROOT,
                               env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pids = [int(pid) for pid in learner.stdout.readline().split()]
        assert len(pids) == 3, "learner did not report its workers and redis-server"
    finally:
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)

    def survivors() -> list[int]:  # a zombie waiting for init to reap it is gone too
        return [pid for pid in pids if alive(pid)]

    try:
        wait_until(lambda: not survivors(), 10, interval=0.1,
                   message=lambda: f"the learner's processes to end; these outlived it: {survivors()}")
    finally:
        for pid in survivors():
            os.kill(pid, signal.SIGKILL)


def test_foreign_and_corrupted_queue_entries_are_rejected_and_counted(connection, redis_url, run_name):
    def fake(run_id: str, steps: int = 16, obs_size: int = 4, actor: int = 0) -> bytes:
        return encode_group([rollout_record(steps, obs_size, logits=True, actor_id=actor, rollout_id=10_000)], run_id)

    with local_actors(redis_url, run_name, n_actors=2, batch_size=2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        record = actors.collect_outputs("cpu").record  # fixes the run's record signature
        valid = fake(actors.config.run_id)
        junk = [b"", b"random bytes \x00\xff" * 10, valid[:-7], valid[:40], fake("another-run"),
                fake(actors.config.run_id, steps=8), fake(actors.config.run_id, obs_size=5),
                fake(actors.config.run_id, actor=99)]
        connection.lpush(actors.keys.trajectories, *junk)
        for _ in range(5):
            record = actors.collect_outputs("cpu").record
            assert record.obs.shape == (16, 2, 4)
        assert actors.records_rejected == len(junk)
        assert actors.get_stats_value(RolloutEvents.records_rejected, name="sum") == len(junk)
        # rejected entries are acknowledged like trained ones: only the last batch stays unacknowledged, the
        # one entry of the two actors' group (one worker steps both), and the next one if it was popped ahead
        assert actors.config.actor_groups == [[0, 1]]
        assert 1 <= connection.llen(actors.keys.unacknowledged) <= 2


def test_a_nan_reward_is_refused_with_the_fix(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, env_factory=fixtures.make_nan_reward_env,
                      policy=fixtures.mlp_policy(obs_size=1)) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        with pytest.raises(ActorFailedError, match="reward nan .* must be finite"):
            actors.collect_outputs("cpu")


def test_rollouts_too_large_for_one_entry_arrive_once_each_in_order(connection, redis_url, run_name):
    """A 16-step rollout of 32 KB observations is about 0.5 MB: a worker pushes its group of four as four entries
    (each on its own stream of rollout ids), and the learner still gets each actor's rollouts once, in order,
    with their episodes continuing across rollouts."""
    with local_actors(redis_url, run_name, env_factory=fixtures.make_wide_counting_env,
                      policy=fixtures.mlp_policy(obs_size=fixtures.WIDE_OBS_SIZE), n_rollout_steps=16, n_actors=4,
                      batch_size=4, actors_per_job=4) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        batches = [actors.collect_outputs("cpu").record for _ in range(6)]
        assert actors.config.actor_groups == [[0, 1, 2, 3]]
        assert 4 <= connection.llen(actors.keys.unacknowledged) <= 8, (
            "the last batch, one entry per rollout, and the next one if it was popped ahead")
        assert connection.hlen(actors.keys.pushed_rollouts) == 4, "one marker per part of the group"
        assert actors.queue_capacity == actors.max_queue_size == 8
        assert actors.records_rejected == 0
    delivered: dict[int, list[int]] = {}
    for record in batches:
        assert record.obs.shape == (16, 4, fixtures.WIDE_OBS_SIZE)
        for column, (actor, rollout) in enumerate(zip(record.actor_id.tolist(), record.rollout_id.tolist(),
                                                      strict=True)):
            delivered.setdefault(actor, []).append(rollout)
            counts = record.obs[:, column, 0]
            assert torch.all(record.obs[:, column, :] == counts[:, None]), "every float of a step is its count"
            if rollout > 0:
                assert bool(record.continues_previous[column])
    assert {actor: ids for actor, ids in delivered.items()} == {actor: list(range(6)) for actor in range(4)}


def test_with_only_external_workers_the_actors_are_split_over_the_workers_registered(connection, redis_url,
                                                                                     run_name, workers):
    """Issue 25: 8 actors and 2 registered workers make 2 groups of 4 (one batched policy call per step on each
    worker), not 8 jobs of one actor; a given actors_per_job is kept."""
    for index in range(2):
        workers.start(f"split-{index}")
    workers.wait_registered(connection, 2)
    with redis_actors(redis_url, run_name, n_actors=8, batch_size=8, n_local_workers=0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        record = actors.collect_outputs("cpu").record
        assert actors.config.actor_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert set(record.actor_id.tolist()) <= set(range(8))
    with redis_actors(redis_url, f"{run_name}-given", n_actors=8, n_local_workers=0, actors_per_job=1) as actors:
        assert len(actors.config.actor_groups) == 8


def test_waiting_for_workers_splits_the_actors_over_those_that_come_up_with_the_learner(connection, redis_url,
                                                                                         run_name, workers):
    """Compose starts the learner and the workers together: with none registered yet, start() used to make one
    job per actor. With wait_for_workers it waits for the first, then until no more came for 3 s."""
    workers.start("late-0")  # registers in a second or two, while start() waits
    threading.Timer(1.0, workers.start, args=("late-1",)).start()
    actors = redis_actors(redis_url, run_name, n_actors=8, batch_size=8, n_local_workers=0, wait_for_workers=60)
    started = time.monotonic()
    with actors:
        waited = time.monotonic() - started
        assert actors.config.actor_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
        actors.broadcast_updated_policy(actors.policy.state_dict())
        assert actors.collect_outputs("cpu").record.actor_id.numel() == 8
    assert 3 <= waited < 30, waited
