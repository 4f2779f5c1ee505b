"""PPO's parts without Redis: GAE with TIMEOUT bootstrapping, and the training loop on an in-process sampler."""

from __future__ import annotations

import copy

import gymnasium
import numpy as np
import pytest
import torch

from rqrl import EnvSpec, EpisodeBatch, StepType, WorkerFactory
from rqrl.algorithms import ppo
from rqrl.algorithms.cnn import NatureCNN
from rqrl.algorithms.common import make_flat_env, make_train_env
from rqrl.algorithms.impala import ActorCritic
from rqrl.algorithms.ppo import (
    PpoConfig,
    PpoLearner,
    advantages_and_returns,
    gae,
    max_episode_length,
    ppo_update,
    train,
)
from tests import fixtures  # noqa: F401 - registers RqrlGuessSign-v0
from tests.run_files import read_rows


def test_gae_stops_at_episode_ends_and_uses_the_given_next_values():
    rewards, values = np.array([1.0, 1.0, 1.0]), np.array([0.5, 0.5, 0.5])
    next_values = np.array([0.5, 0.0, 2.0])
    ends = np.array([False, True, True])
    advantages = gae(rewards, values, next_values, ends, discount=0.9, lam=0.5)
    delta = rewards + 0.9 * next_values - values
    assert advantages[2] == pytest.approx(delta[2])
    assert advantages[1] == pytest.approx(delta[1])
    assert advantages[0] == pytest.approx(delta[0] + 0.9 * 0.5 * delta[1])


def batch_of(step_types: list[StepType]) -> EpisodeBatch:
    spec = EnvSpec(gymnasium.spaces.Box(-10, 10, (2,), np.float32), gymnasium.spaces.Discrete(2))
    n = len(step_types)
    return EpisodeBatch(spec, {}, np.ones((n, 2), np.float32), np.full((1, 2), 3.0, np.float32),
                        np.zeros(n, np.int64), np.ones(n), {}, {"log_prob": np.zeros(n, np.float32)},
                        np.array(step_types), np.array([n]))


def test_bootstraps_on_timeout_and_not_on_terminal():
    torch.manual_seed(0)
    model = ActorCritic(2, 2)
    config = PpoConfig(discount=0.9, gae_lambda=1.0)
    terminal, _ = advantages_and_returns(model, batch_of([StepType.FIRST, StepType.TERMINAL]), config,
                                         torch.device("cpu"))
    timeout, _ = advantages_and_returns(model, batch_of([StepType.FIRST, StepType.TIMEOUT]), config,
                                        torch.device("cpu"))
    with torch.no_grad():
        last_value = float(model.values(torch.full((1, 2), 3.0)))
    assert timeout[-1] - terminal[-1] == pytest.approx(0.9 * last_value, rel=1e-5)


class InProcessSampler:
    """garage's LocalSampler in miniature: logical workers round robin in this process (no Redis)."""

    def __init__(self, model, env_id: str, n_workers: int = 2):
        self.workers = [WorkerFactory(max_episode_length=20, n_workers=n_workers, seed=0)(w) for w in range(n_workers)]
        for worker in self.workers:
            worker.update_agent(ActorCritic(2, 2))
            worker.update_env(make_flat_env(env_id))
        self.dropped_episodes = 0

    def obtain_samples(self, itr, num_samples, agent_update, env_update=None):
        for worker in self.workers:
            worker.update_agent(agent_update)
        episodes, steps = [], 0
        while steps < num_samples:
            for worker in self.workers:
                episodes.append(worker.rollout())
                steps += int(episodes[-1].lengths.sum())
        return EpisodeBatch.concatenate(*episodes)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass


@pytest.mark.parametrize("sample_ahead", [True, False])
def test_the_training_loop_learns_a_trivial_env_and_writes_the_run_folder(tmp_path, one_torch_thread, sample_ahead):
    env_id = "tests.fixtures:RqrlGuessSign-v0"
    config = PpoConfig(env_id=env_id, total_env_steps=5_000, num_samples=400, minibatch_size=100, learning_rate=3e-3,
                       epochs=4, run_dir=str(tmp_path), sample_ahead=sample_ahead,
                       run_name="ppo", progress=False, seed=1)
    result = train(config, sampler=InProcessSampler(None, env_id))
    assert result.mean_return is not None and result.mean_return > 15  # a random policy scores about 10
    for name in ("final.safetensors", "best.safetensors", "checkpoint.safetensors", "metrics.csv", "summary.json",
                 "learning_curve.png", "config.json"):
        assert (tmp_path / "ppo" / name).is_file(), name


def test_eval_every_writes_greedy_returns_into_the_rows(tmp_path, one_torch_thread):
    env_id = "tests.fixtures:RqrlGuessSign-v0"
    config = PpoConfig(env_id=env_id, total_env_steps=2_000, num_samples=400, minibatch_size=100, epochs=1,
                       run_dir=str(tmp_path), run_name="ppo", progress=False, eval_every=0.01, eval_episodes=2,
                       metrics_seconds=0)
    train(config, sampler=InProcessSampler(None, env_id))
    rows = read_rows(tmp_path / "ppo" / "metrics.csv")
    evaluated = [float(row["eval_return"]) for row in rows if row["eval_return"]]
    assert evaluated and all(0 <= value <= 20 for value in evaluated), rows


PIXELS = "tests.fixtures:RqrlPixelSign-v0"


def test_image_observations_get_the_nature_cnn(tmp_path):
    learner = PpoLearner(PpoConfig(env_id=PIXELS, run_dir=str(tmp_path)))
    assert isinstance(learner.model.torso, NatureCNN) and learner.model.torso.obs_shape == (2, 36, 36)
    assert PpoLearner(PpoConfig(run_dir=str(tmp_path))).model.torso is None  # CartPole: the MLPs


def test_ppo_trains_the_cnn_on_an_episode_batch_of_uint8_images(monkeypatch, one_torch_thread):
    torch.manual_seed(0)
    model = ActorCritic((2, 36, 36), 2)
    worker = WorkerFactory(max_episode_length=20, n_workers=1, seed=0)(0)
    worker.update_agent(copy.deepcopy(model))
    worker.update_env(make_train_env(PIXELS))
    batch = EpisodeBatch.concatenate(worker.rollout(), worker.rollout())
    assert batch.observations.dtype == np.uint8 and batch.observations.shape == (40, 2, 36, 36)
    config = PpoConfig(env_id=PIXELS, epochs=2, minibatch_size=16)
    whole = advantages_and_returns(model, batch, config, torch.device("cpu"))
    monkeypatch.setattr(ppo, "VALUE_ROWS", 7)  # values in forward passes of 7 rows: the same figures
    np.testing.assert_allclose(advantages_and_returns(model, batch, config, torch.device("cpu"))[0], whole[0],
                               rtol=1e-5, atol=1e-6)
    before = [parameter.detach().clone() for parameter in model.torso.parameters()]
    terms = ppo_update(model, torch.optim.Adam(model.parameters(), lr=1e-3), batch, config, torch.device("cpu"),
                       torch.Generator().manual_seed(0))
    assert all(np.isfinite([terms.policy, terms.value, terms.entropy, terms.clip_fraction]))
    assert all(not torch.equal(old, new) for old, new in zip(before, model.torso.parameters(), strict=True))


def test_an_atari_episode_is_capped_at_v5s_length_unless_given():
    assert max_episode_length(PpoConfig(env_id="ALE/Pong-v5")) == 27_000  # 108,000 frames, 4 a step
    assert max_episode_length(PpoConfig(env_id="ALE/Pong-v5", max_episode_length=500)) == 500


def test_resuming_a_solved_run_says_so_at_once_naming_the_flag(tmp_path):
    from rqrl.algorithms.common import write_config
    from rqrl.errors import ConfigError

    first = ppo.PpoLearner(PpoConfig(run_dir=str(tmp_path), run_name="run", progress=False))
    first.folder.open()
    write_config(first.run_dir, first.config, "ppo")
    first.env_steps, first.updates = 60_000, 30
    first.recent_returns.extend([500.0] * 100)  # CartPole's threshold is 475
    first.checkpoint(30.0)
    first.folder.close()
    with pytest.raises(ConfigError, match=r"run is finished: it is solved \(the mean return of its last 100 "
                                          r"episodes, 500.00, reached --target-return 475\).*a higher --target-return"):
        train(PpoConfig(resume=str(first.run_dir), progress=False), sampler=object())
    resumed = ppo.PpoLearner(PpoConfig(resume=str(first.run_dir), progress=False, target_return=600))
    resumed.folder.close()
    assert resumed.env_steps == 60_000
