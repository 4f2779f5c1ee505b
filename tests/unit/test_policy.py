"""The policy protocol: plain modules as categorical logits, ActorPolicy objects, state-dict checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rqrl.engine.policy import (
    ActorPolicy,
    LogitsActFunction,
    PolicyStep,
    categorical_step,
    check_state_dict,
    make_act_function,
    sample_logits,
    select_policy_state,
    state_dict_of,
)
from rqrl.errors import PolicyError
from tests import fixtures


def test_module_on_discrete_samples_from_its_logits():
    policy = fixtures.mlp_policy(obs_size=4, n_actions=3, seed=1)
    act = make_act_function(policy, spaces.Discrete(3))
    obs = torch.randn(64, 4)
    step = act(obs, torch.Generator().manual_seed(0))
    assert isinstance(step, PolicyStep)
    assert step.actions.shape == (64,) and step.log_probs.shape == (64,) and step.logits.shape == (64, 3)
    assert step.actions.dtype == torch.int64
    assert 0 <= int(step.actions.min()) and int(step.actions.max()) < 3
    with torch.no_grad():
        logits = policy(obs)
    torch.testing.assert_close(step.logits, logits)
    expected = torch.log_softmax(logits, -1).gather(-1, step.actions.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(step.log_probs, expected)


def test_module_actions_follow_the_logits():
    class Fixed(torch.nn.Module):
        def forward(self, obs):
            return torch.tensor([[0.0, 50.0, 0.0]]).expand(obs.shape[0], 3)

    act = make_act_function(Fixed(), spaces.Discrete(3))
    step = act(torch.zeros(200, 2), torch.Generator().manual_seed(1))
    assert step.actions.tolist() == [1] * 200
    assert torch.all(step.log_probs > -1e-6)


def test_module_with_wrong_logit_count_is_refused_when_called():
    act = make_act_function(fixtures.mlp_policy(n_actions=2), spaces.Discrete(5))
    with pytest.raises(PolicyError, match=r"logits of shape \(3, 2\), expected \[B, 5\]"):
        act(torch.zeros(3, 4), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("action_space", [spaces.Box(-1, 1, (2,)), spaces.MultiDiscrete([2, 3])])
def test_module_on_a_non_discrete_space_is_refused_and_points_to_act(action_space):
    with pytest.raises(PolicyError, match=r"Discrete action space.*act\(obs, generator\)"):
        make_act_function(fixtures.mlp_policy(), action_space)


class GaussianPolicy:
    """A plain object (not a Module) acting on a Box action space."""

    def __init__(self):
        self.mean = torch.tensor([0.5, -0.5])

    def act(self, obs, generator):
        noise = torch.randn((obs.shape[0], 2), generator=generator)
        actions = self.mean + noise
        log_probs = torch.distributions.Normal(self.mean, 1.0).log_prob(actions).sum(-1)
        return PolicyStep(actions=actions, log_probs=log_probs)


def test_actor_policy_objects_act_themselves_on_any_space():
    policy = GaussianPolicy()
    assert isinstance(policy, ActorPolicy)
    act = make_act_function(policy, spaces.Box(-5, 5, (2,)))
    assert act == policy.act
    first = act(torch.zeros(4, 3), torch.Generator().manual_seed(3))
    second = act(torch.zeros(4, 3), torch.Generator().manual_seed(3))
    assert first.actions.shape == (4, 2) and first.logits is None
    torch.testing.assert_close(first.actions, second.actions)


def test_module_with_an_act_method_uses_act_not_forward():
    policy = fixtures.WeightRevealingPolicy()
    policy.load_state_dict(fixtures.revealing_state(2.5))
    act = make_act_function(policy, spaces.Box(-1, 1, (1,)))
    step = act(torch.zeros(5, 4), torch.Generator().manual_seed(0))
    assert step.log_probs.tolist() == [2.5] * 5


def test_dict_policy_acts_on_dict_obs():
    policy = fixtures.DictPolicy()
    act = make_act_function(policy, spaces.Discrete(3))
    obs = {"position": torch.zeros(6, 2), "goal": torch.tensor([0, 1, 2, 0, 1, 2])}
    step = act(obs, torch.Generator().manual_seed(0))
    assert step.actions.shape == (6,) and step.logits.shape == (6, 3)


@pytest.mark.parametrize("policy", [object(), "policy", lambda obs: obs])
def test_objects_that_fit_no_protocol_are_refused(policy):
    with pytest.raises(PolicyError, match="expected a torch.nn.Module or an object with act"):
        make_act_function(policy, spaces.Discrete(2))


def test_state_dict_of():
    policy = fixtures.mlp_policy()
    state = state_dict_of(policy)
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    with pytest.raises(PolicyError, match="GaussianPolicy needs state_dict"):
        state_dict_of(GaussianPolicy())


def test_check_state_dict_accepts_the_same_architecture():
    check_state_dict(fixtures.mlp_policy(seed=0).state_dict(), fixtures.mlp_policy(seed=1).state_dict())


def test_check_state_dict_names_every_mismatch():
    expected = fixtures.mlp_policy().state_dict()
    given = dict(expected)
    del given["2.bias"]
    given["extra.weight"] = torch.zeros(1)
    given["0.weight"] = torch.zeros(16, 5)
    with pytest.raises(PolicyError) as raised:
        check_state_dict(expected, given)
    message = str(raised.value)
    assert "missing keys ['2.bias']" in message
    assert "unexpected keys ['extra.weight']" in message
    assert "0.weight: expected (16, 4), got (16, 5)" in message


@pytest.mark.parametrize("mutate", ["missing", "unexpected", "shape"])
def test_check_state_dict_refuses_each_kind_alone(mutate):
    expected = fixtures.mlp_policy().state_dict()
    given = dict(expected)
    if mutate == "missing":
        given.pop("0.bias")
    elif mutate == "unexpected":
        given["new"] = torch.zeros(2)
    else:
        given["2.bias"] = torch.zeros(3)
    with pytest.raises(PolicyError, match="state dict does not match"):
        check_state_dict(expected, given)


def test_categorical_step_is_reproducible_with_a_seeded_generator():
    logits = torch.randn(500, 4, generator=torch.Generator().manual_seed(0))
    first = categorical_step(logits, torch.Generator().manual_seed(42))
    again = categorical_step(logits, torch.Generator().manual_seed(42))
    other = categorical_step(logits, torch.Generator().manual_seed(43))
    assert torch.equal(first.actions, again.actions)
    assert torch.equal(first.log_probs, again.log_probs)
    assert not torch.equal(first.actions, other.actions)
    assert first.logits is logits


def test_categorical_step_does_not_touch_the_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    categorical_step(torch.zeros(10, 3), torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), expected)


def test_categorical_step_frequencies_follow_the_probabilities():
    probs = torch.tensor([0.1, 0.6, 0.3])
    logits = probs.log().expand(20000, 3)
    step = categorical_step(logits, torch.Generator().manual_seed(7))
    frequencies = torch.bincount(step.actions, minlength=3).float() / 20000
    torch.testing.assert_close(frequencies, probs, atol=0.02, rtol=0)


# ---- numpy sampling of a plain module's logits (the rollouts' fast path, issue 10) ----------------------


def test_sample_logits_draws_from_the_softmax_and_gives_its_log_probs():
    logits = np.tile(np.array([[0.5, 1.5, -1.0, 2.0]], np.float32), (200_000, 1))
    actions, log_probs = sample_logits(logits, np.random.default_rng(0))
    expected = torch.softmax(torch.from_numpy(logits[0]), dim=-1).numpy()
    frequencies = np.bincount(actions, minlength=4) / len(actions)
    assert np.abs(frequencies - expected).max() < 0.01  # about 10 standard deviations
    assert actions.dtype == np.int64 and log_probs.dtype == np.float32
    np.testing.assert_allclose(log_probs, np.log(expected)[actions], rtol=1e-5)


def test_sample_logits_is_reproducible_from_the_seed_and_varies_with_it():
    logits = np.random.default_rng(1).normal(size=(500, 4)).astype(np.float32)
    first = sample_logits(logits, np.random.default_rng(42))
    again = sample_logits(logits, np.random.default_rng(42))
    other = sample_logits(logits, np.random.default_rng(43))
    assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])


@pytest.mark.parametrize("masked", [[0], [1, 2], [3], [0, 3]])
def test_sample_logits_never_draws_a_masked_action(masked):
    logits = np.zeros((20_000, 4), np.float32)
    logits[:, masked] = -np.inf
    actions, log_probs = sample_logits(logits, np.random.default_rng(0))
    assert not np.isin(actions, masked).any()
    assert set(actions.tolist()) == set(range(4)) - set(masked)
    np.testing.assert_allclose(log_probs, -np.log(4 - len(masked)), rtol=1e-6)


def test_a_plain_module_acts_through_numpy_with_its_own_logits():
    policy = fixtures.mlp_policy(obs_size=4, n_actions=3, seed=0)
    act = make_act_function(policy, spaces.Discrete(3))
    assert isinstance(act, LogitsActFunction)
    obs = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        step = act.act_numpy(obs, np.random.default_rng(0))
        np.testing.assert_array_equal(step.logits, policy(obs).numpy())
        torch_step = act(obs, torch.Generator().manual_seed(0))  # the ActFunction protocol still samples in torch
    assert step.actions.shape == (6,) and step.actions.dtype == np.int64
    assert torch_step.actions.shape == (6,)
    np.testing.assert_allclose(step.log_probs, torch.log_softmax(torch.from_numpy(step.logits), -1).numpy()[
        np.arange(6), step.actions], rtol=1e-5)


class ActorCritic(torch.nn.Module):
    """A learner's model with the actors' policy beside a critic, as a Maze learner broadcasts it."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = fixtures.mlp_policy(seed=5)
        self.critic = torch.nn.Linear(4, 1)


def test_select_policy_state_drops_other_modules_keys():
    expected = fixtures.mlp_policy().state_dict()
    model = ActorCritic()
    policy_state = model.policy.state_dict()
    # the policy's keys with a critic's beside them
    flat = {**policy_state, "critic.weight": torch.zeros(1, 4)}
    assert select_policy_state(expected, flat).keys() == expected.keys()
    # below a prefix: an actor-critic module's own state_dict()
    selected = select_policy_state(expected, model.state_dict())
    assert list(selected) == list(expected)
    assert all(torch.equal(selected[key], policy_state[key]) for key in expected)
    # nested one dict per network, as Maze's TorchActorCritic.state_dict() gives it
    nested = {"policy": dict(policy_state), "critics": {"0": model.critic.state_dict()}}
    assert all(torch.equal(select_policy_state(expected, nested)[key], policy_state[key]) for key in expected)


def test_select_policy_state_leaves_a_mismatch_for_check_state_dict_to_name():
    expected = fixtures.mlp_policy().state_dict()
    given = {"0.weight": torch.zeros(3, 3)}
    assert select_policy_state(expected, given) == given
    with pytest.raises(PolicyError, match="missing keys"):
        check_state_dict(expected, select_policy_state(expected, given))


def test_select_policy_state_refuses_the_policy_below_two_prefixes():
    expected = fixtures.mlp_policy().state_dict()
    state = {f"{prefix}.{key}": value for prefix in ("policy", "target") for key, value in expected.items()}
    with pytest.raises(PolicyError, match=r"below several prefixes \['policy.', 'target.'\]"):
        select_policy_state(expected, state)


def test_select_policy_state_picks_the_prefix_holding_exactly_the_policy_when_a_critic_shares_key_names():
    expected = {"weight": torch.zeros(())}
    state = {"policy.weight": torch.ones(()), "critic.weight": torch.zeros(1, 4), "critic.bias": torch.zeros(1)}
    assert select_policy_state(expected, state) == {"weight": state["policy.weight"]}


def test_actions_out_of_range_are_named_for_integer_spaces_only():
    from gymnasium import spaces

    from rqrl.engine.policy import actions_out_of_range

    assert actions_out_of_range(spaces.Discrete(3, start=1), np.array([1, 3])) is None
    assert actions_out_of_range(spaces.Discrete(3, start=1), np.array([1, 0])) == (
        "action 0, outside Discrete(3, start=1) (each from 1 to 3)")
    assert "dtype float32" in actions_out_of_range(spaces.Discrete(2), np.array([0.5], np.float32))
    multi = spaces.MultiDiscrete([2, 5])
    assert actions_out_of_range(multi, np.array([[1, 4], [0, 0]])) is None
    assert actions_out_of_range(multi, np.array([[1, 4], [2, 0]])) == (
        "action 2, outside MultiDiscrete([2 5]) (each from [0, 0] to [1, 4])")
    assert actions_out_of_range(spaces.Box(-1, 1, (2,)), np.array([[5.0, 5.0]])) is None  # a Box env clips
    assert actions_out_of_range(multi, np.array([[0, 1, 2]])) is None  # a shape that does not fit: said elsewhere
