"""rqrl.algorithms.dqn without processes: the Q-network's shapes for every head, and its weights files."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rqrl.algorithms.checkpoint import save_weights
from rqrl.algorithms.cnn import NatureCNN
from rqrl.algorithms.dqn import DqnConfig, QNetwork, _DqnRun, load_q_model
from rqrl.errors import ConfigError
from rqrl.seed.agent import AgentConfig, QModel


@pytest.mark.parametrize("distributional", [False, True])
@pytest.mark.parametrize("dueling", [False, True])
def test_every_head_gives_q_values_per_action(distributional, dueling):
    config = AgentConfig(state_shape=(4,), action_space_size=3, use_distributional=distributional, dueling=dueling,
                         n_atoms=5, v_min=0, v_max=10)
    network = QNetwork(4, 3, 8, 5 if distributional else None, dueling)
    model = QModel(network, config)
    q = model(torch.zeros(2, 4))
    assert q.shape == (2, 3)
    if distributional:
        dist = model.dist(torch.zeros(2, 4))
        assert dist.shape == (2, 3, 5) and torch.allclose(dist.sum(-1), torch.ones(2, 3))
        assert ((q >= 0) & (q <= 10)).all()


@pytest.mark.parametrize("distributional", [False, True])
def test_weights_files_load_back_into_the_same_model(tmp_path, distributional):
    config = AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=distributional, dueling=True,
                         n_atoms=7, v_min=0, v_max=50)
    network = QNetwork(4, 2, 8, 7 if distributional else None, True)
    save_weights(tmp_path / "final.safetensors", network.state_dict(),
                 {"algo": "dqn", "env_id": "CartPole-v1", "hidden_size": 8, "distributional": distributional,
                  "dueling": True, "n_atoms": 7, "v_min": 0, "v_max": 50})
    loaded, metadata = load_q_model(tmp_path)
    obs = torch.randn(3, 4)
    assert torch.allclose(loaded(obs), QModel(network, config)(obs))
    assert metadata["env_id"] == "CartPole-v1"


def test_other_weights_are_not_taken_for_dqn(tmp_path):
    save_weights(tmp_path / "final.safetensors", {"w": torch.zeros(1)}, {"env_id": "CartPole-v1", "hidden_size": 8})
    with pytest.raises(ConfigError, match="no DQN weights"):
        load_q_model(tmp_path)


def test_config_checks():
    with pytest.raises(ConfigError, match="seconds"):
        DqnConfig(seconds=0)


def test_a_checkpoint_loads_back_bit_identical_networks_optimizer_and_counters(tmp_path):
    from rqrl.algorithms.dqn import load_agent_checkpoint, save_agent_checkpoint
    from rqrl.seed.agent import Agent

    def make_agent(seed: int) -> Agent:
        torch.manual_seed(seed)
        config = AgentConfig(state_shape=(4,), action_space_size=2, replay_capacity=100, batch_size=4,
                             use_distributional=False)
        return Agent(config, lambda: QNetwork(4, 2, 8, None, False),
                     lambda parameters: torch.optim.Adam(parameters, lr=1e-3))

    agent = make_agent(0)
    for _ in range(3):  # an optimizer with state, and a target that differs from the online network
        agent.optimizer.zero_grad()
        agent.model_instance(torch.randn(5, 4)).pow(2).sum().backward()
        agent.optimizer.step()
    agent.train_steps = 3
    save_agent_checkpoint(tmp_path / "checkpoint.safetensors", agent, {"algo": "dqn", "env_steps": 1234})
    other = make_agent(1)
    counters = load_agent_checkpoint(tmp_path, other)
    assert counters["env_steps"] == 1234 and other.train_steps == 3
    for mine, theirs in ((agent.model_instance, other.model_instance), (agent.target, other.target)):
        for (name, value), loaded in zip(mine.state_dict().items(), theirs.state_dict().values(), strict=True):
            assert torch.equal(value, loaded), name
    assert not torch.equal(other.model_instance.network.layers[0].weight, other.target.network.layers[0].weight)
    mine_state, their_state = agent.optimizer.state_dict()["state"], other.optimizer.state_dict()["state"]
    assert mine_state.keys() == their_state.keys()
    for index in mine_state:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(mine_state[index][name]), torch.as_tensor(their_state[index][name]))


def test_a_checkpoint_of_another_algorithm_is_refused(tmp_path):
    from rqrl.algorithms.checkpoint import TrainingState, save_checkpoint
    from rqrl.algorithms.dqn import load_agent_checkpoint
    from rqrl.seed.agent import Agent

    save_checkpoint(tmp_path / "checkpoint.safetensors", TrainingState({"w": torch.zeros(1)}, {}, {"env_steps": 1}))
    agent = Agent(AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False),
                  lambda: QNetwork(4, 2, 8, None, False))
    with pytest.raises(ConfigError, match="no DQN checkpoint"):
        load_agent_checkpoint(tmp_path, agent)


def test_a_checkpoint_of_another_network_size_is_refused_with_the_fix(tmp_path):
    from rqrl.algorithms.dqn import load_agent_checkpoint, save_agent_checkpoint
    from rqrl.seed.agent import Agent

    def make_agent(hidden: int) -> Agent:
        return Agent(AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False),
                     lambda: QNetwork(4, 2, hidden, None, False))

    save_agent_checkpoint(tmp_path / "checkpoint.safetensors", make_agent(8), {"algo": "dqn", "env_id": "X"})
    with pytest.raises(ConfigError, match="--hidden-size"):
        load_agent_checkpoint(tmp_path, make_agent(16))


PIXELS = "tests.fixtures:RqrlPixelSign-v0"


@pytest.mark.parametrize("distributional", [False, True])
@pytest.mark.parametrize("dueling", [False, True])
def test_images_get_a_head_on_the_nature_cnn_for_every_head(distributional, dueling):
    config = AgentConfig(state_shape=(4, 84, 84), action_space_size=6, use_distributional=distributional,
                         dueling=dueling, n_atoms=5, v_min=-21, v_max=21)
    network = QNetwork((4, 84, 84), 6, 128, 5 if distributional else None, dueling)
    assert isinstance(network.torso, NatureCNN) and network.layers.in_features == 512  # hidden_size: the MLP's
    q = QModel(network, config)(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert q.shape == (2, 6)


def test_a_run_on_images_has_the_cnn_and_a_uint8_replay(tmp_path):
    run = _DqnRun(DqnConfig(env_id=PIXELS, run_dir=str(tmp_path), replay_capacity=100))
    assert isinstance(run.agent.model_instance.network.torso, NatureCNN)
    assert run.agent.config.state_shape == (2, 36, 36) and run.agent.replay.observations.dtype == np.uint8
    assert type(run.agent.replay.observations).__name__ == "FrameStore"  # images: each frame held once
    cartpole = _DqnRun(DqnConfig(run_dir=str(tmp_path), replay_capacity=100))  # vectors: the MLP, a float32 replay
    assert cartpole.agent.model_instance.network.torso is None
    assert cartpole.agent.replay.observations.dtype == np.float32


def test_image_weights_files_load_back_into_the_cnn(tmp_path):
    torch.manual_seed(0)
    network = QNetwork((2, 36, 36), 2, 8, None, False)
    save_weights(tmp_path / "final.safetensors", network.state_dict(),
                 {"algo": "dqn", "env_id": PIXELS, "hidden_size": 8, "distributional": False, "dueling": False})
    loaded, _ = load_q_model(tmp_path)
    frames = torch.randint(0, 256, (3, 2, 36, 36), dtype=torch.uint8)
    assert torch.allclose(loaded(frames), network(frames))


# --------------------------------------------------------------- resume: time budget, best weights, finished runs


def dqn_run_at(tmp_path, trained: float, best: float | None = None, **settings) -> _DqnRun:
    """A DQN run folder whose checkpoint has trained for ``trained`` seconds, resumed with ``settings``."""
    from types import SimpleNamespace

    from rqrl.algorithms.common import write_config
    from rqrl.algorithms.dqn import save_agent_checkpoint

    first = _DqnRun(DqnConfig(run_dir=str(tmp_path), run_name="run", progress=False, hidden_size=16))
    first.folder.open()
    write_config(first.run_dir, first.config, "dqn")
    first.best = best
    stats = SimpleNamespace(transitions_received=500, train_steps=10, episodes=5, weights_version=3,
                            recent_returns=[20.0] * 5)
    save_agent_checkpoint(first.run_dir / "checkpoint.safetensors", first.agent,
                          {**first.counters(SimpleNamespace(stats=stats)), "seconds": trained})
    first.folder.close()
    return _DqnRun(DqnConfig(resume=str(first.run_dir), progress=False, hidden_size=16, **settings))


class StartOnly:
    """A SEED trainer that records the duration it is started for and trains nothing."""

    durations: list[float] = []

    def __init__(self, agent, config, env_factory, on_progress=None):
        from types import SimpleNamespace

        self.stats = SimpleNamespace(transitions_received=0, train_steps=0, episodes=0, weights_version=0,
                                     recent_returns=[])
        self.redis_url, self.stopped_from_outside = None, False

    def start(self, duration: float) -> None:
        StartOnly.durations.append(duration)


def test_a_resumed_run_trains_for_what_is_left_of_its_time_budget(tmp_path, monkeypatch):
    """--seconds counts every session of a run, as --total-env-steps does (and as the report's seconds do)."""
    from rqrl.algorithms import dqn

    run = dqn_run_at(tmp_path, trained=8.0, seconds=12.0)
    run.folder.close()
    monkeypatch.setattr(dqn, "Trainer", StartOnly)
    StartOnly.durations.clear()
    dqn.train(dataclasses.replace(run.config, resume=str(run.run_dir), run_name=None))
    assert len(StartOnly.durations) == 1 and 3.5 < StartOnly.durations[0] <= 4.0


def test_resuming_a_dqn_run_past_its_time_budget_says_it_is_finished(tmp_path):
    with pytest.raises(ConfigError, match=r"is finished: it used its time budget \(12.5 s of --seconds 12\).*"
                                          r"a higher --seconds"):
        dqn_run_at(tmp_path, trained=12.5, seconds=12.0)


def test_a_resumed_dqn_run_takes_the_best_return_of_its_best_weights_file(tmp_path):
    run = dqn_run_at(tmp_path, trained=1.0, best=12.0)
    assert run.best is None  # no best.safetensors: the checkpoint's 12.0 has no weights behind it
    run.folder.close()
    save_weights(run.run_dir / "best.safetensors", {"x": torch.zeros(1)}, {"mean_return": 214.67})
    resumed = _DqnRun(DqnConfig(resume=str(run.run_dir), progress=False, hidden_size=16))
    resumed.folder.close()
    assert resumed.best == 214.67


def test_resuming_a_finished_dqn_run_does_not_say_it_resumed(tmp_path, caplog):
    """The check comes first: the log line that the run goes on (and its replay refills) only where it does."""
    with caplog.at_level("WARNING", logger="rqrl.algorithms.dqn"), pytest.raises(ConfigError, match="is finished"):
        dqn_run_at(tmp_path / "finished", trained=12.5, seconds=12.0)
    assert "resumed from" not in caplog.text
    with caplog.at_level("WARNING", logger="rqrl.algorithms.dqn"):
        dqn_run_at(tmp_path / "going_on", trained=1.0, seconds=12.0).folder.close()
    assert "resumed from" in caplog.text and "at 500 env steps; the replay starts empty" in caplog.text
