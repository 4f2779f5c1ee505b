"""rqrl.cli.train: `rqrl train --resume` takes the run's algorithm and settings, and says what a flag overrides."""

from __future__ import annotations

import re

import click
import pytest

from rqrl.algorithms.common import write_config
from rqrl.algorithms.dqn import DqnConfig
from rqrl.algorithms.impala import ImpalaConfig
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
    result = invoke("train", "--resume", str(ppo_run), "--n-actors", "3")  # parsed by `rqrl train ppo`'s flags
    assert result.exit_code == 2 and "train ppo" in result.stderr, result.stderr
    assert re.search(r"No such option:? '?--n-actors", result.stderr), result.stderr  # click 8.1 writes no quotes
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


@pytest.fixture
def trained(monkeypatch):
    """The configs `rqrl train` would train, by algorithm; each training call stops at once with a ConfigError."""
    from rqrl.algorithms import dqn, impala, ppo
    from rqrl.errors import ConfigError

    configs: dict[str, object] = {}

    def stand_in(algo):
        def train(config, **_):
            configs[algo] = config
            raise ConfigError(f"{algo} stand-in")
        return train

    for algo, module in (("impala", impala), ("ppo", ppo), ("dqn", dqn)):
        monkeypatch.setattr(module, "train", stand_in(algo))
    monkeypatch.setattr("rqrl.engine.process.terminate_like_ctrl_c", lambda: None)  # no signal handler in pytest
    return configs


def test_the_bare_group_resumes_any_run_with_its_algorithm_s_flags(ppo_run, tmp_path, trained):
    """`rqrl train --resume RUN_DIR` took IMPALA's flags only: PPO's and DQN's were refused before the run's
    algorithm was read ("No such option: --seconds")."""
    result = invoke("train", "--resume", str(ppo_run), "--num-samples", "800")
    assert result.exit_code == 1 and "ppo stand-in" in result.stderr, result.stderr
    assert trained["ppo"].num_samples == 800 and trained["ppo"].hidden_size == 32
    assert "resuming with --num-samples 800 (recorded: 400)" in result.stderr
    folder = tmp_path / "dqn-run"
    folder.mkdir()
    write_config(folder, DqnConfig(hidden_size=48), "dqn")
    result = invoke("train", f"--resume={folder}", "--seconds", "12")
    assert result.exit_code == 1 and "dqn stand-in" in result.stderr, result.stderr
    assert trained["dqn"].seconds == 12 and trained["dqn"].hidden_size == 48
    assert "--seconds" in invoke("train", "--resume", str(folder), "--help").stdout  # DQN's help, its flags


def test_routing_reads_option_values_as_values_and_a_config_file_s_algorithm(ppo_run, tmp_path, trained):
    """An option's value that names an algorithm (`--run-name dqn`) was taken for the subcommand and turned the
    routing off; `--config FILE` of a DQN file refused DQN's flags; `--resume=` started a new run."""
    result = invoke("train", "--resume", str(ppo_run), "--run-name", "dqn", "--num-samples", "800")
    assert result.exit_code == 1 and "ppo stand-in" in result.stderr, result.stderr
    settings = tmp_path / "dqn.json"
    settings.write_text('{"algo": "dqn", "hidden_size": 40}')
    result = invoke("train", "--config", str(settings), "--seconds", "3", "--run-dir", str(tmp_path))
    assert result.exit_code == 1 and "dqn stand-in" in result.stderr, result.stderr
    assert trained["dqn"].seconds == 3 and trained["dqn"].hidden_size == 40
    result = invoke("train", "--resume=", "--run-dir", str(tmp_path))
    assert result.exit_code == 2 and "--resume needs a run folder or checkpoint file" in result.stderr
    assert "impala" not in trained


@pytest.mark.parametrize("command", [(), ("ppo",)])
def test_workers_0_without_a_redis_url_is_refused_before_anything_starts(command, tmp_path, trained):
    """It used to start an embedded Redis no worker can join, wait 95 s for workers, and leave a run folder."""
    result = invoke("train", *command, "--workers", "0", "--run-dir", str(tmp_path), "--total-env-steps", "100")
    assert result.exit_code == 1 and not trained, result.stderr
    assert "--workers 0) with an embedded Redis: no worker can ever join the run" in result.stderr
    assert "--redis-url" in result.stderr and "RQRL_SECRET" in result.stderr
    assert list(tmp_path.iterdir()) == []
    result = invoke("train", *command, "--workers", "0", "--redis-url", "redis://127.0.0.1:1/0",
                    "--run-dir", str(tmp_path), "--total-env-steps", "100")
    assert result.exit_code == 1 and "stand-in" in result.stderr, result.stderr  # external workers can join



def test_a_resumed_run_recorded_with_workers_0_and_no_redis_url_says_what_to_give(tmp_path, trained):
    """It said to "leave --workers out", which the user never typed: the 0 was the run's config.json's."""
    folder = tmp_path / "external"
    folder.mkdir()
    write_config(folder, ImpalaConfig(workers=0), "impala")
    result = invoke("train", "--resume", str(folder))
    assert result.exit_code == 1 and not trained, result.stderr
    assert f"the run {folder} was recorded with --workers 0" in result.stderr
    assert "or --workers N for N local workers" in result.stderr
