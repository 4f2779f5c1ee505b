"""The DQN agent: config defaults and checks, heads, masked greedy actions, and learning with per-transition
bootstrap discounts (gamma**k, 0 after a termination)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from rqrl.errors import ConfigError
from rqrl.seed.agent import Agent, AgentConfig, QModel, masked_argmax
from rqrl.seed.nstep import TransitionBatch

SOURCE_DEFAULTS = {
    "replay_capacity": 10000, "batch_size": 32, "target_update_steps": 20, "discount_factor": 0.99,
    "use_double": True, "use_distributional": True, "n_atoms": 51, "v_min": -1, "v_max": 1,
    "use_prioritized_experience_replay": True, "alpha": 0.6, "beta_start": 0.4, "beta_end": 1.0,
    "beta_t_start": 0, "beta_t_end": 10000, "gradient_norm": 20, "huber_loss": False,
}


def test_defaults_are_the_sources():
    config = AgentConfig(state_shape=(4,), action_space_size=2)
    assert {name: getattr(config, name) for name in SOURCE_DEFAULTS} == SOURCE_DEFAULTS
    assert config.dueling is False


def test_attributes_set_after_construction_are_validated_by_the_agent():
    config = AgentConfig()
    config.state_shape, config.action_space_size = (4,), 0
    with pytest.raises(ConfigError, match="action_space_size"):
        Agent(config, lambda: torch.nn.Linear(4, 2))


@pytest.mark.parametrize(("name", "value", "match"), [
    ("state_shape", (), "state_shape"), ("batch_size", 0, "batch_size"), ("v_min", 2.0, "v_min"),
    ("discount_factor", 1.5, "discount_factor"), ("replay_device", "cuda", "replay_device"),
    ("state_dtype", "float16", "state_dtype to be one of float32, uint8"),
])
def test_bad_config(name, value, match):
    values = {"state_shape": (4,), "action_space_size": 2, name: value}
    with pytest.raises(ConfigError, match=match):
        AgentConfig(**values)


def test_dueling_head_combines_value_and_mean_centred_advantages():
    config = AgentConfig(state_shape=(1,), action_space_size=2, use_distributional=False, dueling=True)
    model = QModel(torch.nn.Identity(), config)
    q = model(torch.tensor([[10.0, 1.0, 3.0]]))
    assert q.tolist() == [[9.0, 11.0]]


def test_distributional_head_gives_expected_values():
    config = AgentConfig(state_shape=(1,), action_space_size=1, n_atoms=3, v_min=-1, v_max=1)
    model = QModel(torch.nn.Identity(), config)
    assert model(torch.tensor([[[0.0, 0.25, 0.75]]])).tolist() == [[0.75]]
    dueling = QModel(torch.nn.Identity(), dataclasses.replace(config, dueling=True))
    dist = dueling.dist(torch.zeros(1, 2, 3))
    assert torch.allclose(dist, torch.full((1, 1, 3), 1 / 3))


def test_masked_argmax_skips_illegal_actions_and_treats_an_empty_mask_as_all_legal():
    q = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    masks = torch.tensor([[False, False, True], [False, False, False]])
    assert masked_argmax(q, masks).tolist() == [2, 0]


class Table(torch.nn.Module):
    """Q-table over one-hot observations (or a distribution table): learns exactly what the targets say."""

    def __init__(self, states: int, actions: int, atoms: int | None = None):
        super().__init__()
        self.atoms = atoms
        self.table = torch.nn.Parameter(torch.zeros(states, actions * (atoms or 1)))

    def forward(self, obs):
        out = obs @ self.table
        if self.atoms is None:
            return out
        return torch.softmax(out.view(len(obs), -1, self.atoms), dim=-1)


def chain_batch():
    """s0 -a0-> s1 with reward 0 and discount 0.25 (k=2 at gamma 0.5); s1 -any-> terminal with reward 1."""
    eye = np.eye(2, dtype=np.float32)
    return TransitionBatch(obs=eye[[0, 1, 1]], actions=np.array([0, 0, 1]), rewards=np.array([0.0, 1.0, 1.0],
                           np.float32), discounts=np.array([0.25, 0.0, 0.0], np.float32),
                           next_obs=eye[[1, 0, 0]], next_masks=np.ones((3, 2), bool))


@pytest.mark.parametrize("distributional", [False, True])
@pytest.mark.parametrize("double", [False, True])
def test_learning_bootstraps_with_each_transitions_own_discount(distributional, double, one_torch_thread):
    torch.manual_seed(0)
    config = AgentConfig(state_shape=(2,), action_space_size=2, use_distributional=distributional, n_atoms=11,
                         batch_size=8, target_update_steps=5, use_double=double, seed=0)
    agent = Agent(config, lambda: Table(2, 2, 11 if distributional else None),
                  lambda params: torch.optim.Adam(params, lr=0.05))
    agent.observe(chain_batch())
    for _ in range(600):
        agent.train_step()
    q = agent.q_values(np.eye(2, dtype=np.float32))
    assert q[1] == pytest.approx([1.0, 1.0], abs=0.05)
    assert q[0, 0] == pytest.approx(0.25, abs=0.05)


def test_target_network_is_copied_every_target_update_steps():
    config = AgentConfig(state_shape=(2,), action_space_size=2, use_distributional=False, batch_size=4,
                         target_update_steps=3, use_prioritized_experience_replay=False, seed=0)
    agent = Agent(config, lambda: Table(2, 2), lambda params: torch.optim.SGD(params, lr=0.1))
    agent.observe(chain_batch())
    agent.train_step()
    agent.train_step()
    assert torch.equal(agent.target.network.table, torch.zeros(2, 2))
    agent.train_step()
    assert torch.equal(agent.target.network.table, agent.model_instance.network.table)


def test_priorities_follow_the_errors_and_beta_anneals():
    config = AgentConfig(state_shape=(2,), action_space_size=2, use_distributional=False, batch_size=3,
                         beta_t_end=2, alpha=1.0, seed=0)
    agent = Agent(config, lambda: Table(2, 2), lambda params: torch.optim.SGD(params, lr=0.0))
    agent.observe(chain_batch())
    assert agent.beta() == pytest.approx(0.4)
    agent.train_step()
    leaves = agent.replay.tree.leaves(np.arange(3))
    assert leaves[1] == pytest.approx(1.0) and leaves[0] == pytest.approx(1e-6)  # Q all 0: |TD| = reward
    agent.train_step()
    assert agent.beta() == pytest.approx(1.0)


def test_act_is_greedy_over_legal_actions():
    config = AgentConfig(state_shape=(2,), action_space_size=2, use_distributional=False)
    agent = Agent(config, lambda: Table(2, 2))
    with torch.no_grad():
        agent.model_instance.network.table.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    obs = np.eye(2, dtype=np.float32)
    assert agent.act(obs).tolist() == [0, 1]
    assert agent.act(obs, np.array([[False, True], [True, False]])).tolist() == [1, 0]


class MeanPixel(torch.nn.Module):
    """Q-values from the mean pixel of an image; remembers the dtypes it was given."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2))
        self.given: set[torch.dtype] = set()

    def forward(self, obs):
        self.given.add(obs.dtype)
        return obs.flatten(1).mean(1, keepdim=True) / 255.0 * self.weight


def test_a_uint8_replay_holds_images_as_uint8_and_the_network_still_gets_float32():
    config = AgentConfig(state_shape=(4, 8, 8), state_dtype="uint8", action_space_size=2, use_distributional=False,
                         batch_size=4, seed=0)
    agent = Agent(config, MeanPixel)
    frames = np.full((3, 4, 8, 8), 255, np.uint8)
    agent.observe(TransitionBatch(frames, np.zeros(3, np.int64), np.ones(3, np.float32), np.zeros(3, np.float32),
                                  frames, np.ones((3, 2), bool)))
    assert agent.replay.observations.dtype == np.uint8
    loss = agent.train_step()
    assert np.isfinite(loss)
    assert agent.model_instance.network.given == {torch.float32}  # online and target networks alike
    assert agent.target.network.given == {torch.float32}


@pytest.mark.parametrize(("overrides", "network", "expected", "got"), [
    ({}, lambda: torch.nn.Linear(4, 3), "(B, 2)", "(B, 3)"),
    ({"dueling": True}, lambda: torch.nn.Linear(4, 2), "(B, 3)", "(B, 2)"),
    ({"use_distributional": True, "n_atoms": 11}, lambda: torch.nn.Linear(4, 2), "(B, 2, 11)", "(B, 2)"),
])
def test_a_network_whose_output_does_not_fit_the_head_is_refused_naming_both_shapes(overrides, network, expected,
                                                                                     got):
    """Its output width once surfaced as torch's "size of tensor a (2) must match ... (3)" inside train_step."""
    config = AgentConfig(state_shape=(4,), action_space_size=2, **{"use_distributional": False, **overrides})
    with pytest.raises(ConfigError, match=rf"expected the network to output shape {re.escape(expected)} .* got "
                                          rf"{re.escape(got)}.*action_space_size=2"):
        Agent(config, network)


def test_a_network_that_fails_on_observations_of_state_shape_is_refused_naming_state_shape():
    config = AgentConfig(state_shape=(5,), action_space_size=2, use_distributional=False)
    with pytest.raises(ConfigError, match=r"failed on a batch of zero observations of shape \(2, 5\) "
                                          r"\(AgentConfig.state_shape=\(5,\)\).*mat1 and mat2") as raised:
        Agent(config, lambda: torch.nn.Linear(4, 2))
    assert isinstance(raised.value.__cause__, RuntimeError)


class NoisyOutput(torch.nn.Module):
    """Q-values with fresh noise at each call (as NoisyNets draw); remembers its training mode at each call."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.modes: list[bool] = []

    def forward(self, obs):
        self.modes.append(self.training)
        return self.layer(obs) + torch.randn(len(obs), 2)


def test_the_network_check_runs_in_eval_mode_and_leaves_the_mode_and_the_rng_as_they_were():
    config = AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False)
    torch.manual_seed(0)
    agent = Agent(config, NoisyOutput)
    after_agent = torch.rand(3)
    torch.manual_seed(0)
    NoisyOutput()  # what the agent draws to build its network
    assert torch.equal(after_agent, torch.rand(3)), "the check drew from the RNG: seeded runs would change"
    assert agent.model_instance.network.modes == [False] and agent.model_instance.training


def test_the_network_check_leaves_a_submodule_kept_in_eval_mode_in_eval_mode():
    def network() -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
        model[1].eval()  # a user's frozen part
        return model

    agent = Agent(AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False), network)
    modes = [module.training for module in agent.model_instance.network]
    assert modes == [True, False, True], modes
