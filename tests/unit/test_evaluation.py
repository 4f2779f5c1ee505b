"""rqrl.algorithms.evaluation: greedy episodes on an env of their own, and the evaluation during training
(--eval-every) that runs them when due."""

from __future__ import annotations

import pytest
import torch

from rqrl.algorithms.common import make_flat_env
from rqrl.algorithms.evaluation import EVAL_SEED_OFFSET, PeriodicEvaluation, check_evaluation, run_episodes
from rqrl.algorithms.impala import ActorCritic
from rqrl.errors import ConfigError

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("one_torch_thread")]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class AlwaysRight(torch.nn.Module):
    """CartPole's policy that pushes towards the side the pole leans to: long episodes, greedy."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        leaning_right = (obs[:, 2] + obs[:, 3] > 0).float() * self.scale
        return torch.stack([1 - leaning_right, leaning_right], dim=-1)


def test_greedy_episodes_are_seeded_and_take_the_argmax():
    env = make_flat_env("CartPole-v1")
    try:
        balanced = run_episodes(AlwaysRight(), env, episodes=3, seed=5)
        assert balanced == run_episodes(AlwaysRight(), env, episodes=3, seed=5)
        torch.manual_seed(0)
        untrained = run_episodes(ActorCritic(4, 2, 16), env, episodes=3, seed=5)
    finally:
        env.close()
    assert min(balanced) > 2 * max(untrained), (balanced, untrained)


def test_an_evaluation_comes_when_due_and_the_next_after_another_interval():
    clock = Clock()
    evaluation = PeriodicEvaluation("CartPole-v1", 10.0, episodes=2, seed=3, clock=clock)
    try:
        assert evaluation.maybe_run(AlwaysRight()) is None
        clock.now += 10.0
        figures = evaluation.maybe_run(AlwaysRight())
        assert figures is not None and set(figures) == {"eval_return", "eval_return_std", "eval_seconds"}
        assert figures["eval_return"] > 100 and figures["eval_seconds"] > 0
        env = make_flat_env("CartPole-v1")
        assert figures["eval_return"] == sum(run_episodes(AlwaysRight(), env, 2, 3 + EVAL_SEED_OFFSET)) / 2
        env.close()
        clock.now += 9.0
        assert evaluation.maybe_run(AlwaysRight()) is None
        clock.now += 1.0
        assert evaluation.maybe_run(AlwaysRight()) is not None
    finally:
        evaluation.close()


def test_the_clock_starts_at_the_first_batch_not_while_the_learner_waits_for_workers():
    clock = Clock()
    evaluation = PeriodicEvaluation("CartPole-v1", 10.0, episodes=1, seed=3, clock=clock)  # made at the start
    try:
        clock.now += 45.0  # the workers took their time to come
        assert evaluation.maybe_run(AlwaysRight()) is None, "the first batch: training starts now"
        clock.now += 9.0
        assert evaluation.maybe_run(AlwaysRight()) is None
        clock.now += 1.0
        assert evaluation.maybe_run(AlwaysRight()) is not None, "--eval-every seconds into training"
    finally:
        evaluation.close()


def test_no_eval_every_never_evaluates():
    evaluation = PeriodicEvaluation("CartPole-v1", None, episodes=2, seed=0, clock=lambda: 1e12)
    assert evaluation.maybe_run(AlwaysRight()) is None
    evaluation.close()


@pytest.mark.parametrize("every, episodes, message", [(0, 5, "expected eval_every > 0"),
                                                      (-1.0, 5, "expected eval_every > 0"),
                                                      (None, 0, "expected eval_episodes to be an int >= 1")])
def test_bad_settings_name_the_setting(every, episodes, message):
    with pytest.raises(ConfigError, match=message):
        check_evaluation(every, episodes)


@pytest.fixture
def dqn_run(tmp_path):
    """A DQN run folder as `rqrl train dqn` leaves it: config.json, best and final weights, and a checkpoint (online
    and target networks under online. and target., the run's facts under counters); returns it and the agent."""
    from rqrl.algorithms.checkpoint import save_weights
    from rqrl.algorithms.common import write_config
    from rqrl.algorithms.dqn import DqnConfig, QNetwork, save_agent_checkpoint
    from rqrl.seed.agent import Agent, AgentConfig

    config = DqnConfig(env_id="CartPole-v1", hidden_size=8, distributional=True, dueling=True, v_max=50.0)
    write_config(tmp_path, config, "dqn")
    torch.manual_seed(0)
    agent_config = AgentConfig(state_shape=(4,), action_space_size=2, replay_capacity=100, batch_size=4,
                               use_distributional=True, dueling=True, v_min=0.0, v_max=50.0)
    agent = Agent(agent_config, lambda: QNetwork(4, 2, 8, agent_config.n_atoms, True),
                  lambda parameters: torch.optim.Adam(parameters, lr=1e-3))
    for name in ("best", "final"):
        save_weights(tmp_path / f"{name}.safetensors", agent.model_instance.network.state_dict(),
                     {"algo": "dqn", "env_id": "CartPole-v1", "hidden_size": 8, "distributional": True,
                      "dueling": True, "n_atoms": agent_config.n_atoms, "v_min": 0.0, "v_max": 50.0,
                      "env_steps": 1000, "train_steps": 50, "mean_return": 12.0})
    torch.nn.init.normal_(agent.model_instance.network.layers[0].weight)  # the checkpoint's networks are newer
    save_agent_checkpoint(tmp_path / "checkpoint.safetensors", agent,
                          {"algo": "dqn", "env_id": "CartPole-v1", "env_steps": 1234, "train_steps": 56,
                           "recent_returns": [10.0, 20.0]})
    return tmp_path, agent


def test_a_dqn_checkpoint_loads_its_online_q_model_with_its_run_s_network_settings(dqn_run):
    """A DQN checkpoint keeps algo under counters and its networks under online./target.: it was taken for an
    IMPALA file ("names no env_id and hidden_size")."""
    from rqrl.algorithms.evaluation import load_trained_model

    folder, agent = dqn_run
    model, facts = load_trained_model(folder / "checkpoint.safetensors")
    obs = torch.randn(5, 4)
    assert torch.equal(model(obs), agent.model_instance(obs))
    assert facts["env_id"] == "CartPole-v1" and facts["env_steps"] == 1234 and facts["mean_return"] == 15.0
    (folder / "config.json").unlink()
    with pytest.raises(ConfigError, match="is a DQN checkpoint of an older rqrl, whose network settings .* are in "
                                          "the config.json"):
        load_trained_model(folder / "checkpoint.safetensors")
    from rqrl.algorithms.dqn import save_agent_checkpoint  # this version's checkpoints record the settings

    save_agent_checkpoint(folder / "checkpoint.safetensors", agent,
                          {"algo": "dqn", "env_id": "CartPole-v1", "env_steps": 1234, "recent_returns": [15.0],
                           "hidden_size": 8, "distributional": True, "dueling": True, "v_min": 0.0, "v_max": 50.0})
    model, _ = load_trained_model(folder / "checkpoint.safetensors")
    assert torch.equal(model(obs), agent.model_instance(obs))


def test_rqrl_evaluate_plays_a_dqn_run_s_checkpoint_final_and_best_weights(dqn_run):
    from tests.cli_runner import invoke

    folder, _ = dqn_run
    result = invoke("evaluate", str(folder), "--checkpoint", "checkpoint", "--episodes", "1")
    assert result.exit_code == 0, result.stderr
    assert (f"weights: {folder / 'checkpoint.safetensors'} (1,234 env steps, train steps 56, mean training return "
            f"15.0)") in result.stdout, result.stdout
    for arguments in (("--checkpoint", "final"), ()):
        result = invoke("evaluate", str(folder), *arguments, "--episodes", "1")
        assert result.exit_code == 0 and "(1,000 env steps, train steps 50" in result.stdout, result.stderr
