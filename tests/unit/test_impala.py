"""IMPALA: V-trace against a naive reference, the loss, stale-data filtering, config checks, and
train()/resume/load_policy/evaluate end to end on in-process actors (real CartPole, real torch)."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import shutil
import time

import gymnasium
import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch

from rqrl import ConfigError, RqrlError
from rqrl.algorithms.checkpoint import CheckpointError, load_checkpoint, load_weights, save_checkpoint, save_weights
from rqrl.algorithms.cnn import NatureCNN
from rqrl.algorithms.common import env_factory, make_flat_env
from rqrl.algorithms.evaluation import evaluate
from rqrl.algorithms.impala import (
    ActorCritic,
    ImpalaConfig,
    Learner,
    drop_stale,
    impala_loss,
    load_policy,
    make_actors,
    next_state_values,
    train,
    vtrace,
)
from rqrl.algorithms.ppo import PpoConfig, PpoLearner
from rqrl.maze.records import BatchedRecord, batch_records
from rqrl.maze.serial import SerialDistributedActors
from tests import fixtures
from tests.factories import rollout_record
from tests.run_files import PNG_SIGNATURE, read_rows, tensorboard_scalars

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("one_torch_thread")]
CARTPOLE = functools.partial(make_flat_env, "CartPole-v1")
RANDOM_CARTPOLE_RETURN = 22.0


# --------------------------------------------------------------------------------------------- V-trace


def reference_vtrace(behaviour_log_probs, target_log_probs, rewards, values, bootstrap_value, gamma, rho_bar, c_bar,
                     pg_rho_bar, terminated=None, truncated=None, final_values=None):
    """The IMPALA paper's definitions, written as plainly as possible, one column at a time.

    v_s = V(x_s) + sum_{t>=s} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V, where
    delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)); the sum stops at the step an episode ends.
    V(x_{t+1}) is 0 after a termination, the final observation's value after a truncation, the
    bootstrap value after the last step, and V(x_{t+1}) = values[t+1] otherwise.
    Advantage: rho_pg_t (r_t + gamma v_{t+1} - V(x_t)), where v_{t+1} is replaced by the same
    next-state value when the episode ended at t or t is the last step.
    """
    steps, batch = rewards.shape
    terminated = np.zeros((steps, batch), bool) if terminated is None else np.asarray(terminated)
    truncated = np.zeros((steps, batch), bool) if truncated is None else np.asarray(truncated)
    vs = np.zeros((steps, batch))
    advantages = np.zeros((steps, batch))
    for b in range(batch):
        ratio = [math.exp(float(target_log_probs[t, b]) - float(behaviour_log_probs[t, b])) for t in range(steps)]

        def value_after(t, b=b):
            if terminated[t, b]:
                return 0.0
            if truncated[t, b]:
                return float(final_values[t, b])
            if t == steps - 1:
                return float(bootstrap_value[b])
            return float(values[t + 1, b])

        deltas = [min(rho_bar, ratio[t]) * (float(rewards[t, b]) + gamma * value_after(t) - float(values[t, b]))
                  for t in range(steps)]
        for s in range(steps):
            total, coefficient = float(values[s, b]), 1.0
            for t in range(s, steps):
                total += coefficient * deltas[t]
                if terminated[t, b] or truncated[t, b]:
                    break
                coefficient *= gamma * min(c_bar, ratio[t])
            vs[s, b] = total
        for s in range(steps):
            ended = terminated[s, b] or truncated[s, b] or s == steps - 1
            next_target = value_after(s) if ended else vs[s + 1, b]
            advantages[s, b] = min(pg_rho_bar, ratio[s]) * (float(rewards[s, b]) + gamma * next_target
                                                             - float(values[s, b]))
    return vs, advantages


def random_inputs(steps=7, batch=3, seed=0, log_ratio_scale=1.2):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    behaviour = -torch.rand(steps, batch, generator=generator, dtype=torch.float64) - 0.1
    target = behaviour + log_ratio_scale * randn(steps, batch)
    return behaviour, target, randn(steps, batch), randn(steps, batch), randn(batch)


def run_vtrace(behaviour, target, rewards, values, next_values, gamma, terminated, truncated, **clips):
    ended = terminated | truncated
    return vtrace(behaviour, target, rewards, values, next_values,
                  bootstrap_discounts=gamma * (~terminated).double(), trace_discounts=gamma * (~ended).double(),
                  **clips)


@pytest.mark.parametrize("rho_bar, c_bar, pg_rho_bar", [(1.0, 1.0, 1.0), (0.5, 0.3, 0.7), (2.0, 1.5, 3.0),
                                                         (100.0, 100.0, 100.0), (1.0, 0.9, 1.2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_the_paper_definition_without_episode_ends(rho_bar, c_bar, pg_rho_bar, seed):
    behaviour, target, rewards, values, bootstrap = random_inputs(seed=seed)
    gamma = 0.9
    no_end = torch.zeros(rewards.shape, dtype=torch.bool)
    next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)])
    vs, advantages = run_vtrace(behaviour, target, rewards, values, next_values, gamma, no_end, no_end,
                                rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    expected_vs, expected_advantages = reference_vtrace(behaviour, target, rewards, values, bootstrap, gamma,
                                                        rho_bar, c_bar, pg_rho_bar)
    assert vs.shape == advantages.shape == rewards.shape
    np.testing.assert_allclose(vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(advantages.numpy(), expected_advantages, rtol=1e-10, atol=1e-10)


def test_the_clips_matter_on_these_inputs():
    """Guards the parametrized test above: its inputs have ratios on both sides of every clip."""
    for seed in (0, 1):
        behaviour, target, *_ = random_inputs(seed=seed)
        ratios = torch.exp(target - behaviour)
        assert (ratios < 0.3).any() and (ratios > 3.0).any()


def test_on_policy_vtrace_is_the_n_step_bootstrapped_return():
    behaviour, _, rewards, values, bootstrap = random_inputs(steps=6, batch=2, seed=3)
    gamma = 0.95
    no_end = torch.zeros(rewards.shape, dtype=torch.bool)
    vs, advantages = run_vtrace(behaviour, behaviour.clone(), rewards, values,
                                torch.cat([values[1:], bootstrap.unsqueeze(0)]), gamma, no_end, no_end)
    steps = rewards.shape[0]
    for s in range(steps):
        n_step_return = sum(gamma ** (t - s) * rewards[t] for t in range(s, steps)) + gamma ** (steps - s) * bootstrap
        torch.testing.assert_close(vs[s], n_step_return)
        next_vs = vs[s + 1] if s + 1 < steps else bootstrap
        torch.testing.assert_close(advantages[s], rewards[s] + gamma * next_vs - values[s])


def boundary_inputs():
    """Column 0 terminates at step 3, column 1 is truncated at step 4, column 2 runs through."""
    behaviour, target, rewards, values, bootstrap = random_inputs(steps=8, batch=3, seed=5, log_ratio_scale=0.5)
    terminated = torch.zeros(rewards.shape, dtype=torch.bool)
    truncated = torch.zeros(rewards.shape, dtype=torch.bool)
    terminated[3, 0] = True
    truncated[4, 1] = True
    final_values = torch.zeros_like(values)
    final_values[4, 1] = 2.5
    next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)])
    next_values[3, 0] = 7.0  # the reset obs's value: must not count, the episode terminated
    next_values[4, 1] = final_values[4, 1]  # what next_state_values puts at a truncation
    return behaviour, target, rewards, values, bootstrap, next_values, terminated, truncated, final_values


@pytest.mark.parametrize("rho_bar, c_bar, pg_rho_bar", [(1.0, 1.0, 1.0), (0.6, 0.4, 0.8), (1.7, 1.2, 2.0)])
def test_vtrace_with_episode_ends_matches_the_reference(rho_bar, c_bar, pg_rho_bar):
    behaviour, target, rewards, values, bootstrap, next_values, terminated, truncated, final_values = boundary_inputs()
    gamma = 0.9
    vs, advantages = run_vtrace(behaviour, target, rewards, values, next_values, gamma, terminated, truncated,
                                rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    expected_vs, expected_advantages = reference_vtrace(
        behaviour, target, rewards, values, bootstrap, gamma, rho_bar, c_bar, pg_rho_bar,
        terminated=terminated.numpy(), truncated=truncated.numpy(), final_values=final_values)
    np.testing.assert_allclose(vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(advantages.numpy(), expected_advantages, rtol=1e-10, atol=1e-10)


def test_on_policy_targets_at_episode_ends():
    behaviour, _, rewards, values, _, next_values, terminated, truncated, _ = boundary_inputs()
    gamma = 0.9
    vs, advantages = run_vtrace(behaviour, behaviour.clone(), rewards, values, next_values, gamma, terminated,
                                truncated)
    # terminated: no bootstrapping at all
    torch.testing.assert_close(vs[3, 0], rewards[3, 0])
    torch.testing.assert_close(advantages[3, 0], rewards[3, 0] - values[3, 0])
    torch.testing.assert_close(vs[2, 0], rewards[2, 0] + gamma * rewards[3, 0])
    # truncated: bootstraps from the final observation's value
    torch.testing.assert_close(vs[4, 1], rewards[4, 1] + gamma * 2.5)
    torch.testing.assert_close(advantages[4, 1], rewards[4, 1] + gamma * 2.5 - values[4, 1])
    torch.testing.assert_close(vs[3, 1], rewards[3, 1] + gamma * rewards[4, 1] + gamma ** 2 * 2.5)


@pytest.mark.parametrize("column, end_step", [(0, 3), (1, 4)])
def test_traces_do_not_cross_an_episode_end(column, end_step):
    """Whatever happens after the end of an episode leaves that episode's targets unchanged."""
    behaviour, target, rewards, values, _, next_values, terminated, truncated, _ = boundary_inputs()
    gamma = 0.99
    vs, advantages = run_vtrace(behaviour, target, rewards, values, next_values, gamma, terminated, truncated,
                                rho_bar=1.5, c_bar=1.5, pg_rho_bar=1.5)
    after = slice(end_step + 1, None)
    changed = [tensor.clone() for tensor in (behaviour, target, rewards, values, next_values)]
    for tensor in changed:
        tensor[after, column] += 10.0
    behaviour2, target2, rewards2, values2, next_values2 = changed
    vs2, advantages2 = run_vtrace(behaviour2, target2, rewards2, values2, next_values2, gamma, terminated, truncated,
                                  rho_bar=1.5, c_bar=1.5, pg_rho_bar=1.5)
    until = slice(None, end_step + 1)
    torch.testing.assert_close(vs2[until, column], vs[until, column])
    torch.testing.assert_close(advantages2[until, column], advantages[until, column])
    assert not torch.allclose(vs2[after, column], vs[after, column])  # the change did reach the next episode


def test_a_terminated_step_ignores_its_next_value_and_a_truncated_one_uses_it():
    behaviour, _, rewards, values, _, next_values, terminated, truncated, _ = boundary_inputs()
    gamma = 0.9
    vs, _ = run_vtrace(behaviour, behaviour.clone(), rewards, values, next_values, gamma, terminated, truncated)
    moved = next_values.clone()
    moved[3, 0] += 100.0
    moved[4, 1] += 1.0
    vs2, _ = run_vtrace(behaviour, behaviour.clone(), rewards, values, moved, gamma, terminated, truncated)
    torch.testing.assert_close(vs2[:, 0], vs[:, 0])
    torch.testing.assert_close(vs2[4, 1], vs[4, 1] + gamma)


# ------------------------------------------------------------------------------------- next_state_values


def rollout(obs, next_obs, final_obs_steps, final_obs, terminated=(), policy_version=1, actor_id=0):
    return rollout_record(len(obs), np.shape(obs)[1], obs=obs, next_obs=next_obs, terminated=terminated,
                          final_obs_steps=final_obs_steps, final_obs=final_obs, log_prob=-0.7, logits=True,
                          actor_id=actor_id, policy_version=policy_version, worker=f"w{actor_id}")


def test_next_state_values_reads_the_next_obs_the_rollout_end_and_the_final_obs():
    rng = np.random.default_rng(0)
    steps, obs_size = 5, 3
    obs = rng.normal(size=(3, steps, obs_size))
    next_obs = rng.normal(size=(3, obs_size))
    finals = rng.normal(size=(3, obs_size))
    records = [
        rollout(obs[0], next_obs[0], [], []),
        # truncated mid-rollout at step 1 and cut at the last step: final obs override obs[2] and next_obs
        rollout(obs[1], next_obs[1], [1, steps - 1], finals[:2], actor_id=1),
        rollout(obs[2], next_obs[2], [2], finals[2:], terminated=[0], actor_id=2),
    ]
    batch = batch_records(records, "cpu")
    torch.manual_seed(0)
    model = ActorCritic(obs_size, 2, 8)
    values = next_state_values(model, batch)

    def value(x):
        with torch.no_grad():
            return float(model.values(torch.as_tensor(np.asarray(x), dtype=torch.float32).unsqueeze(0))[0])

    assert values.shape == (steps, 3)
    expected = np.zeros((steps, 3))
    for b in range(3):
        for t in range(steps):
            expected[t, b] = value(obs[b][t + 1] if t + 1 < steps else next_obs[b])
    expected[1, 1], expected[steps - 1, 1], expected[2, 2] = value(finals[0]), value(finals[1]), value(finals[2])
    np.testing.assert_allclose(values.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert values.requires_grad is False


# ------------------------------------------------------------------------------------- loss, drop_stale


def collected_cartpole_batch(model, n_actors=3, steps=40):
    with SerialDistributedActors(CARTPOLE, model, steps, n_actors, n_actors, actor_env_seeds=[1, 2, 3][:n_actors],
                                 actor_agent_seeds=[4, 5, 6][:n_actors]) as actors:
        actors.broadcast_updated_policy(model.state_dict())
        return actors.collect_outputs("cpu").record


def test_impala_loss_is_finite_and_reaches_policy_and_value_parameters():
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 16)
    record = collected_cartpole_batch(model)
    assert bool(record.terminated.any())  # the batch holds an episode end
    config = ImpalaConfig(hidden_size=16, value_coef=0.5, entropy_coef=0.01)
    terms = impala_loss(model, record, config)
    for value in (float(terms.total.detach()), terms.policy, terms.value, terms.entropy, terms.mean_rho):
        assert math.isfinite(value)
    assert terms.total.requires_grad
    expected_total = terms.policy + 0.5 * terms.value - 0.01 * terms.entropy
    assert float(terms.total.detach()) == pytest.approx(expected_total, rel=1e-5)
    assert 0 < terms.entropy <= math.log(2) + 1e-6
    assert terms.value > 0
    assert terms.mean_rho == pytest.approx(1.0, abs=1e-4)  # the batch was made by these very weights
    model.zero_grad()
    terms.total.backward()
    for name, parameter in [*model.policy.named_parameters(prefix="policy"),
                            *model.value.named_parameters(prefix="value")]:
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert float(parameter.grad.abs().sum()) > 0, name


def test_impala_loss_reads_the_behaviour_log_probs():
    """mean_rho is mean(pi / mu): halving every behaviour probability doubles it, and moves the loss."""
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 16)
    record = collected_cartpole_batch(model)
    config = ImpalaConfig(hidden_size=16, rho_bar=5.0, c_bar=5.0, pg_rho_bar=5.0)
    on_policy = impala_loss(model, record, config)
    halved = dataclasses.replace(record, log_probs=record.log_probs - math.log(2))
    off_policy = impala_loss(model, halved, config)
    assert off_policy.mean_rho == pytest.approx(2 * on_policy.mean_rho, rel=1e-5)
    assert off_policy.policy != pytest.approx(on_policy.policy, rel=1e-3)
    assert off_policy.value != pytest.approx(on_policy.value, rel=1e-3)


def test_reward_scale_scales_the_targets_and_normalized_advantages_undo_it_in_the_policy_loss():
    """With a value head that outputs 0, targets and advantages are linear in the rewards: reward_scale 10 makes
    the value loss 100x and the policy loss 10x, unless normalize_advantages takes the scale out of the latter."""
    torch.manual_seed(0)
    model = ActorCritic(4, 2, 16)
    torch.nn.init.zeros_(model.value[-1].weight)
    record = collected_cartpole_batch(model)
    config = ImpalaConfig(hidden_size=16)
    plain, scaled = (impala_loss(model, record, dataclasses.replace(config, reward_scale=scale)) for scale in (1, 10))
    assert scaled.value == pytest.approx(100 * plain.value, rel=1e-4)
    assert scaled.policy == pytest.approx(10 * plain.policy, rel=1e-4)
    normalized = dataclasses.replace(config, normalize_advantages=True)
    plain, scaled = (impala_loss(model, record, dataclasses.replace(normalized, reward_scale=scale))
                     for scale in (1, 10))
    assert scaled.value == pytest.approx(100 * plain.value, rel=1e-4)
    assert scaled.policy == pytest.approx(plain.policy, rel=1e-4, abs=1e-6)
    assert scaled.entropy == plain.entropy


def hand_batch(policy_versions, final_columns):
    steps, batch = 4, len(policy_versions)
    obs = torch.arange(steps * batch * 2, dtype=torch.float32).reshape(steps, batch, 2)
    final_index = torch.tensor([[t, column] for t, column in final_columns], dtype=torch.long).reshape(-1, 2)
    truncated = torch.zeros(steps, batch, dtype=torch.bool)
    if len(final_index):
        truncated[final_index[:, 0], final_index[:, 1]] = True
    return BatchedRecord(
        obs=obs, actions=torch.arange(steps * batch).reshape(steps, batch) % 2,
        rewards=torch.arange(steps * batch, dtype=torch.float32).reshape(steps, batch),
        terminated=torch.zeros(steps, batch, dtype=torch.bool), truncated=truncated,
        log_probs=-torch.rand(steps, batch), logits=torch.randn(steps, batch, 2),
        next_obs=100 + torch.arange(batch * 2, dtype=torch.float32).reshape(batch, 2),
        final_obs=1000 + torch.arange(len(final_index) * 2, dtype=torch.float32).reshape(-1, 2),
        final_obs_index=final_index, policy_version=torch.tensor(policy_versions),
        actor_id=torch.arange(batch) + 10, rollout_id=torch.arange(batch) + 20,
        worker=tuple(f"w{column}" for column in range(batch)),
        episode_returns=torch.tensor([1.0, 2.0], dtype=torch.float64),
        episode_lengths=torch.tensor([3, 4]))


def test_drop_stale_keeps_exactly_the_fresh_columns_and_remaps_final_obs():
    # learner version 5, max lag 1: lags 0, 2, 1, 3 -> keep columns 0 and 2
    record = hand_batch([5, 3, 4, 2], final_columns=[(1, 3), (0, 2), (2, 1), (3, 0), (3, 2)])
    fresh = drop_stale(record, learner_version=5, max_policy_lag=1)
    assert fresh is not None and fresh.batch_size == 2 and fresh.n_steps == 4
    kept = torch.tensor([0, 2])
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "log_probs", "logits"):
        assert torch.equal(getattr(fresh, name), getattr(record, name)[:, kept]), name
    for name in ("next_obs", "policy_version", "actor_id", "rollout_id"):
        assert torch.equal(getattr(fresh, name), getattr(record, name)[kept]), name
    assert fresh.worker == ("w0", "w2")
    # final obs of columns 2 (twice) and 0 survive, in order, with column 2 renamed to 1
    assert fresh.final_obs_index.tolist() == [[0, 1], [3, 0], [3, 1]]
    assert torch.equal(fresh.final_obs, record.final_obs[[1, 3, 4]])
    assert torch.equal(fresh.truncated[fresh.final_obs_index[:, 0], fresh.final_obs_index[:, 1]],
                       torch.ones(3, dtype=torch.bool))
    assert torch.equal(fresh.episode_returns, record.episode_returns)


def test_drop_stale_keeps_everything_without_a_max_lag_or_when_all_are_fresh():
    record = hand_batch([5, 0, 4], final_columns=[(1, 1)])
    assert drop_stale(record, 5, None) is record
    assert drop_stale(record, 5, 5) is record


def test_drop_stale_returns_none_when_every_column_is_stale():
    record = hand_batch([1, 2], final_columns=[(0, 0)])
    assert drop_stale(record, learner_version=5, max_policy_lag=2) is None


def test_drop_stale_with_no_final_obs_and_lag_zero():
    record = hand_batch([3, 2, 3], final_columns=[])
    fresh = drop_stale(record, learner_version=3, max_policy_lag=0)
    assert fresh.batch_size == 2 and fresh.policy_version.tolist() == [3, 3]
    assert fresh.final_obs_index.shape == (0, 2) and fresh.final_obs.shape == (0, 2)


def as_dict_obs(tensor):
    """A tensor observation as a nested dict observation with the same batch axes."""
    return {"a": tensor, "nested": {"b": -tensor}}


def test_drop_stale_keeps_the_fresh_columns_of_dict_observations():
    record = hand_batch([5, 3, 4], final_columns=[(1, 2), (0, 1)])
    record = dataclasses.replace(record, obs=as_dict_obs(record.obs), next_obs=as_dict_obs(record.next_obs),
                                 final_obs=as_dict_obs(record.final_obs))
    fresh = drop_stale(record, learner_version=5, max_policy_lag=1)
    assert fresh is not None and fresh.batch_size == 2
    kept = torch.tensor([0, 2])
    assert torch.equal(fresh.obs["a"], record.obs["a"][:, kept])
    assert torch.equal(fresh.obs["nested"]["b"], record.obs["nested"]["b"][:, kept])
    assert torch.equal(fresh.next_obs["nested"]["b"], record.next_obs["nested"]["b"][kept])
    assert torch.equal(fresh.final_obs["a"], record.final_obs["a"][[0]])
    assert fresh.final_obs_index.tolist() == [[1, 1]]


def test_impala_loss_refuses_dict_observations_and_names_the_fix():
    record = hand_batch([1, 1], final_columns=[])
    record = dataclasses.replace(record, obs=as_dict_obs(record.obs))
    with pytest.raises(ConfigError, match=r"vector observations, got a dict observation with keys \['a', 'nested'\]"
                                          r".*FlattenObservation"):
        impala_loss(ActorCritic(2, 2, 8), record, ImpalaConfig())


@pytest.fixture
def dict_env_id():
    env_id = "rqrl-test/DictObs-v0"
    gymnasium.register(env_id, entry_point=fixtures.DictObsEnv)
    yield env_id
    del gymnasium.registry[env_id]


def test_make_flat_env_flattens_dict_observations(dict_env_id):
    env = make_flat_env(dict_env_id)
    try:
        obs, _ = env.reset(seed=0)
        assert env.observation_space.shape == (5,)  # a Box(2) and a one-hot Discrete(3)
        assert obs.shape == (5,)
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("bad", [
    {"total_env_steps": 0}, {"n_actors": 0}, {"n_rollout_steps": -1}, {"batch_size": 0}, {"learning_rate": 0.0},
    {"hidden_size": 0}, {"discount": 0.0}, {"discount": 1.01}, {"discount": -0.5}, {"rho_bar": 0.0},
    {"c_bar": -1.0}, {"pg_rho_bar": 0.0}, {"max_grad_norm": 0.0}, {"max_policy_lag": -1}, {"learner_threads": 0},
    {"reward_scale": 0.0}, {"reward_scale": -1.0},
])
def test_config_rejects_bad_values(bad):
    (name, value), = bad.items()
    with pytest.raises(ConfigError, match=name):
        ImpalaConfig(**bad)
    with pytest.raises(ValueError):
        ImpalaConfig(**bad)


def test_config_accepts_the_edges():
    config = ImpalaConfig(discount=1.0, max_policy_lag=0, total_env_steps=1)
    assert (config.discount, config.max_policy_lag) == (1.0, 0)


# ------------------------------------------------------------------------------------- train end to end


def serial_actors(config: ImpalaConfig, seed_offset: int = 0) -> SerialDistributedActors:
    n = config.n_actors
    return SerialDistributedActors(CARTPOLE, ActorCritic(4, 2, config.hidden_size), config.n_rollout_steps, n,
                                   config.batch_size,
                                   actor_env_seeds=[config.seed * 100 + seed_offset + i for i in range(n)],
                                   actor_agent_seeds=[config.seed * 100 + 50 + seed_offset + i for i in range(n)])


def small_config(tmp_path, **changes) -> ImpalaConfig:
    settings = dict(env_id="CartPole-v1", total_env_steps=4096, n_actors=4, batch_size=4, n_rollout_steps=16,
                    hidden_size=32, progress=False, run_dir=str(tmp_path), run_name="smoke", seed=0,
                    metrics_seconds=0)  # a metrics row per update: the rows show the loop's bookkeeping
    return ImpalaConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("impala")
    config = small_config(tmp_path)
    result = train(config, actors=serial_actors(config))
    return tmp_path / "smoke", result


def test_train_writes_the_run_folder(trained_run):
    run, result = trained_run
    assert result.run_dir == run and not result.interrupted
    assert (result.env_steps, result.updates) == (4096, 4096 // (4 * 16))
    for name in ("final.safetensors", "best.safetensors", "checkpoint.safetensors", "metrics.csv", "config.json",
                 "summary.json", "learning_curve.png"):
        assert (run / name).is_file() and (run / name).stat().st_size > 0, name
    assert (run / "learning_curve.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = read_rows(run / "metrics.csv")
    assert len(rows) == result.updates
    assert [int(row["env_steps"]) for row in rows] == [64 * (i + 1) for i in range(len(rows))]
    losses = sorted(step for step, tag, _ in tensorboard_scalars(run) if tag == "losses/policy_loss")
    assert losses == [int(row["env_steps"]) for row in rows], "one TensorBoard policy_loss per CSV row"
    assert all(float(row["policy_lag_max"]) == 0 for row in rows)  # serial actors always use the latest weights
    assert all(math.isfinite(float(row["policy_loss"])) for row in rows)
    assert all(float(row["grad_norm"]) > 0 for row in rows), "the gradient's norm before clipping"
    config = json.loads((run / "config.json").read_text())
    assert (config["total_env_steps"], config["run_name"]) == (4096, "smoke")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 4096 and summary["episodes"] == result.episodes > 0
    assert summary["run_dir"] == str(run)
    counters = load_checkpoint(run / "checkpoint.safetensors").counters
    assert (counters["env_steps"], counters["updates"]) == (4096, result.updates)


def test_a_run_writes_about_a_metrics_row_per_second_whatever_its_update_rate(tmp_path):
    config = small_config(tmp_path, total_env_steps=12_000, metrics_seconds=1.0, max_policy_lag=0)
    result = train(config, actors=serial_actors(config))
    rows = read_rows(tmp_path / "smoke" / "metrics.csv")
    assert result.updates > 5 * result.seconds, "an update rate well above a row per second"
    assert 1 <= len(rows) <= result.seconds + 2, (len(rows), result.seconds)
    assert len({step for step, tag, _ in tensorboard_scalars(tmp_path / "smoke") if tag == "losses/policy_loss"}) \
        == len(rows), "a TensorBoard point per row"
    last = rows[-1]  # the run's end is written, whatever the time since the row before
    assert (int(last["env_steps"]), int(last["updates"])) == (result.env_steps, result.updates)
    assert sum(float(row["dropped"]) for row in rows) == 0  # summed over the updates a row covers


def test_eval_every_logs_greedy_returns_beside_the_training_returns(tmp_path):
    config = small_config(tmp_path, total_env_steps=6400, eval_every=0.2, eval_episodes=2)
    result = train(config, actors=serial_actors(config))
    rows = read_rows(tmp_path / "smoke" / "metrics.csv")
    evaluated = [row for row in rows if row["eval_return"]]
    assert evaluated and len(evaluated) < len(rows), "evaluations every 0.2 s, not every update"
    assert all(1 <= float(row["eval_return"]) <= 500 and float(row["eval_seconds"]) > 0 for row in evaluated)
    assert all(row["mean_return"] for row in evaluated[1:]), "beside the training returns"
    tagged = [step for step, tag, _ in tensorboard_scalars(tmp_path / "smoke") if tag == "charts/eval_return"]
    assert tagged == [int(row["env_steps"]) for row in evaluated]
    assert result.env_steps == 6400


class SlowToStart(SerialDistributedActors):
    """Actors whose workers take ``seconds`` to come (RedisDistributedActors waits for them on entering)."""

    seconds = 0.3

    def __enter__(self):
        time.sleep(self.seconds)
        return super().__enter__()


def test_the_first_evaluation_comes_eval_every_into_training_not_at_the_first_update(tmp_path):
    config = small_config(tmp_path, total_env_steps=640, eval_every=SlowToStart.seconds / 2, eval_episodes=1)
    actors = SlowToStart(CARTPOLE, ActorCritic(4, 2, config.hidden_size), config.n_rollout_steps, config.n_actors,
                         config.batch_size, actor_env_seeds=[1, 2, 3, 4], actor_agent_seeds=[5, 6, 7, 8])
    train(config, actors=actors)
    assert read_rows(tmp_path / "smoke" / "metrics.csv")[0]["eval_return"] == "", "no evaluation at the first update"


def test_train_resumes_from_the_run_folder(tmp_path):
    first = small_config(tmp_path)
    result = train(first, actors=serial_actors(first))
    run = tmp_path / "smoke"
    rows_before = len(read_rows(run / "metrics.csv"))
    second = small_config(tmp_path, total_env_steps=8192, run_name=None, resume=str(run))
    resumed = train(second, actors=serial_actors(second, seed_offset=7))
    assert resumed.run_dir == run  # continues in the same folder
    assert resumed.env_steps == 8192 and resumed.updates == 2 * result.updates
    assert resumed.episodes > result.episodes and resumed.seconds >= result.seconds
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 8192 > result.env_steps
    lines = (run / "metrics.csv").read_text().splitlines()
    assert sum(line.startswith("env_steps,") for line in lines) == 1  # one header
    rows = read_rows(run / "metrics.csv")
    assert len(rows) == rows_before + resumed.updates - result.updates
    steps = [int(row["env_steps"]) for row in rows]
    assert steps == sorted(steps) and steps[rows_before] == 4096 + 64 and steps[-1] == 8192
    state = load_checkpoint(run / "checkpoint.safetensors")
    assert state.counters["env_steps"] == 8192
    # Adam's step counter went on from the checkpoint instead of starting over
    assert {float(parameter["step"]) for parameter in state.optimizer["state"].values()} == {resumed.updates}


def test_resume_restores_the_learner_state(trained_run, tmp_path):
    run, result = trained_run
    config = small_config(tmp_path, total_env_steps=10_000, run_name="copy", resume=str(run))
    learner = Learner(config)
    saved = load_checkpoint(run / "checkpoint.safetensors")
    assert (learner.env_steps, learner.updates, learner.episodes) == (4096, result.updates, result.episodes)
    for key, value in learner.model.state_dict().items():
        assert torch.equal(value, saved.model[key]), key
    assert learner.run_dir == tmp_path / "copy"  # an explicit run name wins over the resumed folder's


def test_impala_learns_cartpole(tmp_path):
    """Serial actors, fixed seed: 30k steps take ~2 s and lift the return well above random (~22)."""
    config = small_config(tmp_path, total_env_steps=30_000, n_actors=8, batch_size=8, n_rollout_steps=32,
                          hidden_size=64, run_name="learn", seed=0)
    result = train(config, actors=serial_actors(config))
    assert result.env_steps >= 30_000
    assert result.mean_return is not None and result.mean_return > 40, result
    assert result.best_mean_return >= result.mean_return
    rows = read_rows(tmp_path / "learn" / "metrics.csv")
    first_full = next(float(row["mean_return"]) for row in rows if row["mean_return"])
    assert first_full < 40  # it did start out random-like


def test_load_policy_and_evaluate(trained_run):
    run, _ = trained_run
    model, metadata = load_policy(run)
    assert isinstance(model, ActorCritic) and not model.training
    assert metadata["env_id"] == "CartPole-v1" and metadata["hidden_size"] == 32
    best, _ = load_weights(run / "best.safetensors")
    for key, value in model.state_dict().items():
        assert torch.equal(value, best[key]), key
    final_model, _ = load_policy(run / "final.safetensors")
    assert final_model.policy[0].weight.shape == (32, 4)
    returns = evaluate(model, "CartPole-v1", episodes=3, seed=0)
    assert len(returns) == 3 and all(1 <= value <= 500 for value in returns)
    assert evaluate(model, "CartPole-v1", episodes=3, seed=0) == returns  # greedy and seeded: repeatable
    sampled = evaluate(model, "CartPole-v1", episodes=2, seed=1, greedy=False)
    assert len(sampled) == 2


def test_load_policy_reads_a_training_checkpoint_too(trained_run):
    run, _ = trained_run
    from_checkpoint, metadata = load_policy(run / "checkpoint.safetensors")
    final, _ = load_policy(run / "final.safetensors")
    assert metadata["env_id"] == "CartPole-v1"
    for key, value in final.state_dict().items():
        assert torch.equal(from_checkpoint.state_dict()[key], value), key


def test_load_policy_refuses_a_file_that_is_no_policy(tmp_path):
    from rqrl.algorithms.checkpoint import save_weights

    save_weights(tmp_path / "other.safetensors", {"x": torch.zeros(2)}, {"note": "not a policy"})
    with pytest.raises(RqrlError, match="env_id"):
        load_policy(tmp_path / "other.safetensors")


def test_load_policy_refuses_a_folder_without_weights(tmp_path):
    with pytest.raises(ConfigError, match="run folder"):
        load_policy(tmp_path)


def test_a_trained_policy_beats_random_when_evaluated(tmp_path):
    torch.manual_seed(0)
    untrained = ActorCritic(4, 2, 64)
    config = small_config(tmp_path, total_env_steps=30_000, n_actors=8, batch_size=8, n_rollout_steps=32,
                          hidden_size=64, run_name="eval", seed=1)
    train(config, actors=serial_actors(config))
    trained, _ = load_policy(tmp_path / "eval")
    trained_mean = float(np.mean(evaluate(trained, "CartPole-v1", episodes=5, seed=0)))
    untrained_mean = float(np.mean(evaluate(untrained, "CartPole-v1", episodes=5, seed=0)))
    assert trained_mean > max(2 * untrained_mean, RANDOM_CARTPOLE_RETURN + 20), (trained_mean, untrained_mean)


class FedWaitActors(SerialDistributedActors):
    """Serial actors whose collect takes at least ``collect_seconds`` and reports ``idle_share`` of it as waiting for
    rollouts, as RedisDistributedActors reports its blocking and pacing (the rest is popping and decoding)."""

    def __init__(self, *args, collect_seconds: float, idle_share: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.collect_seconds, self.idle_share = collect_seconds, idle_share

    def collect_outputs(self, learner_device):
        started = time.perf_counter()
        outputs = super().collect_outputs(learner_device)
        time.sleep(max(0.0, self.collect_seconds - (time.perf_counter() - started)))
        self.last_wait_seconds = self.idle_share * (time.perf_counter() - started)
        return outputs


@pytest.mark.parametrize("idle_share, verdict", [(0.0, "balanced"), (0.9, "workers")])
def test_the_bottleneck_counts_the_collects_idle_time_not_its_decoding(tmp_path, idle_share, verdict):
    config = small_config(tmp_path, total_env_steps=16 * 4 * 6)
    base = serial_actors(config)
    actors = FedWaitActors(base.env_factory, base.policy, config.n_rollout_steps, config.n_actors, config.batch_size,
                           actor_env_seeds=base.actor_env_seeds, actor_agent_seeds=base.actor_agent_seeds,
                           collect_seconds=0.05, idle_share=idle_share)
    result = train(config, actors=actors)
    assert result.bottleneck == verdict, result.bottleneck_detail
    waited = float(result.bottleneck_detail.split("waited for rollouts ")[1].split("%")[0])
    assert waited < 5 if idle_share == 0 else waited > 40, result.bottleneck_detail  # the share fed in shows


# ------------------------------------------------------------------------------------- image observations

PIXELS = "tests.fixtures:RqrlPixelSign-v0"


def test_image_observations_get_the_nature_cnn_and_vectors_keep_the_mlps(tmp_path):
    learner = Learner(small_config(tmp_path, env_id=PIXELS))
    assert isinstance(learner.model.torso, NatureCNN) and learner.model.torso.obs_shape == (2, 36, 36)
    assert [type(layer) for layer in learner.model.policy] == [torch.nn.Linear]  # a head on the CNN's 512 features
    assert learner.model.policy[0].in_features == 512 and learner.model.value[0].in_features == 512
    assert Learner(small_config(tmp_path)).model.torso is None  # CartPole: two MLPs, as before


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py not installed: pip install "
                                                                        "'rqrl[atari]'")
def test_pong_gets_the_nature_cnn(tmp_path):
    model = Learner(small_config(tmp_path, env_id="ALE/Pong-v5")).model
    assert isinstance(model.torso, NatureCNN) and model.torso.obs_shape == (4, 84, 84)
    assert model(torch.zeros(3, 4, 84, 84, dtype=torch.uint8)).shape == (3, 6)


def test_the_cnn_actor_critic_runs_its_torso_once_for_logits_and_values():
    torch.manual_seed(0)
    model = ActorCritic((2, 36, 36), 3)
    frames = torch.randint(0, 256, (5, 4, 2, 36, 36), dtype=torch.uint8)  # [T, B, C, H, W]
    logits, values = model.logits_and_values(frames)
    assert logits.shape == (5, 4, 3) and values.shape == (5, 4)
    assert torch.allclose(logits, model(frames)) and torch.allclose(values, model.values(frames))


def test_the_cnn_trains_on_uint8_records_and_its_new_weights_act_on_the_actors():
    torch.manual_seed(0)
    config = ImpalaConfig(env_id=PIXELS)
    model = ActorCritic((2, 36, 36), 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with SerialDistributedActors(env_factory(config), model, 8, 2, 2, actor_env_seeds=[1, 2],
                                 actor_agent_seeds=[3, 4]) as actors:
        actors.broadcast_updated_policy(model.state_dict())
        record = actors.collect_outputs("cpu").record
        assert record.obs.dtype == torch.uint8 and record.obs.shape == (8, 2, 2, 36, 36)
        terms = impala_loss(model, record, config)
        optimizer.zero_grad()
        terms.total.backward()
        assert all(float(parameter.grad.abs().sum()) > 0 for parameter in model.torso.parameters())
        optimizer.step()
        actors.broadcast_updated_policy(model.state_dict())
        record = actors.collect_outputs("cpu").record
    assert (record.policy_version == 2).all()
    with torch.no_grad():  # the actors acted with the updated CNN: their logits are the learner's
        assert torch.allclose(record.logits, model(record.obs), atol=1e-5)


@pytest.mark.slow
def test_impala_learns_an_image_env_with_the_nature_cnn(tmp_path):
    """Serial actors, uint8 frames in the records, the CNN's weights broadcast to them: the return climbs from
    random (10) to solved (19 of 20) in about 27,000 steps (35 s on one core)."""
    config = small_config(tmp_path, env_id=PIXELS, total_env_steps=40_000, target_return=19.0, n_actors=4,
                          batch_size=4, n_rollout_steps=20, run_name="pixels", seed=0)
    actors = SerialDistributedActors(env_factory(config), ActorCritic((2, 36, 36), 2), config.n_rollout_steps,
                                     config.n_actors, config.batch_size, actor_env_seeds=[1, 2, 3, 4],
                                     actor_agent_seeds=[5, 6, 7, 8])
    result = train(config, actors=actors)
    assert result.solved and result.env_steps < 40_000, result
    state, _ = load_weights(tmp_path / "pixels" / "final.safetensors")
    assert state["torso.convs.0.weight"].shape == (32, 2, 8, 8)
    model, _ = load_policy(tmp_path / "pixels")
    assert isinstance(model.torso, NatureCNN)
    assert evaluate(model, PIXELS, episodes=2, seed=0) == [20.0, 20.0]


def test_the_weights_refresh_interval_reaches_the_runs_config():
    """--weights-refresh-seconds goes to the actors' options and into the RunConfig every worker reads."""
    config = ImpalaConfig(weights_refresh_seconds=2.5, workers=0, redis_url="redis://127.0.0.1:1/0")
    actors = make_actors(config, ActorCritic(4, 2), secret="test-secret")
    assert actors.options.weights_refresh_seconds == 2.5
    assert actors._run_config(bound=4).weights_refresh_seconds == 2.5
    with pytest.raises(ConfigError, match="expected weights_refresh_seconds >= 0 seconds, got -1"):
        ImpalaConfig(weights_refresh_seconds=-1)


# --------------------------------------------------------------- resume: checks, best weights, finished runs


def copy_of(trained_run, tmp_path, name: str = "smoke"):
    run, result = trained_run
    copy = tmp_path / name
    shutil.copytree(run, copy)
    return copy, result


def test_a_loose_checkpoint_of_other_sizes_is_a_config_error_naming_both(trained_run, tmp_path):
    loose = tmp_path / "x" / "checkpoint.safetensors"
    loose.parent.mkdir()
    shutil.copy(trained_run[0] / "checkpoint.safetensors", loose)  # hidden_size 32, no config.json beside it
    with pytest.raises(ConfigError, match=r"--hidden-size 64 \(the checkpoint's: 32\)"):
        Learner(small_config(tmp_path, hidden_size=64, run_name=None, resume=str(loose)))
    state = load_checkpoint(loose)
    del state.counters["hidden_size"], state.counters["algo"]  # an older checkpoint that recorded neither
    save_checkpoint(loose, state)
    with pytest.raises(ConfigError, match="does not fit this ActorCritic .*size mismatch.*--hidden-size"):
        Learner(small_config(tmp_path, hidden_size=64, run_name=None, resume=str(loose)))


def test_a_loose_impala_checkpoint_is_refused_by_ppo(trained_run, tmp_path):
    loose = tmp_path / "checkpoint.safetensors"
    shutil.copy(trained_run[0] / "checkpoint.safetensors", loose)
    with pytest.raises(ConfigError, match="is a checkpoint of impala, not of ppo"):
        PpoLearner(PpoConfig(resume=str(loose), hidden_size=32, run_dir=str(tmp_path), progress=False))


def test_a_resume_never_replaces_a_better_best_weights_file(trained_run, tmp_path):
    """best.safetensors is newer than the checkpoint: its own mean return is the best to beat."""
    run, _ = copy_of(trained_run, tmp_path)
    state = load_checkpoint(run / "checkpoint.safetensors")
    state.counters["best_mean_return"] = 0.0  # older than the file: any CartPole return beats it
    save_checkpoint(run / "checkpoint.safetensors", state)
    weights, metadata = load_weights(run / "best.safetensors")
    save_weights(run / "best.safetensors", weights, {**metadata, "mean_return": 214.67})
    config = small_config(tmp_path, total_env_steps=6144, run_name=None, resume=str(run))
    result = train(config, actors=serial_actors(config, seed_offset=7))
    assert load_weights(run / "best.safetensors")[1]["mean_return"] == 214.67
    assert result.best_mean_return == 214.67


def files_of(run):
    """Every file of a run folder but the lock file (which a learner that takes the folder rewrites) and its bytes."""
    return {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name != ".learner.lock"}


def test_resuming_a_finished_run_says_so_and_leaves_its_folder_alone(trained_run, tmp_path):
    run, result = copy_of(trained_run, tmp_path)
    before = files_of(run)
    config = small_config(tmp_path, run_name=None, resume=str(run))  # total_env_steps 4096: reached
    with pytest.raises(ConfigError, match=rf"{run} is finished: it reached its step budget \(4,096 env steps of "
                                          r"--total-env-steps 4,096\); nothing to train.*higher --total-env-steps"):
        train(config, actors=serial_actors(config))
    assert files_of(run) == before
    Learner(dataclasses.replace(config, total_env_steps=4160)).folder.close()  # the lock was let go


def test_resuming_a_finished_run_does_not_say_it_resumed(trained_run, tmp_path, caplog):
    run, _ = copy_of(trained_run, tmp_path)
    config = small_config(tmp_path, run_name=None, resume=str(run))  # total_env_steps 4096: reached
    with caplog.at_level("INFO", logger="rqrl.algorithms"), pytest.raises(ConfigError, match="is finished"):
        train(config, actors=serial_actors(config))
    assert "resumed from" not in caplog.text
    with caplog.at_level("INFO", logger="rqrl.algorithms"):
        Learner(dataclasses.replace(config, total_env_steps=4160)).folder.close()
    assert f"resumed from {run / 'checkpoint.safetensors'} at 4096 env steps" in caplog.text


def test_a_full_disk_under_metrics_mid_run_is_one_error_and_the_earlier_checkpoint_stays(tmp_path, monkeypatch):
    """As a failed checkpoint save: one CheckpointError naming the file, the run stops, nothing more is written."""
    import errno

    from rqrl.algorithms.metrics import EventFile

    rows = []
    real_write_scalars = EventFile.write_scalars

    def disk_fills_up(self, step, values):
        rows.append(step)
        if len(rows) > 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write_scalars(self, step, values)

    monkeypatch.setattr(EventFile, "write_scalars", disk_fills_up)
    config = small_config(tmp_path, checkpoint_seconds=0)
    with pytest.raises(CheckpointError, match=r"cannot write .*smoke/tensorboard/events.out.tfevents.*: No space left "
                                              r"on device; .*then resume the run with `rqrl train --resume .*smoke`"
                       ) as raised:
        train(config, actors=serial_actors(config))
    assert raised.value.__context__ is raised.value.__cause__, "no second error from the clean-up"
    assert len(rows) == 21, "no last row tried after the failed one"
    run = tmp_path / "smoke"
    assert load_checkpoint(run / "checkpoint.safetensors").counters["env_steps"] == 20 * 64
    assert not (run / "final.safetensors").exists() and not (run / "summary.json").exists()


def test_a_save_that_fails_mid_run_is_one_error_and_the_earlier_checkpoint_stays(tmp_path, monkeypatch):
    saves = []
    real_save_file = safetensors.torch.save_file

    def disk_fills_up(tensors, filename, metadata=None):
        saves.append(filename)
        if len(saves) > 4:
            raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os "
                                              "error 28)")
        real_save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", disk_fills_up)
    config = small_config(tmp_path, checkpoint_seconds=0)
    with pytest.raises(CheckpointError, match="cannot write .*smoke/.*safetensors: .*No space left") as raised:
        train(config, actors=serial_actors(config))
    assert raised.value.__context__ is raised.value.__cause__, "no second error from writing the end state"
    assert len(saves) == 5, "nothing more written after the failed save"
    assert load_checkpoint(tmp_path / "smoke" / "checkpoint.safetensors").counters["env_steps"] > 0
    assert not list((tmp_path / "smoke").glob("*.tmp")) and not (tmp_path / "smoke" / "final.safetensors").exists()
