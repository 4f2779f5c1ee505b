"""rqrl.cli.train: `rqrl train --resume` takes the run's algorithm and settings, and says what a flag overrides."""

from __future__ import annotations

import click
import pytest

from rqrl.algorithms.common import write_config
from rqrl.algorithms.dqn import DqnConfig
from rqrl.algorithms.ppo import PpoConfig
from rqrl.cli.train import resume_options
from tests.cli_runner import invoke


@pytest.fixture
def ppo_run(tmp_path):
    folder = tmp_path / "ppo-run"
    folder.mkdir()
    write_config(folder, PpoConfig(env_id="Acrobot-v1", num_samples=400, hidden_size=32, run_name="ppo-run",
                                   run_dir=str(tmp_path), redis_url="redis://:secret@elsewhere:6379"), "ppo")
    return folder


def test_resume_takes_the_recorded_algorithm_and_settings(ppo_run):
    algo, settings = resume_options(None, {"resume": str(ppo_run)}, {"resume"})
    assert algo == "ppo" and settings["resume"] == str(ppo_run)
    assert settings["env_id"] == "Acrobot-v1" and settings["num_samples"] == 400 and settings["hidden_size"] == 32
    for where in ("run_name", "run_dir", "redis_url", "worker_redis_url"):  # where it runs is today's, not recorded
        assert where not in settings, where
    PpoConfig(**settings)  # every setting is one of PPO's


def test_a_given_flag_overrides_the_record_and_says_so(ppo_run, capsys):
    _, settings = resume_options("ppo", {"resume": str(ppo_run), "learning_rate": 1e-3}, {"resume", "learning_rate"})
    assert settings["learning_rate"] == 1e-3
    assert "resuming with --learning-rate 0.001 (recorded: 0.0003)" in capsys.readouterr().err


def test_network_shaping_flags_cannot_change(ppo_run):
    with pytest.raises(click.UsageError, match="--hidden-size cannot change when a run resumes"):
        resume_options(None, {"resume": str(ppo_run), "hidden_size": 64}, {"resume", "hidden_size"})
    with pytest.raises(click.UsageError, match="--env-id cannot change"):
        resume_options(None, {"resume": str(ppo_run), "env_id": "CartPole-v1"}, {"resume", "env_id"})
    _, settings = resume_options(None, {"resume": str(ppo_run), "env_id": "Acrobot-v1"}, {"resume", "env_id"})
    assert settings["env_id"] == "Acrobot-v1"  # repeating the recorded value is fine


def test_another_algorithm_or_its_flags_are_refused(ppo_run):
    with pytest.raises(click.UsageError, match="is a ppo run: resume it with `rqrl train ppo --resume"):
        resume_options("dqn", {"resume": str(ppo_run)}, {"resume"})
    with pytest.raises(click.UsageError, match="--n-actors: no flag of ppo"):
        resume_options(None, {"resume": str(ppo_run), "n_actors": 3}, {"resume", "n_actors"})


def test_the_commands_refuse_before_training(ppo_run, tmp_path):
    result = invoke("train", "--resume", str(ppo_run), "--n-actors", "3")
    assert result.exit_code == 2 and "--n-actors: no flag of ppo" in result.stderr
    result = invoke("train", "dqn", "--resume", str(ppo_run))
    assert result.exit_code == 2 and "`rqrl train ppo --resume" in result.stderr
    folder = tmp_path / "dqn-run"
    folder.mkdir()
    write_config(folder, DqnConfig(), "dqn")
    result = invoke("train", "dqn", "--resume", str(folder), "--dueling")
    assert result.exit_code == 2 and "--dueling cannot change" in result.stderr
    result = invoke("train", "--resume", str(tmp_path))
    assert result.exit_code == 2 and "no run folder of rqrl train" in result.stderr


@pytest.mark.parametrize("command", [(), ("ppo",), ("dqn",)])
def test_terminal_on_life_loss_is_a_flag_of_every_algorithm_and_refused_for_an_env_that_is_not_atari(command):
    assert "--terminal-on-life-loss" in invoke("train", *command, "--help").stdout
    result = invoke("train", *command, "--env", "CartPole-v1", "--terminal-on-life-loss")
    assert result.exit_code == 1, result.stderr
    assert "--terminal-on-life-loss is for Atari env ids (ALE/...), not 'CartPole-v1'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
