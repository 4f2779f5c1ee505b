"""SerialDistributedActors: in-process actors stepped by one ActorGroup (real envs, real torch)."""

from __future__ import annotations

import functools

import gymnasium
import numpy as np
import pytest
import torch

from rqrl import EnvError, PolicyError, RqrlError
from rqrl.engine.policy import make_act_function
from rqrl.maze.records import batch_records
from rqrl.maze.rollout import ActorGroup, derive_seed
from rqrl.maze.serial import SerialDistributedActors
from tests import fixtures

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("one_torch_thread")]
SHORT_CARTPOLE = functools.partial(gymnasium.make, "CartPole-v1", max_episode_steps=10)


def make_actors(env_factory=fixtures.make_cartpole, policy=None, steps=20, n_actors=3, env_seeds=None,
                agent_seeds=None) -> SerialDistributedActors:
    policy = policy if policy is not None else fixtures.mlp_policy(seed=0)
    return SerialDistributedActors(env_factory, policy, steps, n_actors, n_actors,
                                   actor_env_seeds=env_seeds or [10 + i for i in range(n_actors)],
                                   actor_agent_seeds=agent_seeds or [20 + i for i in range(n_actors)])


def test_records_have_the_batched_record_layout():
    policy = fixtures.mlp_policy(seed=0)
    with make_actors(policy=policy, steps=20, n_actors=3) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        record, size_before, size_after, seconds = actors.collect_outputs("cpu")
        second = actors.collect_outputs("cpu").record
    assert (record.n_steps, record.batch_size) == (20, 3)
    assert record.obs.shape == (20, 3, 4) and record.obs.dtype == torch.float32
    assert record.actions.shape == (20, 3) and record.actions.dtype == torch.int64
    assert set(record.actions.unique().tolist()) <= {0, 1}
    assert record.rewards.shape == (20, 3) and record.rewards.dtype == torch.float32
    assert record.terminated.shape == record.truncated.shape == (20, 3)
    assert record.terminated.dtype == record.truncated.dtype == torch.bool
    assert record.log_probs.shape == (20, 3) and record.logits.shape == (20, 3, 2)
    assert record.next_obs.shape == (3, 4)
    assert record.final_obs.shape[1:] == (4,) and record.final_obs_index.shape == (len(record.final_obs), 2)
    assert record.actor_id.tolist() == [0, 1, 2] and record.worker == ("serial",) * 3
    assert record.rollout_id.tolist() == [0, 0, 0] and second.rollout_id.tolist() == [1, 1, 1]
    assert (size_before, size_after) == (0, 0) and seconds >= 0
    # log-probs and logits are the policy's on the recorded observations and actions
    with torch.no_grad():
        logits = policy(record.obs)
    torch.testing.assert_close(record.logits, logits)
    expected = torch.log_softmax(logits, -1).gather(-1, record.actions.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(record.log_probs, expected)
    # episodes continue across collects: the next batch starts where this one stopped
    torch.testing.assert_close(second.obs[0], record.next_obs)
    # every episode end is listed once, with CartPole's return (1 per step) equal to its length
    episodes = int(record.terminated.sum() + record.truncated.sum())
    assert episodes > 0
    assert len(record.episode_returns) == len(record.episode_lengths) == episodes
    assert torch.equal(record.episode_returns, record.episode_lengths.double())  # CartPole pays 1 per step


def test_policy_version_follows_broadcasts_and_the_weights_reach_the_actors():
    policy = fixtures.WeightRevealingPolicy()
    with make_actors(policy=policy, steps=5, n_actors=2) as actors:
        actors.broadcast_updated_policy(fixtures.revealing_state(1.0))
        first = actors.collect_outputs("cpu").record
        actors.broadcast_updated_policy(fixtures.revealing_state(2.0))
        actors.broadcast_updated_policy(fixtures.revealing_state(3.5))
        third = actors.collect_outputs("cpu").record
        again = actors.collect_outputs("cpu").record
    assert first.policy_version.tolist() == [1, 1] and torch.all(first.log_probs == 1.0)
    assert third.policy_version.tolist() == [3, 3] and torch.all(third.log_probs == 3.5)
    assert again.policy_version.tolist() == [3, 3] and torch.all(again.log_probs == 3.5)
    assert float(policy.weight.detach()) == 0.0  # the learner's own module is not touched


def test_broadcast_refuses_a_state_dict_of_another_architecture():
    with make_actors() as actors, pytest.raises(PolicyError, match="state dict does not match"):
        actors.broadcast_updated_policy(fixtures.mlp_policy(obs_size=5).state_dict())


def collect_twice(env_seeds, agent_seeds):
    policy = fixtures.mlp_policy(seed=3)
    with make_actors(policy=policy, steps=25, n_actors=2, env_seeds=env_seeds, agent_seeds=agent_seeds) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        return [actors.collect_outputs("cpu").record for _ in range(2)]


BATCH_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "log_probs", "logits", "next_obs",
                "final_obs", "final_obs_index", "policy_version", "episode_returns", "episode_lengths")


def assert_same_batches(left, right, fields=BATCH_FIELDS):
    for a, b in zip(left, right, strict=True):
        for name in fields:
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_same_seeds_give_identical_batches_across_instances():
    assert_same_batches(collect_twice([1, 2], [3, 4]), collect_twice([1, 2], [3, 4]))


def test_other_seeds_give_other_batches():
    base = collect_twice([1, 2], [3, 4])
    other_env = collect_twice([5, 6], [3, 4])
    other_agent = collect_twice([1, 2], [7, 8])
    assert not torch.equal(base[0].obs[0], other_env[0].obs[0])
    assert torch.equal(base[0].obs[0], other_agent[0].obs[0])
    assert not torch.equal(base[0].actions, other_agent[0].actions)


def test_truncation_mid_rollout_fills_final_obs():
    """Episodes cut by a 10-step TimeLimit: final_obs is what the env returned at the cut, which a
    replay of the same env with the same seed and actions reproduces; obs[t+1] is the next reset."""
    env_seeds, steps = [7, 8, 9], 35
    policy = fixtures.mlp_policy(seed=1)
    with make_actors(env_factory=SHORT_CARTPOLE, policy=policy, steps=steps, n_actors=3,
                     env_seeds=env_seeds) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        record = actors.collect_outputs("cpu").record
    truncated_at = [tuple(index) for index in record.truncated.nonzero().tolist()]
    assert len(truncated_at) >= 3
    assert sorted(tuple(index) for index in record.final_obs_index.tolist()) == sorted(truncated_at)
    assert not bool((record.truncated & record.terminated).any())
    assert record.final_obs.shape == (len(truncated_at), 4)
    for column in range(3):
        env = SHORT_CARTPOLE()
        obs, _ = env.reset(seed=derive_seed(env_seeds[column], 0))
        length, finals = 0, {}
        for t in range(steps):
            np.testing.assert_array_equal(record.obs[t, column].numpy(), obs)
            obs, reward, terminated, truncated, _ = env.step(int(record.actions[t, column]))
            length += 1
            assert bool(record.terminated[t, column]) == terminated
            assert bool(record.truncated[t, column]) == (truncated and not terminated)
            if truncated and not terminated:
                assert length == 10
                finals[t] = obs
            if terminated or truncated:
                obs, _ = env.reset()
                length = 0
        np.testing.assert_array_equal(record.next_obs[column].numpy(), obs)
        for i, (t, b) in enumerate(record.final_obs_index.tolist()):
            if b == column:
                np.testing.assert_array_equal(record.final_obs[i].numpy(), finals[t])
                if t + 1 < steps:
                    assert not torch.equal(record.final_obs[i], record.obs[t + 1, column])
        env.close()
    truncated_lengths = record.episode_lengths[record.episode_lengths == 10]
    assert len(truncated_lengths) >= len(truncated_at)


def collect_batches(n_actors: int, batch_size: int, n_batches: int, steps: int = 12) -> list:
    policy = fixtures.mlp_policy(seed=4)
    with SerialDistributedActors(SHORT_CARTPOLE, policy, steps, n_actors, batch_size,
                                 actor_env_seeds=[30 + i for i in range(n_actors)],
                                 actor_agent_seeds=[60 + i for i in range(n_actors)]) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        batches = []
        for _ in range(n_batches):
            batches.append(actors.collect_outputs("cpu").record)
            actors.broadcast_updated_policy(policy.state_dict())
        assert actors.get_stats_value("policy_lag", name="max") == 0  # every rollout used the latest weights
        assert actors.get_stats_value("env_steps", name="sum") == n_batches * batch_size * steps
    return batches


def test_a_batch_smaller_than_n_actors_takes_the_actors_round_robin_as_maze_does():
    batches = collect_batches(n_actors=3, batch_size=2, n_batches=3)
    assert [b.actor_id.tolist() for b in batches] == [[0, 1], [2, 0], [1, 2]]
    assert [b.rollout_id.tolist() for b in batches] == [[0, 0], [0, 1], [1, 1]]
    assert [b.continues_previous.tolist() for b in batches] == [[False, False], [False, True], [True, True]]
    assert [b.policy_version.tolist() for b in batches] == [[1, 1], [2, 2], [3, 3]]
    # each actor's episodes go on across batches: actor 0's rollout 1 starts where its rollout 0 stopped
    torch.testing.assert_close(batches[1].obs[0, 1], batches[0].next_obs[0])
    torch.testing.assert_close(batches[2].obs[0, 0], batches[0].next_obs[1])  # actor 1


def test_a_batch_larger_than_n_actors_runs_them_again():
    batches = collect_batches(n_actors=2, batch_size=5, n_batches=2)
    assert [b.actor_id.tolist() for b in batches] == [[0, 1, 0, 1, 0], [1, 0, 1, 0, 1]]
    assert [b.rollout_id.tolist() for b in batches] == [[0, 0, 1, 1, 2], [2, 3, 3, 4, 4]]
    assert batches[0].batch_size == 5 and batches[0].obs.shape == (12, 5, 4)


def test_a_batch_of_a_multiple_of_n_actors_steps_them_together_as_one_group():
    """batch_size = 2 * n_actors: the whole group runs twice per batch, giving what one RQ job of every actor
    delivers for consecutive rollout ids."""
    batches = collect_batches(n_actors=2, batch_size=4, n_batches=1)
    assert batches[0].actor_id.tolist() == [0, 1, 0, 1] and batches[0].rollout_id.tolist() == [0, 0, 1, 1]
    group = ActorGroup(SHORT_CARTPOLE, [0, 1], [30, 31], [60, 61], 12)
    act = make_act_function(fixtures.mlp_policy(seed=4), group.action_space)
    records = group.run(act, 0, 1, cut_at_end=False) + group.run(act, 1, 1, cut_at_end=False)
    group.close()
    torch.testing.assert_close(batches[0].actions, batch_records(records, "cpu").actions)
    torch.testing.assert_close(batches[0].obs, batch_records(records, "cpu").obs)


def test_same_seeds_give_identical_round_robin_batches():
    assert_same_batches(collect_batches(3, 2, 3), collect_batches(3, 2, 3))


def test_collect_before_start_or_broadcast_raises():
    actors = make_actors()
    with pytest.raises(RqrlError, match="start"):
        actors.collect_outputs("cpu")
    with actors:
        with pytest.raises(RqrlError, match="broadcast_updated_policy"):
            actors.collect_outputs("cpu")
    assert actors.group is None  # stop() closed the envs


def test_epoch_stats_count_the_env_steps():
    policy = fixtures.mlp_policy(seed=0)
    with make_actors(policy=policy, steps=10, n_actors=2) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        actors.collect_outputs("cpu")
        actors.collect_outputs("cpu")
        assert actors.get_stats_value("env_steps", name="sum") == 40


def test_batches_equal_what_an_actor_group_delivers_when_driven_as_the_rq_job_drives_it():
    """Serial mode runs the distributed rollout core: same seeds and weights, same trajectories
    (including truncations with their final_obs, episode stats and continues_previous)."""
    env_seeds, agent_seeds, steps = [4, 5, 6], [40, 50, 60], 30
    policy = fixtures.mlp_policy(seed=2)
    with make_actors(env_factory=SHORT_CARTPOLE, policy=policy, steps=steps, n_actors=3, env_seeds=env_seeds,
                     agent_seeds=agent_seeds) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        serial = [actors.collect_outputs("cpu").record for _ in range(3)]
    # what rqrl.maze.jobs.run_actor_group does with one group of every actor: consecutive rollout ids, no cut
    group = ActorGroup(SHORT_CARTPOLE, [0, 1, 2], env_seeds, agent_seeds, steps)
    act = make_act_function(fixtures.mlp_policy(seed=2), group.action_space)
    distributed = [batch_records(group.run(act, rollout_id, 1, cut_at_end=False, worker="w"), "cpu")
                   for rollout_id in range(3)]
    group.close()
    assert_same_batches(serial, distributed,
                        BATCH_FIELDS + ("actor_id", "rollout_id", "continues_previous"))
    assert [batch.continues_previous.tolist() for batch in serial] == [[False] * 3, [True] * 3, [True] * 3]
    assert len(serial[0].final_obs) > 0  # the 10-step limit truncated episodes inside the batches


def test_a_nan_reward_raises_env_error_as_on_a_worker():
    policy = fixtures.mlp_policy(obs_size=1)
    with make_actors(env_factory=fixtures.make_nan_reward_env, policy=policy, steps=10, n_actors=2) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        with pytest.raises(EnvError, match=r"reward nan at step 4 .* rewards must be finite"):
            actors.collect_outputs("cpu")


def test_dict_observations_are_batched_as_dicts():
    policy = fixtures.DictPolicy()
    with make_actors(env_factory=fixtures.make_dict_env, policy=policy, steps=25, n_actors=2) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        record = actors.collect_outputs("cpu").record
    assert record.obs["position"].shape == (25, 2, 2) and record.obs["goal"].shape == (25, 2)
    assert record.next_obs["goal"].shape == (2,)
    assert record.final_obs["position"].shape == (2, 2)  # each actor's 20-step episode was truncated once
    assert sorted(record.final_obs_index.tolist()) == [[19, 0], [19, 1]]


def test_stats_are_those_every_distributed_actors_records():
    policy = fixtures.mlp_policy(seed=0)
    with make_actors(env_factory=SHORT_CARTPOLE, policy=policy, steps=25, n_actors=2) as actors:
        actors.broadcast_updated_policy(policy.state_dict())
        record = actors.collect_outputs("cpu").record
        assert actors.get_stats_value("episode_length", name="count") == len(record.episode_lengths) > 0
        assert actors.get_stats_value("episode_return", name="sum") == float(record.episode_returns.sum())
        assert actors.get_stats_value("policy_lag", name="max") == 0
        assert actors.get_stats_value("queue_size", name="last") == 0
        assert actors.get_stats_value("env_steps_per_second", name="last") > 0
