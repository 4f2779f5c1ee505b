"""ActorGroup: stepping real gymnasium envs with a real torch policy, no Redis."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from rqrl.engine.policy import categorical_step, make_act_function
from rqrl.errors import ConfigError, EnvError, PolicyError
from rqrl.maze.rollout import ActorGroup, derive_seed
from tests import fixtures


def group_and_act(env_factory, n_actors: int, n_steps: int, policy=None, env_seeds=None, agent_seeds=None):
    group = ActorGroup(env_factory, list(range(n_actors)), env_seeds or list(range(n_actors)),
                       agent_seeds or [100 + i for i in range(n_actors)], n_steps)
    act = make_act_function(policy if policy is not None else fixtures.mlp_policy(seed=0), group.action_space)
    return group, act


def counting_group(n_steps: int, length: int = 50, n_actors: int = 1):
    group = ActorGroup(lambda: fixtures.CountingEnv(length=length), list(range(n_actors)), list(range(n_actors)),
                       list(range(n_actors)), n_steps)
    return group, make_act_function(fixtures.mlp_policy(obs_size=1), group.action_space)


def test_cartpole_record_shapes_and_dtypes():
    group, act = group_and_act(fixtures.make_cartpole, 3, 20)
    records = group.run(act, rollout_id=0, policy_version=4, cut_at_end=False, worker="w-test")
    assert [record.actor_id for record in records] == [0, 1, 2]
    for record in records:
        assert record.n_steps == 20
        assert record.obs.shape == (20, 4) and record.obs.dtype == np.float32
        assert record.actions.shape == (20,) and record.actions.dtype == np.int64
        assert set(np.unique(record.actions)) <= {0, 1}
        assert record.rewards.shape == (20,) and record.rewards.dtype == np.float32
        assert record.terminated.dtype == bool and record.truncated.dtype == bool
        assert record.log_probs.shape == (20,) and record.log_probs.dtype == np.float32
        assert record.logits.shape == (20, 2)
        assert record.next_obs.shape == (4,)
        assert record.final_obs.shape == (0, 4) and record.final_obs_steps.shape == (0,)
        assert (record.policy_version, record.rollout_id, record.worker) == (4, 0, "w-test")
        logp = torch.log_softmax(torch.from_numpy(record.logits), -1)
        expected = logp.gather(-1, torch.from_numpy(record.actions).unsqueeze(-1)).squeeze(-1).numpy()
        np.testing.assert_allclose(record.log_probs, expected, rtol=1e-6)
    group.close()


def test_logits_are_those_of_the_policy_on_the_recorded_obs():
    policy = fixtures.mlp_policy(seed=5)
    group, act = group_and_act(fixtures.make_cartpole, 2, 10, policy=policy)
    record = group.run(act, 0, 1, cut_at_end=False)[1]
    with torch.no_grad():
        expected = policy(torch.from_numpy(record.obs)).numpy()
    np.testing.assert_allclose(record.logits, expected, rtol=1e-5, atol=1e-6)


def test_first_obs_is_the_seeded_reset():
    group, act = group_and_act(fixtures.make_cartpole, 2, 5, env_seeds=[11, 12])
    records = group.run(act, rollout_id=3, policy_version=1, cut_at_end=False)
    for record, seed in zip(records, [11, 12], strict=True):
        env = fixtures.make_cartpole()
        obs, _ = env.reset(seed=derive_seed(seed, 3))
        np.testing.assert_array_equal(record.obs[0], obs)


def test_same_seeds_give_identical_records():
    def run_twice():
        group, act = group_and_act(fixtures.make_cartpole, 2, 60, env_seeds=[7, 8], agent_seeds=[9, 10])
        return group.run(act, 0, 1, cut_at_end=False) + group.run(act, 1, 1, cut_at_end=True)

    first, second = run_twice(), run_twice()
    for a, b in zip(first, second, strict=True):
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "log_probs", "logits", "next_obs",
                     "final_obs", "final_obs_steps", "episode_returns", "episode_lengths"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_different_env_seeds_give_different_obs():
    a = group_and_act(fixtures.make_cartpole, 1, 5, env_seeds=[1])
    b = group_and_act(fixtures.make_cartpole, 1, 5, env_seeds=[2])
    obs_a = a[0].run(a[1], 0, 1, cut_at_end=False)[0].obs
    obs_b = b[0].run(b[1], 0, 1, cut_at_end=False)[0].obs
    assert not np.array_equal(obs_a[0], obs_b[0])


def test_actors_of_one_group_get_different_starts():
    group, act = group_and_act(fixtures.make_dict_env, 3, 3, policy=fixtures.DictPolicy())
    records = group.run(act, 0, 1, cut_at_end=False)
    starts = {tuple(record.obs["position"][0]) for record in records}
    assert len(starts) == 3


def test_different_agent_seeds_give_different_actions():
    a = group_and_act(fixtures.make_cartpole, 1, 40, env_seeds=[1], agent_seeds=[1])
    b = group_and_act(fixtures.make_cartpole, 1, 40, env_seeds=[1], agent_seeds=[2])
    actions_a = a[0].run(a[1], 0, 1, cut_at_end=True)[0].actions
    actions_b = b[0].run(b[1], 0, 1, cut_at_end=True)[0].actions
    assert not np.array_equal(actions_a, actions_b)


def test_episodes_continue_across_runs():
    group, act = counting_group(8)
    first = group.run(act, 0, 1, cut_at_end=False)[0]
    second = group.run(act, 1, 1, cut_at_end=False)[0]
    assert first.obs[:, 0].tolist() == list(range(8))
    assert first.next_obs.tolist() == [8.0]
    assert second.obs[:, 0].tolist() == list(range(8, 16))
    assert not first.truncated.any() and not second.truncated.any()


def test_episode_that_spans_runs_is_reported_whole_when_it_ends():
    group, act = counting_group(30, length=50)
    first = group.run(act, 0, 1, cut_at_end=False)[0]
    second = group.run(act, 1, 1, cut_at_end=False)[0]
    assert len(first.episode_returns) == 0
    # steps 30..49 of the first episode, then the env resets to 0
    assert second.obs[:, 0].tolist() == list(range(30, 50)) + list(range(10))
    assert second.terminated.nonzero()[0].tolist() == [19]
    assert second.episode_returns.tolist() == [50.0] and second.episode_lengths.tolist() == [50]
    assert second.final_obs_steps.tolist() == []


def test_run_with_an_unexpected_rollout_id_starts_afresh():
    group, act = counting_group(5)
    group.run(act, 0, 1, cut_at_end=False)
    jumped = group.run(act, 7, 1, cut_at_end=False)[0]
    assert jumped.obs[:, 0].tolist() == list(range(5))
    assert not jumped.continues_previous


def test_records_say_which_rollouts_continue_the_previous_one():
    group, act = counting_group(5)
    flags = [group.run(act, rollout, 1, cut_at_end=rollout == 1)[0].continues_previous for rollout in range(4)]
    assert flags == [False, True, False, True]  # first rollout, continued, after the cut, continued


def test_cut_at_end_truncates_last_step_and_next_run_resets():
    group, act = counting_group(10, length=50, n_actors=2)
    cut = group.run(act, 0, 1, cut_at_end=True)
    for record in cut:
        assert record.truncated.tolist() == [False] * 9 + [True]
        assert record.final_obs_steps.tolist() == [9]
        assert record.final_obs.tolist() == [[10.0]]
        np.testing.assert_array_equal(record.final_obs[-1], record.next_obs)
        assert len(record.episode_returns) == 0  # a cut is not an episode end
    after = group.run(act, 1, 1, cut_at_end=False)
    for record in after:
        assert record.obs[:, 0].tolist() == list(range(10))


def test_after_a_cut_the_next_run_starts_from_the_seeded_reset():
    group, act = group_and_act(fixtures.make_cartpole, 2, 5, env_seeds=[21, 22])
    group.run(act, 0, 1, cut_at_end=True)
    after = group.run(act, 1, 1, cut_at_end=False)
    fresh_group, fresh_act = group_and_act(fixtures.make_cartpole, 2, 5, env_seeds=[21, 22])
    fresh = fresh_group.run(fresh_act, 1, 1, cut_at_end=False)
    for record, seed, other in zip(after, [21, 22], fresh, strict=True):
        obs, _ = fixtures.make_cartpole().reset(seed=derive_seed(seed, 1))
        np.testing.assert_array_equal(record.obs[0], obs)
        np.testing.assert_array_equal(record.obs, other.obs)
        np.testing.assert_array_equal(record.actions, other.actions)


def test_cut_at_end_leaves_an_episode_that_terminated_on_the_last_step_alone():
    group, act = counting_group(10, length=10)
    record = group.run(act, 0, 1, cut_at_end=True)[0]
    assert record.terminated[-1] and not record.truncated.any()
    assert record.final_obs_steps.tolist() == [] and record.final_obs.shape == (0, 1)
    assert record.episode_lengths.tolist() == [10]


def test_env_truncation_mid_rollout_keeps_the_final_obs():
    env_seed, rollout_id = 31, 2
    group, act = group_and_act(fixtures.make_dict_env, 1, 25, policy=fixtures.DictPolicy(), env_seeds=[env_seed])
    record = group.run(act, rollout_id, 1, cut_at_end=False)[0]
    assert record.truncated.nonzero()[0].tolist() == [19]
    assert not record.terminated.any()
    assert record.final_obs_steps.tolist() == [19]
    assert record.final_obs["position"].shape == (1, 2) and record.final_obs["goal"].shape == (1,)
    assert record.obs["position"].shape == (25, 2) and record.obs["goal"].shape == (25,)
    # replay the same env: DictObsEnv's dynamics depend only on its seeded RNG
    env = fixtures.DictObsEnv()
    obs, _ = env.reset(seed=derive_seed(env_seed, rollout_id))
    for step in range(20):
        np.testing.assert_array_equal(record.obs["position"][step], obs["position"])
        assert record.obs["goal"][step] == obs["goal"]
        obs, reward, _, truncated, _ = env.step(record.actions[step])
        assert record.rewards[step] == reward
        assert truncated == (step == 19)
    np.testing.assert_array_equal(record.final_obs["position"][0], obs["position"])
    assert record.final_obs["goal"][0] == obs["goal"]
    # the step after the truncation starts the next episode, from a reset
    reset_obs, _ = env.reset()
    np.testing.assert_array_equal(record.obs["position"][20], reset_obs["position"])
    assert record.episode_lengths.tolist() == [20]
    assert record.episode_returns.tolist() == [pytest.approx(float(record.rewards[:20].sum()))]


def test_env_truncation_and_cut_in_one_rollout():
    group, act = group_and_act(fixtures.make_dict_env, 1, 25, policy=fixtures.DictPolicy())
    record = group.run(act, 0, 1, cut_at_end=True)[0]
    assert record.truncated.nonzero()[0].tolist() == [19, 24]
    assert record.final_obs_steps.tolist() == [19, 24]
    assert record.final_obs["position"].shape == (2, 2)
    np.testing.assert_array_equal(record.final_obs["position"][1], record.next_obs["position"])


def test_cartpole_episode_returns_and_lengths_match_the_rewards():
    group, act = group_and_act(fixtures.make_cartpole, 2, 120)
    for record in group.run(act, 0, 1, cut_at_end=False):
        ends = np.flatnonzero(record.terminated | record.truncated)
        assert len(ends) >= 1, "a random CartPole policy ends an episode within 120 steps"
        assert len(record.episode_lengths) == len(record.episode_returns) == len(ends)
        starts = np.concatenate([[0], ends[:-1] + 1])
        assert record.episode_lengths.tolist() == (ends - starts + 1).tolist()
        for start, end, episode_return in zip(starts, ends, record.episode_returns, strict=True):
            assert episode_return == pytest.approx(float(record.rewards[start:end + 1].sum()))


def test_weight_revealing_policy_shows_in_log_probs():
    policy = fixtures.WeightRevealingPolicy()
    policy.load_state_dict(fixtures.revealing_state(3.0))
    group, act = group_and_act(fixtures.make_cartpole, 2, 6, policy=policy)
    for record in group.run(act, 0, 3, cut_at_end=False):
        assert record.logits is None
        assert record.log_probs.tolist() == [3.0] * 6


def test_env_errors_propagate():
    group = ActorGroup(fixtures.make_failing_env, [0], [0], [0], 40)
    act = make_act_function(fixtures.mlp_policy(obs_size=1), group.action_space)
    with pytest.raises(RuntimeError, match="exploded at step 30"):
        group.run(act, 0, 1, cut_at_end=False)


def test_group_arguments_are_checked():
    with pytest.raises(ConfigError, match="one env seed and one agent seed per actor"):
        ActorGroup(fixtures.make_cartpole, [0, 1], [0], [0, 1], 5)
    with pytest.raises(ConfigError, match="one env seed"):
        ActorGroup(fixtures.make_cartpole, [], [], [], 5)
    with pytest.raises(ConfigError, match="gymnasium.Env, got str"):
        ActorGroup(lambda: "not an env", [0], [0], [0], 5)


def test_derive_seed_is_stable_and_separates_parts():
    assert derive_seed(1, 2) == derive_seed(1, 2)
    assert len({derive_seed(a, b) for a in range(20) for b in range(20)}) == 400
    assert 0 <= derive_seed(5) < 2**32


def test_an_env_that_changes_its_observation_shape_is_refused_with_the_fix():
    from rqrl.engine.policy import make_act_function
    from rqrl.errors import EnvError

    group = ActorGroup(fixtures.make_growing_obs_env, [0], [1], [2], 16)
    act = make_act_function(fixtures.WeightRevealingPolicy(), group.action_space)
    group.run(act, 0, 1, cut_at_end=False)
    group.run(act, 1, 1, cut_at_end=False)
    with pytest.raises(EnvError, match=r"changed shape .* fix the env factory"):
        for rollout_id in range(2, 5):
            group.run(act, rollout_id, 1, cut_at_end=False)


# ---- what the policy returns is checked before it reaches the learner (issue 9) ------------------------


class _BrokenPolicy(torch.nn.Module):
    """Samples like a categorical policy, then breaks one output as told."""

    def __init__(self, broken: str, from_step: int = 0):
        super().__init__()
        self.broken = broken
        self.from_step = from_step
        self.steps = 0
        self.inner = fixtures.mlp_policy(seed=0)

    def act(self, obs, generator):
        from rqrl.engine.policy import PolicyStep, categorical_step

        step = categorical_step(self.inner(obs), generator)
        self.steps += 1
        if self.steps <= self.from_step:
            return step
        if self.broken == "nan-log-probs":
            return PolicyStep(step.actions, torch.full_like(step.log_probs, float("nan")), step.logits)
        if self.broken == "nan-logits":
            return PolicyStep(step.actions, step.log_probs, torch.full_like(step.logits, float("nan")))
        if self.broken == "actions-per-env-twice":
            return PolicyStep(step.actions.repeat(2), step.log_probs, step.logits)
        if self.broken == "action-out-of-range":
            return PolicyStep(torch.full_like(step.actions, 5), step.log_probs, step.logits)
        return PolicyStep(step.actions.unsqueeze(-1), step.log_probs, step.logits)  # [B, 1] for Discrete


@pytest.mark.parametrize("broken, message", [
    ("nan-log-probs", r"log-probs \[nan, nan\] at step 0 .* expected finite numbers"),
    ("nan-logits", r"NaN logits at step 0"),
    ("actions-per-env-twice", r"actions of shape \(4,\) at step 0 .* need \(2,\)"),
    ("actions-with-an-extra-axis", r"actions of shape \(2, 1\) .* need \(2,\) .* Discrete\(2\)"),
    # CartPole failed on it with gymnasium's bare `AssertionError: np.int64(5) (<class 'numpy.int64'>) invalid`
    ("action-out-of-range", r"returned action 5, outside Discrete\(2\) \(each from 0 to 1\) at step 0"),
])
def test_policy_outputs_that_the_learner_must_not_train_on_raise_policy_error(broken, message):
    group, _ = group_and_act(fixtures.make_cartpole, 2, 8)
    act = make_act_function(_BrokenPolicy(broken), group.action_space)
    with pytest.raises(PolicyError, match=message):
        group.run(act, rollout_id=0, policy_version=1, cut_at_end=False)


@pytest.mark.parametrize("broken, message", [
    ("nan-log-probs", r"log-probs \[nan, nan\] at step 3 "),
    ("nan-logits", r"NaN logits at step 3 "),
])
def test_policy_outputs_are_refused_naming_the_first_step_at_fault(broken, message):
    # checked once per rollout, not per step: the error still names the step where they went wrong
    group, _ = group_and_act(fixtures.make_cartpole, 2, 8)
    act = make_act_function(_BrokenPolicy(broken, from_step=3), group.action_space)
    with pytest.raises(PolicyError, match=message):
        group.run(act, rollout_id=0, policy_version=1, cut_at_end=False)


def test_masked_actions_with_minus_infinite_logits_are_fine():
    class Masked(torch.nn.Module):
        def forward(self, obs):
            logits = torch.zeros(obs.shape[0], 2)
            logits[:, 1] = float("-inf")  # action 1 masked out
            return logits

    group, _ = group_and_act(fixtures.make_cartpole, 2, 8)
    records = group.run(make_act_function(Masked(), group.action_space), rollout_id=0, policy_version=1,
                        cut_at_end=False)
    assert all((record.actions == 0).all() for record in records)


# ---- the preallocated buffers and the Box fast path keep every record field (issue 10) ---------------------


def _short_cartpole():
    return gymnasium.make("CartPole-v1", max_episode_steps=12)  # truncations inside every rollout


class _AsDict(gymnasium.ObservationWrapper):
    """CartPole's Box observation as {"x": obs}: the tree path of the same env."""

    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gymnasium.spaces.Dict({"x": env.observation_space})

    def observation(self, observation):
        return {"x": observation}


class _EitherObsPolicy(torch.nn.Module):
    """One MLP's logits for a Box batch or for {"x": batch}; with ``sample_in_act`` it samples itself (torch)."""

    def __init__(self, sample_in_act: bool):
        super().__init__()
        self.inner = fixtures.mlp_policy(seed=3)
        if sample_in_act:
            self.act = lambda obs, generator: categorical_step(self(obs), generator)

    def forward(self, obs):
        return self.inner(obs["x"] if isinstance(obs, dict) else obs)


@pytest.mark.parametrize("sample_in_act", [False, True], ids=["logits-numpy", "act-torch"])
def test_box_observations_give_the_records_of_the_same_env_behind_a_dict(sample_in_act):
    runs = {}
    for name, factory in (("box", _short_cartpole), ("dict", lambda: _AsDict(_short_cartpole()))):
        group, act = group_and_act(factory, 3, 16, policy=_EitherObsPolicy(sample_in_act))
        runs[name] = [group.run(act, rollout_id, 1, cut_at_end=rollout_id == 1) for rollout_id in range(3)]
    assert any(len(record.final_obs_steps) for records in runs["box"] for record in records)
    for box_records, dict_records in zip(runs["box"], runs["dict"], strict=True):
        for box, tree in zip(box_records, dict_records, strict=True):
            for name in ("obs", "next_obs", "final_obs"):
                np.testing.assert_array_equal(getattr(box, name), getattr(tree, name)["x"])
                assert getattr(box, name).dtype == getattr(tree, name)["x"].dtype == np.float32
            for name in ("actions", "rewards", "terminated", "truncated", "log_probs", "logits", "final_obs_steps",
                         "episode_returns", "episode_lengths"):
                np.testing.assert_array_equal(getattr(box, name), getattr(tree, name))
                assert getattr(box, name).dtype == getattr(tree, name).dtype
            assert box.continues_previous == tree.continues_previous


def test_records_do_not_share_memory_with_the_next_rollout():
    group, act = group_and_act(_short_cartpole, 2, 10)
    first = group.run(act, 0, 1, cut_at_end=False)
    saved = [(record.obs.copy(), record.next_obs.copy(), record.actions.copy()) for record in first]
    group.run(act, 1, 1, cut_at_end=False)
    for record, (obs, next_obs, actions) in zip(first, saved, strict=True):
        np.testing.assert_array_equal(record.obs, obs)
        np.testing.assert_array_equal(record.next_obs, next_obs)
        np.testing.assert_array_equal(record.actions, actions)


def test_the_numpy_sampled_actions_follow_the_policy():
    class Biased(torch.nn.Module):
        def forward(self, obs):
            return torch.tensor([[0.0, 2.0]]).expand(obs.shape[0], 2)  # p(action 1) = 0.881

    group, _ = group_and_act(fixtures.make_cartpole, 8, 250)
    records = group.run(make_act_function(Biased(), group.action_space), 0, 1, cut_at_end=False)
    actions = np.concatenate([record.actions for record in records])
    assert abs(actions.mean() - 1 / (1 + np.exp(-2.0))) < 0.03  # 2,000 draws: about 4 standard deviations
    np.testing.assert_allclose(np.concatenate([record.log_probs for record in records]),
                               np.where(actions == 1, -np.log1p(np.exp(-2.0)), -np.log1p(np.exp(2.0))), rtol=1e-5)


class _DtypeSwitchingEnv(fixtures.CountingEnv):
    """Returns float64 observations from its 3rd step on (the space says float32)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return (obs.astype(np.float64) if self.count >= 3 else obs), reward, terminated, truncated, info


def test_an_env_that_changes_its_observation_dtype_mid_rollout_is_refused_with_the_fix():
    from rqrl.errors import EnvError

    group = ActorGroup(lambda: _DtypeSwitchingEnv(length=50), [0], [1], [2], 8)
    act = make_act_function(fixtures.mlp_policy(obs_size=1), group.action_space)
    with pytest.raises(EnvError, match=r"changed shape or dtype at step 3 .*float64.* fix the env factory"):
        group.run(act, 0, 1, cut_at_end=False)


def assert_first_rollout_refused(make_env, match: str) -> None:  # noqa: ANN001
    """A group of two such envs (one for a single-env factory) refuses its first rollout with EnvError."""
    from rqrl.errors import EnvError

    group = ActorGroup(make_env, [0, 1], [1, 2], [3, 4], 4)
    act = make_act_function(fixtures.mlp_policy(obs_size=1), group.action_space)
    with pytest.raises(EnvError, match=match):
        group.run(act, 0, 1, cut_at_end=False)


class _OldApiEnv(fixtures.CountingEnv):
    """Returns gym's old 4-tuple (obs, reward, done, info) from step."""

    def step(self, action):
        obs, reward, terminated, _, info = super().step(action)
        return obs, reward, terminated, info


class _RewardEnv(fixtures.CountingEnv):
    """Returns ``reward`` (a value of any type) from every step."""

    def __init__(self, reward):
        super().__init__(length=3)
        self.reward = reward

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, self.reward, terminated, truncated, info


def test_an_env_with_the_old_four_value_step_is_refused_with_the_fix():
    assert_first_rollout_refused(_OldApiEnv, r"lengths or types \['4'\] at step 0 .* \(obs, reward, terminated, "
                                             r"truncated, info\): convert an old gym env with shimmy")


class _NoneStepEnv(fixtures.CountingEnv):
    def step(self, action):
        return None


def test_an_env_whose_step_returns_no_tuple_is_refused_with_the_fix():
    assert_first_rollout_refused(_NoneStepEnv, r"lengths or types \['NoneType'\] at step 0")


class _ArrayDoneEnv(fixtures.CountingEnv):
    """Returns terminated as a two-element array."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, np.array([terminated, terminated]), truncated, info


def test_an_env_whose_terminated_is_not_one_bool_is_refused_with_the_fix():
    assert_first_rollout_refused(_ArrayDoneEnv, r"returned terminated .* at step 0 .* each must be one bool per step")


@pytest.mark.parametrize("reward, expected", [(np.float32(0.5), 0.5), (np.array([2.0]), 2.0), (3, 3.0)])
def test_rewards_of_numpy_scalar_one_element_array_and_int_types_are_recorded(reward, expected):
    group = ActorGroup(lambda: _RewardEnv(reward), [0, 1], [1, 2], [3, 4], 5)
    act = make_act_function(fixtures.mlp_policy(obs_size=1), group.action_space)
    records = group.run(act, 0, 1, cut_at_end=False)
    assert all(record.rewards.tolist() == [expected] * 5 for record in records)
    assert records[0].episode_returns.tolist() == [3 * expected]  # episodes of 3 steps


@pytest.mark.parametrize("reward, shown", [(None, "nan"), (float("nan"), "nan"), (-np.inf, "-inf")])
def test_a_reward_that_is_not_a_finite_number_is_refused_with_the_fix(reward, shown):
    assert_first_rollout_refused(lambda: _RewardEnv(reward),
                                 rf"actor 0's env returned reward {shown} at step 0 .* rewards must be finite numbers")


class _LateInfiniteRewardEnv(fixtures.CountingEnv):
    """Rewards 1.0, then inf from its 3rd step on."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, (np.inf if self.total_steps >= 3 else reward), terminated, truncated, info


def test_a_non_finite_reward_is_refused_naming_its_actor_and_step():
    # rewards are checked once per rollout: the error still names the first step and actor at fault
    envs = iter([fixtures.CountingEnv(length=50), _LateInfiniteRewardEnv(length=50)])
    group = ActorGroup(lambda: next(envs), [0, 1], [1, 2], [3, 4], 5)
    act = make_act_function(fixtures.mlp_policy(obs_size=1), group.action_space)
    with pytest.raises(EnvError, match=r"actor 1's env returned reward inf at step 2 "):
        group.run(act, 0, 1, cut_at_end=False)


@pytest.mark.parametrize("reward, shown", [(np.array([1.0, 2.0]), r"array\(\[1., 2.\]\)"), ("high", "'high'")])
def test_a_reward_that_is_not_one_number_is_refused_with_the_fix(reward, shown):
    assert_first_rollout_refused(lambda: _RewardEnv(reward),
                                 rf"actor 0's env returned reward {shown} at step 0 .* single numbers")
