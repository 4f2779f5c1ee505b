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
