"""A Redis writer without the run's secret forges records and weights: real worker processes, a real Redis.

Each attack pushes what an attacker can build from what Redis shows (the run id is in the run's config):
records in the run's wire format, or weights and a ``weights:latest`` pointer. The learner must reject and
count every forged record, keep delivering real rollouts from every actor, and never raise; workers must
refuse forged weights and keep running on the weights they have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from rqrl.engine.codec import encode_state_dict
from rqrl.maze.group_records import encode_group
from rqrl.maze.stats import RolloutEvents
from tests import fixtures
from tests.children import WorkerProcesses
from tests.factories import redis_actors, rollout_record
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(120)

STEPS = 16
N_ACTORS = 2


@contextlib.contextmanager
def running(redis_url: str, run_name: str, **options: Any) -> Iterator[Any]:
    """A started run of CartPole with 2 actors in one local worker process (forked), stopped after."""
    options.setdefault("n_local_workers", 1)
    options.setdefault("start_method", "fork")
    options.setdefault("collect_timeout", 30)
    actors = redis_actors(redis_url, run_name, n_rollout_steps=STEPS, n_actors=N_ACTORS, batch_size=2, **options)
    actors.start()
    try:
        yield actors
    finally:
        actors.stop()


def forged(run_id: str, **changes: Any) -> bytes:
    """A record shaped like the run's real CartPole rollouts (obs [T, 4] float32, logits [T, 2]), as an attacker
    without the secret encodes it; ``changes`` replace fields of the record."""
    record = rollout_record(STEPS, obs_size=4, logits=True, actor_id=0, rollout_id=10_000, policy_version=1)
    return encode_group([dataclasses.replace(record, **changes)], run_id)


def collect_batches(actors: Any, count: int) -> list[Any]:
    """``count`` batches from collect_outputs; any exception fails the test."""
    return [actors.collect_outputs("cpu").record for _ in range(count)]


def assert_real(batches: list[Any]) -> None:
    """Every delivered rollout is one a worker made: finite rewards of CartPole (1 per step), ids in range,
    versions the learner published, final observations inside the batch; every actor delivered."""
    actors_seen = set()
    for batch in batches:
        assert batch.rewards.shape == (STEPS, 2)
        if len(batch.final_obs_index):
            assert torch.all(batch.final_obs_index[:, 0] < STEPS) and torch.all(batch.final_obs_index[:, 1] < 2)
        assert torch.all(torch.isfinite(batch.log_probs)), batch.log_probs
        assert torch.all((batch.policy_version >= 1) & (batch.policy_version <= 10)), batch.policy_version
        assert torch.all(batch.rewards == 1.0), batch.rewards
        assert torch.all(batch.rollout_id < 10_000), batch.rollout_id
        actors_seen.update(batch.actor_id.tolist())
    assert actors_seen == set(range(N_ACTORS)), f"actors {sorted(actors_seen)} delivered, expected every actor"


ATTACKS = {
    "reward 1e6": dict(rewards=np.full(STEPS, 1e6, np.float32)),
    "NaN rewards": dict(rewards=np.full(STEPS, np.nan, np.float32)),
    "final_obs_index out of range": dict(truncated=np.eye(STEPS, dtype=bool)[3], final_obs_steps=np.array([999]),
                                         final_obs=np.zeros((1, 4), np.float32)),
    "wrong-shape next_obs": dict(next_obs=np.zeros(7, np.float32)),
    "policy_version 2**63": dict(policy_version=2**63),
    "rollout id 1e9": dict(rollout_id=10**9),
    "NaN log-probs": dict(log_probs=np.full(STEPS, np.nan, np.float32)),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_forged_record_is_rejected_and_counted_and_real_data_keeps_coming(connection, redis_url, run_name, attack):
    with running(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        first = collect_batches(actors, 1)  # the run's real rollouts flow
        connection.lpush(actors.keys.trajectories, forged(actors.config.run_id, **ATTACKS[attack]))
        later = collect_batches(actors, 4)
        assert_real(first + later)
        assert actors.records_rejected == 1
        assert actors.get_stats_value(RolloutEvents.records_rejected, name="sum") == 1


def test_forged_rollout_ids_for_every_actor_do_not_stall_the_run(connection, redis_url, run_name):
    with running(redis_url, run_name, collect_timeout=20) as actors:
        connection.rpush(actors.keys.trajectories,
                         *[forged(actors.config.run_id, actor_id=actor, rollout_id=10**9) for actor in range(N_ACTORS)])
        actors.broadcast_updated_policy(actors.policy.state_dict())
        assert_real(collect_batches(actors, 4))
        assert actors.records_rejected == N_ACTORS


def test_a_float64_record_pushed_first_does_not_make_real_records_rejected(connection, redis_url, run_name):
    with running(redis_url, run_name, collect_timeout=20) as actors:
        float64 = {name: np.zeros((STEPS, 4)) if name == "obs" else np.zeros(STEPS) for name in ("obs", "rewards")}
        connection.rpush(actors.keys.trajectories, forged(actors.config.run_id, rollout_id=0, **float64))
        actors.broadcast_updated_policy(actors.policy.state_dict())
        assert_real(collect_batches(actors, 3))
        assert actors.records_rejected == 1


def test_a_forged_latest_weights_version_is_refused_by_workers_and_the_learner(connection, redis_url, run_name):
    policy = fixtures.WeightRevealingPolicy()
    with running(redis_url, run_name, env_factory=fixtures.make_counting_env, policy=policy) as actors:
        keys = actors.keys
        huge = 2**63
        # planted before the learner's first broadcast: the learner must not count on from it either
        connection.set(keys.weights(huge), encode_state_dict(fixtures.revealing_state(666.0), {"version": str(huge)}))
        connection.set(keys.latest_version, huge)
        actors.broadcast_updated_policy(fixtures.revealing_state(1.0))
        assert actors.policy_version == 1
        batches = collect_batches(actors, 3)
        # a forged blob under the learner's own next version number, pointed at as the latest
        connection.set(keys.weights(2), encode_state_dict(fixtures.revealing_state(666.0), {"version": "2"}))
        connection.set(keys.latest_version, 2)
        batches += collect_batches(actors, 3)
        actors.broadcast_updated_policy(fixtures.revealing_state(3.0))  # the learner's real version 2
        assert actors.policy_version == 2

        def real_version_2_arrives() -> bool:
            batch = actors.collect_outputs("cpu").record
            batches.append(batch)
            return 2 in batch.policy_version.tolist()

        wait_until(real_version_2_arrives, 30, message="the learner's version 2 to reach the workers")
        for batch in batches:
            for column, version in enumerate(batch.policy_version.tolist()):
                assert version in (1, 2)
                # every step carries the weight of a version the learner published, never the forged 666
                assert torch.all(batch.log_probs[:, column] == {1: 1.0, 2: 3.0}[version])
        assert actors.workers_alive(cached=False) == 1
        assert actors.records_rejected == 0


def test_a_tampered_byte_in_a_real_record_is_rejected(connection, redis_url, run_name):
    with running(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        wait_until(lambda: connection.llen(actors.keys.trajectories) >= 1, 30, message="a real rollout queued")
        blob = connection.lpop(actors.keys.trajectories)
        tampered = blob.replace(np.ones(STEPS, np.float32).tobytes(), np.full(STEPS, 1e6, np.float32).tobytes())
        assert tampered != blob, "the rewards (1.0 at every step of CartPole) are in the record's bytes"
        connection.lpush(actors.keys.trajectories, tampered)
        batches = collect_batches(actors, 4)
        assert_real(batches)
        assert actors.records_rejected == 1
        assert actors.records_rejected_by_reason == {"unauthenticated": 1}


def test_external_workers_with_the_secret_deliver_and_forgeries_are_still_rejected(connection, redis_url, run_name):
    workers = WorkerProcesses(redis_url)
    try:
        workers.start("auth-w1")
        workers.wait_registered(connection, 1)
        actors = redis_actors(redis_url, run_name, n_rollout_steps=STEPS, n_actors=N_ACTORS, batch_size=2,
                              actors_per_job=N_ACTORS, collect_timeout=30)  # one job steps both actors
        with actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            first = collect_batches(actors, 1)
            connection.lpush(actors.keys.trajectories, forged(actors.config.run_id, rewards=np.full(STEPS, 1e6)),
                             forged(actors.config.run_id, actor_id=1, rollout_id=10**9))
            batches = first + collect_batches(actors, 3)
            assert_real(batches)
            assert all(worker.startswith("auth-w1") for batch in batches for worker in batch.worker)
            assert actors.records_rejected == 2
    finally:
        workers.stop_all()


def test_forged_records_never_raise_across_many_collects(connection, redis_url, run_name):
    """Every attack at once, interleaved with real rollouts, over many batches."""
    with running(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        batches = collect_batches(actors, 1)
        for changes in ATTACKS.values():
            connection.lpush(actors.keys.trajectories, forged(actors.config.run_id, **changes))
            batches += collect_batches(actors, 1)
        assert_real(batches + collect_batches(actors, 2))
        assert actors.records_rejected == len(ATTACKS)
        assert math.isclose(actors.get_stats_value(RolloutEvents.records_rejected, name="sum"), len(ATTACKS))


def test_a_resuming_learner_counts_on_from_its_runs_verified_weights_not_a_forged_pointer(connection, redis_url,
                                                                                          run_name):
    workers = WorkerProcesses(redis_url)
    try:
        worker = workers.start("auth-resume")
        workers.wait_registered(connection, 1)
        options = dict(n_rollout_steps=STEPS, n_actors=N_ACTORS, batch_size=2, actors_per_job=N_ACTORS,
                       collect_timeout=30)
        first = redis_actors(redis_url, run_name, **options)
        first.start()
        for _ in range(2):
            first.broadcast_updated_policy(first.policy.state_dict())
            collect_batches(first, 2)
        assert first.policy_version == 2
        first.connection.close()  # the learner dies holding its last batch: no stop(), its keys stay in Redis
        del first
        huge = 2**63
        connection.set(f"rqrl:{run_name}:weights:{huge}",
                       encode_state_dict(fixtures.mlp_policy().state_dict(), {"version": str(huge)}))
        connection.set(f"rqrl:{run_name}:weights:latest", huge)
        with redis_actors(redis_url, run_name, resume=True, **options) as second:
            batches = collect_batches(second, 2)  # the first learner's version 2 is still accepted
            second.broadcast_updated_policy(second.policy.state_dict())
            assert second.policy_version == 3
            wait_until(lambda: 3 in second.collect_outputs("cpu").record.policy_version.tolist(), 30,
                       message="version 3 to reach the worker")
            assert_real(batches)
            assert second.records_rejected == 0
        assert worker.poll() is None, "the worker crashed on the forged weights"
    finally:
        workers.stop_all()
