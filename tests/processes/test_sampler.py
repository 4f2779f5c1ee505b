"""MultiprocessingSampler / RQSampler against a real Redis and real worker processes (garage's sampler tests,
spec §9, on gymnasium envs; plus staleness, seeding across process counts, failures and kills).

The tests here start processes; the in-process ones are in tests/integration/test_sampler.py.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable

import gymnasium
import numpy as np
import pytest
import redis
import torch

from rqrl import (
    ActorFailedError,
    LocalSampler,
    MultiprocessingSampler,
    NoWorkersError,
    RQSampler,
    SetTaskUpdate,
    StepType,
    WorkerFactory,
)
from rqrl.engine.keys import RunKeys
from rqrl.engine.rq_safety import failed_registry, rollout_queue
from rqrl.engine.timings import TIME_SCALE_VARIABLE
from rqrl.garage.store import STACK, SamplerCall, SamplerStore
from tests import fixtures
from tests.conftest import TEST_SECRET
from tests.integration.test_sampler import make_sampler  # noqa: F401 - shared with the in-process tests
from tests.polling import wait_until
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(120)


def episodes_of(batch) -> list[dict]:
    return batch.to_list()


def collect_seeded(redis_url, n_local_workers: int, workers_per_job: int) -> list:
    policy = fixtures.mlp_policy(seed=3)
    with make_sampler(redis_url, policy, fixtures.make_cartpole(), n_workers=4, seed=11, max_episode_length=60,
                      n_local_workers=n_local_workers, workers_per_job=workers_per_job) as sampler:
        first = sampler.obtain_samples(0, 300, policy.state_dict())
        with torch.no_grad():
            for parameter in policy.parameters():
                parameter.mul_(1.5)
        second = sampler.obtain_samples(0, 300, policy.state_dict())
        exact = sampler.obtain_exact_episodes(2, None)
    return [first, second, exact]


def test_obtain_samples_returns_whole_scripted_episodes_with_bounded_overshoot(connection, redis_url):
    with make_sampler(redis_url, fixtures.VersionPolicy(5), fixtures.make_echo_env(), n_workers=8,
                      n_local_workers=2) as sampler:
        batch = sampler.obtain_samples(0, 1000, None)
        assert sampler.total_env_steps == int(batch.lengths.sum())
    total = int(batch.lengths.sum())
    assert 1000 <= total < 1000 + 10  # one episode of 10 steps at most past num_samples
    assert total - int(batch.lengths[-1]) < 1000  # the shortest prefix: without its last episode it is short
    for episode in episodes_of(batch):
        assert len(episode["actions"]) == 10 and set(episode["actions"].tolist()) == {5}
        assert episode["step_types"][0] == StepType.FIRST and episode["step_types"][-1] == StepType.TERMINAL
        assert episode["observations"][:, 0].tolist() == list(range(10))
    assert batch.last_observations[:, 0].tolist() == [10.0] * len(batch.lengths)


def test_obtain_exact_episodes_in_worker_order_with_the_seed_page_call_form(connection, redis_url):
    factory = WorkerFactory(max_episode_length=100, n_workers=4, seed=0)
    policies = [fixtures.VersionPolicy(w) for w in range(4)]  # a list: one per logical worker
    assert type(MultiprocessingSampler.from_worker_factory(factory, policies, fixtures.make_echo_env())) is RQSampler
    sampler = MultiprocessingSampler(factory, policies, fixtures.make_echo_env(), redis_url=redis_url,
                                     secret=TEST_SECRET, n_local_workers=2, start_method="fork", progress=False)
    with sampler:
        batch = sampler.obtain_exact_episodes(3, None)
        assert [int(a[0]) for a in batch.actions_list] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
        assert batch.lengths.tolist() == [10] * 12
        # the next call runs on: 2 episodes each, still in worker order
        batch = sampler.obtain_exact_episodes(2, [{"value": np.asarray(10 + w)} for w in range(4)])
    assert [int(a[0]) for a in batch.actions_list] == [10, 10, 11, 11, 12, 12, 13, 13]


def test_lists_spread_one_per_worker_and_other_values_go_whole_to_every_worker(connection, redis_url):
    tasks = [SetTaskUpdate(fixtures.EchoEnv, task=10 * w) for w in range(3)]
    with make_sampler(redis_url, fixtures.VersionPolicy(1), tasks, n_workers=3) as sampler:
        batch = sampler.obtain_exact_episodes(1, None)  # envs from a list of task updates (garage's init test)
        assert [float(r[0]) for r in batch.split() for r in [r.rewards]] == [0.0, 10.0, 20.0]
        batch = sampler.obtain_exact_episodes(1, None, [SetTaskUpdate(fixtures.EchoEnv, task=w + 1) for w in range(3)])
        assert [float(e.rewards[0]) for e in batch.split()] == [1.0, 2.0, 3.0]
        batch = sampler.obtain_exact_episodes(1, fixtures.VersionPolicy(7),  # a policy object replaces every agent
                                              SetTaskUpdate(fixtures.EchoEnv, task=4))
        assert [float(e.rewards[0]) for e in batch.split()] == [4.0] * 3
        assert set(batch.actions.tolist()) == {7}
        with pytest.raises(ValueError, match="Length of list doesn't match number of workers"):
            sampler.obtain_exact_episodes(1, None, [SetTaskUpdate(fixtures.EchoEnv, task=0)] * 4)
        with pytest.raises(TypeError, match="Unknown environment update type"):
            sampler.obtain_exact_episodes(1, None, 42)
        # a dict is not spread: it goes whole to every worker (as parameters)
        batch = sampler.obtain_exact_episodes(1, {"value": np.asarray(9)})
        assert set(batch.actions.tolist()) == {9}
    with pytest.raises(ValueError, match="Length of list"):
        make_sampler(redis_url, [fixtures.VersionPolicy(0)] * 2, fixtures.make_echo_env(), n_workers=3)


def test_no_stale_step_when_updates_land_mid_episode(connection, redis_url):
    """Slow episodes (10 steps of 10 ms) on 4 logical workers and 2 processes: every call's update lands while
    other workers are mid-episode; every step returned shows the call's own version, and the episodes that
    were in flight are dropped and counted."""
    with make_sampler(redis_url, fixtures.VersionPolicy(0), fixtures.make_slow_echo_env(), n_workers=4,
                      n_local_workers=2, workers_per_job=1) as sampler:
        for version in range(1, 7):
            batch = sampler.obtain_samples(0, 40, {"value": np.asarray(version)})
            assert set(batch.actions.tolist()) == {version}
            assert set(batch.agent_infos["value"].tolist()) == {version}
            assert int(batch.lengths.sum()) >= 40
        # groups 0 and 1 ran to their quota (40 steps each) before groups 2 and 3 got a process
        assert sampler.dropped_episodes > 0


@pytest.mark.parametrize("module_policy", [False, True], ids=["one-by-one", "lockstep"])
def test_a_job_drops_its_episodes_in_flight_once_the_call_is_over(connection, redis_url, run_name, module_policy):
    """Worker 0's 5-step episode ends the call while worker 1 is early in a 400-step one (20 s): the job sees the
    call is over within OVER_CHECK_SECONDS and drops it unfinished (counted as dropped), where it used to run it to
    the end, have it refused as stale and hold the process from the next call meanwhile. A garage agent's episodes
    run one by one, a module's in lockstep."""
    envs = [fixtures.EchoEnv(length=5, step_sleep=0.05), fixtures.EchoEnv(length=400, step_sleep=0.05)]
    policy = torch.nn.Linear(3, 64) if module_policy else fixtures.VersionPolicy(0)
    with make_sampler(redis_url, policy, envs, n_workers=2, workers_per_job=2, max_episode_length=500,
                      run_name=run_name) as sampler:
        updates = [policy.state_dict() if module_policy else {"value": np.asarray(v)} for v in (1, 2)]
        first = sampler.obtain_samples(0, 5, updates[0])
        started = time.monotonic()
        second = sampler.obtain_samples(0, 5, updates[1])
        waited = time.monotonic() - started
        assert first.lengths.tolist()[:1] == [5] and second.lengths.tolist()[:1] == [5]
        stale_key = RunKeys(run_name).sampler_stale  # counted there until the next call adds it to dropped_episodes
        wait_until(lambda: sampler.dropped_episodes + int(connection.get(stale_key) or 0) >= 2, 10,
                   message="both calls' unfinished episodes of worker 1 counted as dropped")
    assert waited < 15, f"the second call waited {waited:.1f} s for the first call's job"


def test_return_extras_returns_the_seeded_prefix_then_the_calls_other_episodes(connection, redis_url):
    """With return_extras the episodes past the round-robin prefix come too (after it, each whole and of the
    call's own version), where the default drops them; the prefix is the seeded one of the default sampler."""
    policy = fixtures.mlp_policy(seed=3)
    with make_sampler(redis_url, policy, fixtures.make_cartpole(), n_workers=4, seed=11, max_episode_length=60,
                      workers_per_job=1, return_extras=True) as sampler:
        with_extras = [sampler.obtain_samples(0, 300, policy.state_dict()) for _ in range(3)]
        kept_dropped = sampler.dropped_episodes
    local = LocalSampler(policy, fixtures.make_cartpole(), n_workers=4, seed=11, max_episode_length=60)
    prefixes = [local.obtain_samples(0, 300, policy.state_dict()) for _ in range(3)]
    local.shutdown_worker()
    extras = 0
    for batch, prefix in zip(with_extras, prefixes, strict=True):
        count = len(prefix.lengths)
        np.testing.assert_array_equal(batch.lengths[:count], prefix.lengths)
        np.testing.assert_array_equal(batch.actions[: int(prefix.lengths.sum())], prefix.actions)
        assert (batch.step_types[np.cumsum(batch.lengths) - 1] != StepType.MID).all()  # every episode whole
        extras += len(batch.lengths) - count
    assert extras > 0, "4 logical workers, 1 per job: the first groups run ahead of the prefix"
    assert kept_dropped < extras, (kept_dropped, extras)


def test_same_seed_gives_identical_episodes_on_one_and_two_processes(connection, redis_url):
    one = collect_seeded(redis_url, n_local_workers=1, workers_per_job=4)
    two = collect_seeded(redis_url, n_local_workers=2, workers_per_job=1)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.agent_infos["log_prob"], b.agent_infos["log_prob"])
    # the first episode of worker w is seeded with seed + w; later calls do not replay the same starts
    first_obs = one[0].observations[np.concatenate([[0], np.cumsum(one[0].lengths)[:-1]])]
    env = fixtures.make_cartpole()
    for w in range(4):
        np.testing.assert_array_equal(first_obs[w], env.reset(seed=11 + w)[0])
    assert not np.array_equal(one[0].observations[:5], one[1].observations[:5])


def test_step_types_timeout_terminal_and_last_observations(connection, redis_url):
    limited = gymnasium.wrappers.TimeLimit(fixtures.EchoEnv(length=100), max_episode_steps=3)
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.EchoEnv(length=5), n_workers=2,
                      max_episode_length=5) as sampler:
        terminal = sampler.obtain_exact_episodes(1, None)  # terminated on the last allowed step: TERMINAL
        cut = sampler.obtain_exact_episodes(1, None, fixtures.EchoEnv(length=50))  # the worker's limit: TIMEOUT
        truncated = sampler.obtain_exact_episodes(1, None, limited)  # the env truncated: TIMEOUT
    assert terminal.step_types.tolist() == [StepType.FIRST, *[StepType.MID] * 3, StepType.TERMINAL] * 2
    assert cut.step_types.tolist() == [StepType.FIRST, *[StepType.MID] * 3, StepType.TIMEOUT] * 2
    assert truncated.step_types.tolist() == [StepType.FIRST, StepType.MID, StepType.TIMEOUT] * 2
    assert terminal.last_observations[:, 0].tolist() == [5.0, 5.0]  # the observation after the final action
    assert truncated.last_observations[:, 0].tolist() == [3.0, 3.0]


def test_frame_stack_episodes_cross_redis_as_unique_frames_and_arrive_whole(connection, redis_url):
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_frame_stack_env(40, size=48),
                      n_workers=2, max_episode_length=40) as sampler:
        sampler.obtain_exact_episodes(1, None)
        before = connection.info("stats")["total_net_input_bytes"]
        batch = sampler.obtain_exact_episodes(3, None)
        pushed = connection.info("stats")["total_net_input_bytes"] - before
    obs = batch.observations
    assert obs.dtype == np.uint8 and obs.shape == (6 * 11, 4, 48, 48)  # FrameEnv terminates after 11 steps
    assert pushed < 0.5 * (obs.nbytes + batch.last_observations.nbytes), f"{pushed} bytes into Redis"
    for episode in batch.split():
        stacks = episode.observations
        assert (stacks[1:, :3] == stacks[:-1, 1:]).all(), "each stack is the last one shifted by a frame"
        assert (episode.last_observations[0, :3] == stacks[-1, 1:]).all()


def test_an_env_that_raises_reaches_the_caller_with_the_workers_traceback(connection, redis_url, run_name):
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_failing_env(), n_workers=2,
                      run_name=run_name) as sampler:
        with pytest.raises(ActorFailedError, match="logical worker") as raised:
            sampler.obtain_samples(0, 500, None)
        assert "CountingEnv exploded" in raised.value.remote_traceback
        # the failure is the call's: the next one runs again (and fails again, the env being what it is)
        with pytest.raises(ActorFailedError):
            sampler.obtain_exact_episodes(1, None)
    assert list(connection.scan_iter(match=RunKeys(run_name).pattern)) == []


def test_a_policy_whose_reset_raises_is_reported_not_hung(connection, redis_url):
    """garage's test_init_with_crashed_worker, where garage goes on silently: rqrl raises with the traceback."""
    with make_sampler(redis_url, fixtures.VersionPolicy(1, fail_on_reset=True), fixtures.make_echo_env(),
                      n_workers=2) as sampler:
        with pytest.raises(ActorFailedError) as raised:
            sampler.obtain_samples(0, 160, None)
    assert "reset exploded" in raised.value.remote_traceback


def test_pickled_sampler_starts_afresh_after_shutdown(connection, redis_url):
    sampler = make_sampler(redis_url, fixtures.VersionPolicy(2), fixtures.make_echo_env(), n_workers=2)
    sampler.obtain_samples(0, 20, None)
    first_run = sampler.config.run_name
    copy = pickle.loads(pickle.dumps(sampler))
    sampler.shutdown_worker()
    with copy:
        assert copy.total_env_steps == 0
        batch = copy.obtain_samples(0, 20, None)
        assert copy.config.run_name != first_run
    assert set(batch.actions.tolist()) == {2} and int(batch.lengths.sum()) >= 20


def test_shutdown_leaves_no_key_job_or_process(connection, redis_url, run_name):
    sampler = make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_slow_echo_env(), n_workers=4,
                           n_local_workers=2, run_name=run_name)
    with sampler:
        sampler.obtain_samples(0, 30, None)  # jobs of the last call are still finishing their episodes
        processes = list(sampler._local.processes)
    assert processes and not any(process.is_alive() for process in processes)
    assert list(connection.scan_iter(match=RunKeys(run_name).pattern)) == []
    job_keys = [key for key in connection.scan_iter(match="rq:job:*") if run_name.encode() in key]
    assert job_keys == []
    assert connection.llen("rq:queue:rqrl") == 0


def test_the_progress_bar_shows_by_default_on_a_terminal_and_switches_off(connection, redis_url, capsys,
                                                                         monkeypatch):
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2,
                      progress=True) as sampler:
        sampler.obtain_samples(0, 30, None)
        assert "Sampling" not in capsys.readouterr().err, "no bar in a file or a pipe"
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal
        sampler.obtain_samples(1, 30, None)
        assert "Sampling" in capsys.readouterr().err
        sampler.progress = False
        sampler.obtain_exact_episodes(2, None)
        assert "Sampling" not in capsys.readouterr().err


def test_the_local_sampler_returns_exactly_the_episodes_of_the_distributed_one(connection, redis_url):
    distributed = collect_seeded(redis_url, n_local_workers=2, workers_per_job=1)
    policy = fixtures.mlp_policy(seed=3)
    sampler = LocalSampler(policy, fixtures.make_cartpole(), n_workers=4, seed=11, max_episode_length=60)
    first = sampler.obtain_samples(0, 300, policy.state_dict())
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.mul_(1.5)
    local = [first, sampler.obtain_samples(0, 300, policy.state_dict()), sampler.obtain_exact_episodes(2, None)]
    sampler.shutdown_worker()
    for a, b in zip(distributed, local, strict=True):
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
    assert sampler.total_env_steps == sum(int(batch.lengths.sum()) for batch in local)


def test_envs_drawing_from_global_rngs_get_each_workers_own_streams_as_in_the_local_sampler(connection, redis_url):
    # 4 workers in one job step together (one batched forward per step) until a draw from a global RNG is seen;
    # then the job re-runs their episodes one at a time on each worker's own global streams
    policy = fixtures.mlp_policy(seed=3)
    options = {"n_workers": 4, "seed": 11, "max_episode_length": 30}
    with make_sampler(redis_url, policy, fixtures.make_global_random_cartpole(), workers_per_job=4,
                      **options) as sampler:
        distributed = sampler.obtain_exact_episodes(2, policy.state_dict())
    local = LocalSampler(policy, fixtures.make_global_random_cartpole(), **options).obtain_exact_episodes(
        2, policy.state_dict())
    np.testing.assert_array_equal(distributed.lengths, local.lengths)
    np.testing.assert_array_equal(distributed.rewards, local.rewards)
    np.testing.assert_array_equal(distributed.actions, local.actions)


def test_more_groups_than_processes_do_not_run_far_ahead_of_the_round_robin_prefix(connection, redis_url):
    # 4 one-worker groups on one process: a job whose worker is 2 episodes ahead of the slowest other worker
    # hands the process to a waiting job, so a call drops a few episodes, not each worker's whole quota
    # (num_samples steps of its own: ~60 episodes a call here before pacing)
    # (unpaced: 125 over 3 calls; paced: about 4 a call). Judged per call, by the median of three calls: on a
    # loaded CI machine a run once dropped 65 in all, so one disturbed call must not fail the test
    policy = fixtures.mlp_policy(seed=3)
    dropped = []
    with make_sampler(redis_url, policy, fixtures.make_cartpole(), n_workers=4, seed=11, max_episode_length=60,
                      workers_per_job=1) as sampler:
        for _ in range(3):
            before = sampler.dropped_episodes
            assert int(sampler.obtain_samples(0, 400, policy.state_dict()).lengths.sum()) >= 400
            dropped.append(sampler.dropped_episodes - before)
    assert sorted(dropped)[1] <= 20, dropped


@pytest.mark.slow
def test_a_killed_worker_process_loses_no_episode(connection, redis_url, workers):
    """Two `rqrl worker` processes (one serves actors and samplers alike); one is SIGKILLed mid-call: its
    logical worker re-runs on the other from its recorded progress, and the result is exactly what an
    undisturbed run gives."""

    def run(kill: bool):
        with make_sampler(redis_url, fixtures.VersionPolicy(3), fixtures.make_slow_echo_env(), n_workers=2,
                          n_local_workers=0, seed=5, workers_per_job=1) as sampler:
            killer = None
            if kill:
                sampler.start_worker()
                progress_key = sampler.keys.sampler_next(1)

                def kill_one():  # once both logical workers have pushed 2 episodes (of 12)
                    wait_until(lambda: all(int(connection.hget(progress_key, w) or 0) >= 2 for w in ("0", "1")), 30)
                    workers.processes[0].send_signal(signal.SIGKILL)

                killer = threading.Thread(target=kill_one, daemon=True)
                killer.start()
            batch = sampler.obtain_exact_episodes(12, None)
            if killer is not None:
                killer.join(5)
            return batch, sampler.groups_rerun

    workers.start("w1")
    workers.start("w2")
    workers.wait_registered(connection, 2)
    reference, _ = run(kill=False)
    killed, rerun = run(kill=True)
    assert rerun >= 1
    assert killed.lengths.tolist() == reference.lengths.tolist() == [10] * 24
    np.testing.assert_array_equal(killed.observations, reference.observations)


def test_one_rqrl_worker_serves_actors_and_samplers(connection, redis_url, workers):
    from tests.factories import redis_actors

    workers.start("both")
    workers.wait_registered(connection, 1)
    with redis_actors(redis_url, n_local_workers=0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        assert actors.collect_outputs("cpu").record.rewards.shape == (16, 2)
    with make_sampler(redis_url, fixtures.VersionPolicy(4), fixtures.make_echo_env(), n_workers=3,
                      n_local_workers=0) as sampler:
        batch = sampler.obtain_exact_episodes(2, None)
    assert batch.lengths.tolist() == [10] * 6 and set(batch.actions.tolist()) == {4}


@pytest.mark.parametrize("group_id, version", [(5, 1), (-1, 1), ("0", 1), (0, 0)],
                         ids=["group-outside", "group-minus-one", "group-as-text", "version-zero"])
def test_a_sampler_job_no_sampler_enqueues_is_refused_and_not_reported(connection, redis_url, run_name, group_id,
                                                                       version):
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2,
                      run_name=run_name) as sampler:
        sampler.obtain_exact_episodes(1, None)
        forged = rollout_queue("rqrl", connection).enqueue("rqrl.garage.jobs.run_sampler_group", run_name,
                                                           group_id, version, job_id=f"forged-{run_name}",
                                                           result_ttl=0)
        failed = failed_registry("rqrl", connection)
        wait_until(lambda: forged.id in failed.get_job_ids(), 30, message="the forged job failing")
        assert "ForbiddenJobError" in (forged.fetch(forged.id, connection).exc_info or "")
        batch = sampler.obtain_exact_episodes(1, None)  # no ActorFailedError: the refusal is not the run's failure
    assert batch.lengths.tolist() == [10, 10]


def test_a_sampler_job_for_a_run_that_is_no_sampler_is_refused(connection, redis_url, run_name):
    from tests.factories import redis_actors

    with redis_actors(redis_url, run_name, n_local_workers=1, start_method="fork") as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")
        forged = rollout_queue("rqrl", connection).enqueue("rqrl.garage.jobs.run_sampler_group", run_name, 0, 1,
                                                           job_id=f"forged-{run_name}", result_ttl=0)
        failed = failed_registry("rqrl", connection)

        def refused() -> bool:
            actors.collect_outputs("cpu")  # the running actor job yields to the forged one within min_job_seconds
            return forged.id in failed.get_job_ids()

        wait_until(refused, 30, message="the forged job failing")
        assert "not a sampler run" in (forged.fetch(forged.id, connection).exc_info or "")


def test_an_episode_longer_than_hang_seconds_is_not_taken_for_a_hung_job(connection, redis_url):
    """Episodes of 2 s against hang_seconds=1: the job touches its lease at every step, so no re-run (touched
    only per episode, the lease would lapse and the reaper re-run the group within the call's 10 s)."""
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_very_slow_echo_env(), n_workers=1,
                      hang_seconds=1.0) as sampler:
        batch = sampler.obtain_exact_episodes(5, None)
        assert sampler.groups_rerun == 0
    assert batch.lengths.tolist() == [8] * 5


def test_a_worker_with_another_secret_is_sidelined_and_the_sampler_goes_on(connection, redis_url, run_name, workers):
    """Issue 14, for the sampler's jobs: the bad worker hands its jobs back and is named; the good one samples."""
    workers.start("bad", env={"RQRL_SECRET": "not-the-learner-secret"})
    workers.start("good")
    workers.wait_registered(connection, 2)
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=4,
                      n_local_workers=0, run_name=run_name, min_job_seconds=0.2) as sampler:
        batches = []

        def sampled_and_saw_the_bad_worker() -> bool:
            batches.append(sampler.obtain_exact_episodes(1, None))
            return "bad" in sampler.sidelined_workers

        wait_until(sampled_and_saw_the_bad_worker, 90, interval=0,
                   message=lambda: f"the bad worker sidelined: {sampler.sidelined_workers}")
        assert "different RQRL_SECRET" in sampler.sidelined_workers["bad"]
        assert set(sampler.sidelined_workers) == {"bad"}
        assert all(batch.lengths.tolist() == [10] * 4 for batch in batches), [b.lengths for b in batches]


@pytest.mark.parametrize("forgery", ["unsigned rewrite", "call 1 copied"])
def test_a_call_spec_a_redis_writer_replaced_is_run_by_no_worker_process(connection, redis_url, run_name, forgery,
                                                                          monkeypatch):
    """Issue 24, item 6, with a real worker process: the moment the learner writes call 2, a Redis writer replaces
    it (every agent chain back to the initial agent, unsigned; or call 1's signed spec copied over it). The worker
    refuses it, and obtain_samples raises instead of returning episodes sampled under other parameters."""
    begin = SamplerStore.begin

    def begin_then_forge(store, version, call, blobs, key):
        begin(store, version, call, blobs, key)
        if version == 2:
            forged = (SamplerCall(call.mode, call.count, [[(0, -1, STACK)]] * len(call.agent_chains),
                                  call.env_chains).to_json() if forgery == "unsigned rewrite"
                      else connection.get(store.keys.sampler_call(1)))
            connection.set(store.keys.sampler_call(2), forged)

    monkeypatch.setattr(SamplerStore, "begin", begin_then_forge)
    policy = fixtures.mlp_policy(seed=3)
    with make_sampler(redis_url, policy, fixtures.make_cartpole(), n_workers=2, run_name=run_name,
                      max_episode_length=20) as sampler:
        sampler.obtain_samples(0, 40, policy.state_dict())
        with pytest.raises(ActorFailedError, match="SignatureError"):
            sampler.obtain_samples(1, 40, policy.state_dict())


@pytest.fixture
def restartable(tmp_path_factory):
    """A private Redis without persistence on a fixed unix socket: one URL across restarts."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.start()
    server.stop()


def restart_once(server: RedisServer, when: Callable[[], bool], pause: float) -> threading.Thread:
    """A thread that SIGKILLs ``server`` once ``when()`` holds, and starts it again ``pause`` s later."""
    def run() -> None:
        wait_until(when, 30, message="the moment to restart Redis")
        server.kill()
        time.sleep(pause)
        server.start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_redis_restart_without_persistence_loses_neither_the_run_nor_the_call_in_flight(restartable):
    """Redis loses every key twice under a sampler with local workers: between two calls, and in the middle of one
    (its workers 4 episodes in). The sampler stores the run again each time and every call returns exactly the
    seeded episodes the LocalSampler gives, where the next call used to time out."""
    options = {"n_workers": 4, "seed": 3, "max_episode_length": 20}
    local = LocalSampler(fixtures.VersionPolicy(0), fixtures.EchoEnv(length=10), **options)
    with make_sampler(restartable.url, fixtures.VersionPolicy(0), fixtures.make_slow_echo_env(), n_local_workers=2,
                      workers_per_job=2, redis_outage_seconds=30, collect_timeout=30, **options) as sampler:
        assert_same(sampler.obtain_exact_episodes(2, {"value": np.asarray(1)}),
                    local.obtain_exact_episodes(2, {"value": np.asarray(1)}))
        restartable.kill()
        restartable.start()
        assert_same(sampler.obtain_samples(0, 200, {"value": np.asarray(2)}),
                    local.obtain_samples(0, 200, {"value": np.asarray(2)}))
        probe = redis.Redis.from_url(restartable.url)
        progress_key = sampler.keys.sampler_next(3)
        restarter = restart_once(restartable, lambda: int(probe.hget(progress_key, "0") or 0) >= 4, pause=0.3)
        batch = sampler.obtain_exact_episodes(16, {"value": np.asarray(3)})
        restarter.join(10)
        probe.close()
        assert sampler.runs_restored == 2
    assert_same(batch, local.obtain_exact_episodes(16, {"value": np.asarray(3)}))
    assert set(batch.actions.tolist()) == {3}


def assert_same(batch, expected) -> None:
    assert batch.lengths.tolist() == expected.lengths.tolist()
    np.testing.assert_array_equal(batch.observations, expected.observations)
    np.testing.assert_array_equal(batch.actions, expected.actions)


def test_an_embedded_redis_that_dies_is_said_at_once_not_waited_for(monkeypatch):
    from rqrl import RedisUnavailableError

    monkeypatch.delenv("REDIS_URL", raising=False)
    with make_sampler(None, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2,
                      redis_outage_seconds=60) as sampler:
        sampler.obtain_exact_episodes(1, None)
        server = sampler._local.server
        server.process.kill()
        server.process.wait(10)
        started = time.monotonic()
        with pytest.raises(RedisUnavailableError, match=r"the embedded redis-server \(pid \d+\) exited with code -9"):
            sampler.obtain_exact_episodes(1, None)
        assert time.monotonic() - started < 10, "it rode out the 60 s outage window for a server that is gone"


def test_local_workers_all_killed_give_no_workers_error_within_seconds(connection, redis_url, monkeypatch):
    """Every local worker SIGKILLed: NoWorkersError names their exit codes at once, not after their last heartbeats
    age past the liveness window (20 s at the production timings this test runs with)."""
    monkeypatch.setenv(TIME_SCALE_VARIABLE, "1")
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2,
                      n_local_workers=2) as sampler:
        sampler.obtain_exact_episodes(1, None)
        for process in sampler._local.processes:
            os.kill(process.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(NoWorkersError, match=r"all 2 local worker processes exited"):
            sampler.obtain_exact_episodes(1, None)
        assert time.monotonic() - started < 3
