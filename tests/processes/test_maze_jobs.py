"""Job slices on real workers: a group keeps its worker, its envs and its episodes until it has to move."""

from __future__ import annotations

import functools
import importlib
import os
import time

import pytest
import torch

from rqrl.cli.status import read_worker_rates, read_worker_times
from rqrl.engine.rq_safety import RolloutJob, failed_registry, rollout_queue
from tests import fixtures
from tests.children import REPO_ROOT, run_rqrl
from tests.factories import redis_actors
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(120)

local_actors = functools.partial(redis_actors, n_local_workers=1, start_method="fork")


def assert_one_uncut_episode(records: list, n_steps: int) -> None:
    """Each column's first observation counts the steps since the actor's only reset: rollout r starts at
    r * n_steps, so no rollout of the run was cut, re-run or reset."""
    for record in records:
        assert not bool(record.truncated.any()) and not bool(record.terminated.any())
        starts = record.obs[0, :, 0]
        assert starts.tolist() == (record.rollout_id * n_steps).float().tolist()
        assert record.continues_previous.tolist() == (record.rollout_id > 0).tolist()


def test_an_endless_episode_is_not_cut_while_its_worker_holds_the_group(connection, redis_url, run_name):
    """One group on one worker, max_job_seconds = 0.1: slice after slice ends with no job waiting, and each
    goes on in place (before issue 12 every slice cut the episodes, marked truncated)."""
    n_steps = 8
    with local_actors(redis_url, run_name, env_factory=fixtures.make_endless_env, policy=fixtures.mlp_policy(1),
                      n_rollout_steps=n_steps, n_actors=2, batch_size=2, actors_per_job=2,
                      min_job_seconds=0.02, max_job_seconds=0.1) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record]
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # twenty max_job_seconds and more
            records.append(actors.collect_outputs("cpu").record)
    assert_one_uncut_episode(records, n_steps)
    assert {worker for record in records for worker in record.worker} == {records[0].worker[0]}
    assert max(int(record.rollout_id.max()) for record in records) >= 10


def test_a_group_that_moves_cuts_its_episodes_and_marks_the_cut(connection, redis_url, run_name):
    """Two groups, one worker: each job yields to the other one waiting. Every rollout that does not continue
    its predecessor follows a cut marked truncated (with its final observation) and starts from a reset."""
    n_steps = 6
    with local_actors(redis_url, run_name, env_factory=fixtures.make_endless_env, policy=fixtures.mlp_policy(1),
                      n_rollout_steps=n_steps, n_actors=2, batch_size=1, actors_per_job=1,
                      min_job_seconds=0.02) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        delivered: dict[int, list] = {0: [], 1: []}

        def both_moved_twice() -> bool:
            record = actors.collect_outputs("cpu").record
            delivered[int(record.actor_id[0])].append(record)
            return all(sum(not r.continues_previous[0] for r in rs) >= 3 for rs in delivered.values())

        wait_until(both_moved_twice, 60, interval=0, message="each group to move between its jobs twice")
    for records in delivered.values():
        assert [int(r.rollout_id[0]) for r in records] == list(range(len(records)))
        for previous, record in zip(records, records[1:], strict=False):
            cut = bool(previous.truncated[-1, 0])
            assert bool(record.continues_previous[0]) == (not cut)
            assert not bool(previous.truncated[:-1].any())  # the endless env truncates nothing itself
            if cut:
                assert previous.final_obs_index.tolist() == [[n_steps - 1, 0]]
                torch.testing.assert_close(previous.final_obs[0], previous.next_obs[0])
                assert float(record.obs[0, 0, 0]) == 0.0  # a fresh reset


def _until_the_second_delivers(actors, records: list) -> object:
    """Collect into ``records`` until a rollout of the worker named "second" comes; the learner's count of groups it
    re-ran (None: none)."""

    def second_delivered() -> bool:
        records.append(actors.collect_outputs("cpu").record)
        return records[-1].worker == ("second",)

    wait_until(second_delivered, 30, interval=0, message="a rollout by the second worker")
    return actors.get_epoch_stats_aggregator().current().get("groups_rerun")


def _handed_on(records: list, first, reruns: object) -> int:
    """The group went from "first", which exited 0, to "second" by the job itself (the learner re-ran nothing), no
    rollout id lost or repeated; the index of the second worker's first rollout."""
    assert first.returncode == 0
    assert reruns is None  # handed on by the job itself, not re-run by the learner
    assert [int(r.rollout_id[0]) for r in records] == list(range(len(records)))
    handed = next(i for i, r in enumerate(records) if r.worker == ("second",))
    assert all(r.worker == ("first",) for r in records[:handed])
    return handed


def test_a_worker_asked_to_shut_down_hands_its_group_on_with_a_marked_cut(connection, redis_url, run_name, workers):
    """SIGTERM (RQ's warm shutdown) while the worker runs an endless group: the job cuts at its next rollout,
    hands the group to a continuation and ends, so the worker exits at once, and the other worker goes on."""
    n_steps = 8
    first = workers.start("first")
    workers.wait_registered(connection, 1)
    with redis_actors(redis_url, run_name, env_factory=fixtures.make_endless_env, policy=fixtures.mlp_policy(1),
                      n_rollout_steps=n_steps, n_actors=1, batch_size=1, actors_per_job=1) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record for _ in range(3)]
        workers.start("second")
        workers.wait_registered(connection, 2)
        first.terminate()

        def first_exited() -> bool:  # collecting meanwhile: its job may wait for queue space
            records.append(actors.collect_outputs("cpu").record)
            return first.poll() is not None

        # before issue 12 the job kept its worker for max_job_seconds (60 s) after the signal
        wait_until(first_exited, 30, interval=0, message="the first worker to exit after its warm shutdown")

        reruns = _until_the_second_delivers(actors, records)
    handed = _handed_on(records, first, reruns)
    assert bool(records[handed - 1].truncated[-1, 0]) and not bool(records[handed].continues_previous[0])
    assert_one_uncut_episode(records[:handed - 1], n_steps)  # no cut before the shutdown


def test_a_worker_shutting_down_while_the_queue_stays_full_hands_its_rollout_back(connection, redis_url, run_name,
                                                                                  workers):
    """SIGTERM while the job waits for room in a queue its learner does not drain (hung, or killed with its deadline
    still ahead): after the run's shutdown_push seconds the job hands its group back with the rollout in hand
    undelivered, so the worker exits in seconds (it waited for the learner's deadline before: `docker compose stop`
    SIGKILLed it), and the continuation steps that rollout again: no rollout id is lost."""
    first = workers.start("first")
    workers.wait_registered(connection, 1)
    with redis_actors(redis_url, run_name, env_factory=fixtures.make_endless_env, policy=fixtures.mlp_policy(1),
                      n_rollout_steps=8, n_actors=1, batch_size=1, actors_per_job=1, queue_out_of_sync_factor=1.0,
                      learner_timeout=600) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = [actors.collect_outputs("cpu").record]
        wait_until(lambda: actors.queue_size() >= actors.queue_capacity, 30, message="the queue to fill")
        first.terminate()
        wait_until(lambda: first.poll() is not None, 30, message="the first worker to exit, its queue still full")
        # the continuation goes on from the first rollout neither the learner nor the queue holds: the one in hand
        continuation = rollout_queue(actors.config.queue_name, connection).get_jobs()
        assert [list(job.args[1:]) for job in continuation] == [[0, len(records) + actors.queue_size()]]
        workers.start("second")

        reruns = _until_the_second_delivers(actors, records)
    handed = _handed_on(records, first, reruns)
    assert not bool(records[handed].continues_previous[0])  # a fresh reset: the rollout in hand was not delivered


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_episode_longer_than_a_minute_ends_by_itself(connection, redis_url, run_name):
    """A 65 s episode (1300 steps of 50 ms) with the default slicing: it ends terminated at step 1300, never
    truncated, across one job's slices (before issue 12, max_job_seconds = 60 cut it, and every episode)."""
    with local_actors(redis_url, run_name, env_factory=fixtures.make_minute_long_episode_env,
                      policy=fixtures.mlp_policy(1), n_rollout_steps=100, n_actors=1, batch_size=1) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        records = []

        def episode_ended() -> bool:
            records.append(actors.collect_outputs("cpu").record)
            return len(records[-1].episode_lengths) > 0

        wait_until(episode_ended, 150, interval=0, message="the 65 s episode to end")
    assert len(records) == 13
    assert records[-1].episode_lengths.tolist() == [1300] and bool(records[-1].terminated[-1, 0])
    assert not any(bool(record.truncated.any()) for record in records)
    assert [bool(record.continues_previous[0]) for record in records] == [False] + [True] * 12


LEARNER_ONLY_ENV = '''
import gymnasium


def make_env():
    return gymnasium.make("CartPole-v1")
'''


@pytest.mark.parametrize("unfit", ["another-secret", "env-code-missing"])
def test_a_worker_that_cannot_run_the_run_is_sidelined_and_the_run_goes_on(connection, redis_url, run_name, workers,
                                                                           tmp_path, monkeypatch, unfit):
    """Issue 14: one worker with another RQRL_SECRET, or without the env's code, hands the run's jobs back,
    is reported by name (learner, `rqrl status`, RQ's failed registry) and keeps running; the healthy worker
    delivers every actor's rollouts."""
    env_factory, good_env, bad_env = fixtures.make_cartpole, {}, {"RQRL_SECRET": "not-the-learner-secret"}
    if unfit == "env-code-missing":  # a module only the learner and the good worker can import
        (tmp_path / "rqrl_learner_only_env.py").write_text(LEARNER_ONLY_ENV)
        monkeypatch.syspath_prepend(str(tmp_path))
        env_factory = importlib.import_module("rqrl_learner_only_env").make_env
        good_env, bad_env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(tmp_path)])}, {}
    bad = workers.start("bad", env=bad_env)
    workers.start("good", env=good_env)
    workers.wait_registered(connection, 2)
    with redis_actors(redis_url, run_name, env_factory=env_factory, n_actors=4, batch_size=2, actors_per_job=1,
                      min_job_seconds=0.2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        delivered: dict[int, set[str]] = {}

        def collected_from_every_actor_and_saw_the_bad_worker() -> bool:
            record = actors.collect_outputs("cpu").record
            for actor_id, worker in zip(record.actor_id.tolist(), record.worker, strict=True):
                delivered.setdefault(actor_id, set()).add(worker)
            return len(delivered) == 4 and "bad" in actors.sidelined_workers

        wait_until(collected_from_every_actor_and_saw_the_bad_worker, 90, interval=0,
                   message=lambda: f"rollouts of every actor and the bad worker sidelined: {delivered}, "
                                   f"{actors.sidelined_workers}")

        def good_worker_rate() -> float | None:  # published every HEARTBEAT_SECONDS of work
            actors.collect_outputs("cpu")
            return read_worker_rates(connection, actors.keys).get("good")

        assert wait_until(good_worker_rate, 60, interval=0, message="the good worker's steps/s") > 0
        reason = actors.sidelined_workers["bad"]
        assert ("different RQRL_SECRET" if unfit == "another-secret" else "ModuleNotFoundError") in reason, reason
        assert set(actors.sidelined_workers) == {"bad"}
        assert all(workers_seen == {"good"} for workers_seen in delivered.values()), delivered
        status = run_rqrl("status", "--redis-url", redis_url, timeout=60)
        assert f"sidelined bad hands this run's jobs back: {reason}" in status.stdout, status.stdout
        assert "SIDELINED" in next(line for line in status.stdout.splitlines() if line.strip().startswith("bad ")), \
            status.stdout
        assert "steps/s" in next(line for line in status.stdout.splitlines() if line.strip().startswith("good ")), \
            status.stdout
        failed = [RolloutJob.fetch(job_id, connection=connection)
                  for job_id in failed_registry("rqrl", connection).get_job_ids()
                  if job_id.startswith(actors.keys.job_id_prefix)]
        assert failed and all("WorkerUnfitError" in job.latest_result().exc_string for job in failed), failed
    assert bad.poll() is None, "the sidelined worker keeps serving the queue (other runs may suit it)"


@pytest.mark.parametrize(("env_factory", "n_actors", "expected"), [
    # one entry per rollout, pushes sent ahead: rollout 0 goes in, rollout 1 finds the queue full, rollout 2 is
    # stepped, then the worker waits for room (reading rollout 1's reply); rollout 3 is the first stepped after
    (fixtures.make_cartpole, 1, {0: 1, 1: 1, 2: 1, 3: 2}),
    # rollouts of 0.5 MB: each goes in an entry of its own, and a group's entries are all sent ahead as one is;
    # the same order
    (fixtures.make_wide_counting_env, 3, {0: 1, 1: 1, 2: 1, 3: 2}),
], ids=["sent-push", "sent-entries"])
def test_weights_published_while_a_worker_waits_for_room_reach_the_rollout_after_the_wait(
        connection, redis_url, run_name, env_factory, n_actors, expected):
    """A queue of one entry fills; weights published while the worker waits for room reach the first rollout it
    steps after the wait: it asks for weights after waiting, not before (which would leave that rollout a
    version behind)."""
    policy = fixtures.WeightRevealingPolicy()
    with local_actors(redis_url, run_name, env_factory=env_factory, policy=policy, n_rollout_steps=16,
                      n_actors=n_actors, batch_size=n_actors, actors_per_job=n_actors,
                      queue_out_of_sync_factor=1.0) as actors:
        actors.broadcast_updated_policy(fixtures.revealing_state(1))
        wait_until(lambda: actors.queue_size() > 0, 30, message="rollout 0 in the queue")
        time.sleep(1.0)  # rollouts of 16 steps take milliseconds: the worker is waiting for room by now
        actors.broadcast_updated_policy(fixtures.revealing_state(2))
        versions: dict[int, set[int]] = {}

        def last_rollout_delivered() -> bool:
            record = actors.collect_outputs("cpu").record
            for rollout_id, version in zip(record.rollout_id.tolist(), record.policy_version.tolist(), strict=True):
                versions.setdefault(rollout_id, set()).add(version)
            assert torch.all(record.log_probs == record.policy_version.float())
            return max(expected) in versions

        wait_until(last_rollout_delivered, 30, interval=0, message=f"rollout {max(expected)} delivered")
    assert {rollout: versions[rollout] for rollout in expected} == {
        rollout: {version} for rollout, version in expected.items()}


def test_a_worker_that_waited_for_room_sends_no_payload_into_a_full_queue(connection, redis_url, run_name):
    """With a learner slower than its worker, the queue is full whenever the worker pushes: once a push had to wait
    for room, the next rollout's entries wait for room before their payloads go, instead of being sent ahead only
    to be refused and sent again. Redis takes in about what the learner takes out."""
    rollout_bytes = 16 * fixtures.WIDE_OBS_SIZE * 4
    with local_actors(redis_url, run_name, env_factory=fixtures.make_wide_counting_env,
                      policy=fixtures.mlp_policy(obs_size=fixtures.WIDE_OBS_SIZE), n_rollout_steps=16, n_actors=3,
                      batch_size=3, actors_per_job=3, queue_out_of_sync_factor=1.0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())

        def slow_learner_steps(count: int) -> None:
            for _ in range(count):
                time.sleep(0.3)  # the worker steps a rollout in milliseconds: it waits for room by now
                actors.collect_outputs("cpu")

        # the job starts out sending ahead, and learns that the queue is full from the first rollout refused (with
        # the one sent before its reply came): counted out, as it happens once a run
        slow_learner_steps(3)
        before = connection.info("stats")
        slow_learner_steps(6)
        after = connection.info("stats")
    taken_in = after["total_net_input_bytes"] - before["total_net_input_bytes"]
    given_out = after["total_net_output_bytes"] - before["total_net_output_bytes"]
    # the learner pops its next batch ahead, as it trains: the last collect's may not be done at the snapshot
    assert given_out > 5 * 3 * rollout_bytes, "six batches of three rollouts were popped (five by the snapshot)"
    assert taken_in - given_out < 6 * rollout_bytes, (
        f"Redis took in {taken_in:,} bytes and gave out {given_out:,}: payloads were sent into a full queue")


def test_a_group_of_more_entries_than_its_worker_has_connections_delivers_them(connection, redis_url, run_name):
    """Each entry sent ahead holds a connection of the worker's pool until its reply is read: a group cut into more
    entries than the pool holds (redis-py's default: 100, here 8) sends a few ahead and pushes the rest in turn."""
    separator = "&" if "?" in redis_url else "?"
    with local_actors(redis_url, run_name, env_factory=fixtures.make_wide_counting_env,
                      policy=fixtures.mlp_policy(obs_size=fixtures.WIDE_OBS_SIZE), n_rollout_steps=40, n_actors=12,
                      batch_size=12, actors_per_job=12, worker_redis_url=f"{redis_url}{separator}max_connections=8",
                      collect_timeout=60) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        for _ in range(3):
            batch = actors.collect_outputs("cpu").record
            assert sorted(batch.actor_id.tolist()) == list(range(12))
        assert not failed_registry(actors.config.queue_name, connection).get_job_ids()


def test_a_worker_held_up_by_a_slow_learner_says_so_in_its_published_times(connection, redis_url, run_name):
    """A worker publishes where its time went with its steps/s: one that steps a rollout in milliseconds while the
    learner takes a batch every 0.3 s spends most of its time waiting for room in the queue."""
    with local_actors(redis_url, run_name, env_factory=fixtures.make_wide_counting_env,
                      policy=fixtures.mlp_policy(obs_size=fixtures.WIDE_OBS_SIZE), n_rollout_steps=16, n_actors=3,
                      batch_size=3, actors_per_job=3, queue_out_of_sync_factor=1.0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())

        def waiting_for_room() -> dict[str, float] | None:
            time.sleep(0.3)
            actors.collect_outputs("cpu")
            shares = next(iter(read_worker_times(connection, actors.keys).values()), None)
            return shares if shares is not None and shares["room"] > 0.5 else None

        shares = wait_until(waiting_for_room, 60, interval=0, message="a worker's published time waiting for room")
    assert shares["step"] + shares["encode"] < 0.3, shares
    assert sum(shares.values()) <= 1.0 + 1e-3, shares
