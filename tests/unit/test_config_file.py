"""rqrl.cli.config_file: `rqrl train --config FILE` takes a run's recorded config.json as is, lets flags override it,
and refuses unknown keys and wrong types in one line naming the key."""

from __future__ import annotations

import json
import re

import pytest

from rqrl.algorithms.common import write_config
from rqrl.algorithms.dqn import DqnConfig
from rqrl.algorithms.impala import ImpalaConfig
from rqrl.algorithms.ppo import PpoConfig
from rqrl.cli.config_file import file_settings, read_settings
from rqrl.cli.train import file_options
from tests.children import REPO_ROOT
from tests.cli_runner import invoke


def settings_file(tmp_path, settings) -> str:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings))
    return str(path)


@pytest.mark.parametrize("algo, config", [("impala", ImpalaConfig(n_actors=3, target_return=100)),
                                          ("ppo", PpoConfig(epochs=3)), ("dqn", DqnConfig(dueling=True))])
def test_a_recorded_config_json_is_taken_as_is_for_a_new_run(tmp_path, algo, config, capsys):
    config.run_name, config.run_dir = "recorded", str(tmp_path)
    write_config(tmp_path, config, algo)
    path = str(tmp_path / "config.json")
    chosen, settings = file_options(None, path, {}, set())
    assert chosen == algo
    assert "run_name" not in settings and "resume" not in settings  # a new run, in a folder of its own
    assert "its run_name 'recorded' is not taken" in capsys.readouterr().err
    rebuilt = type(config)(**settings)
    assert {**vars(rebuilt), "run_name": "recorded"} == vars(config)


def test_flags_given_override_the_file(tmp_path):
    path = settings_file(tmp_path, {"algo": "ppo", "epochs": 3, "learning_rate": 0.01})
    algo, settings = file_options(None, path, {"learning_rate": 0.002, "epochs": 10}, {"learning_rate"})
    assert algo == "ppo" and settings == {"epochs": 3, "learning_rate": 0.002}


def test_a_file_without_algo_is_the_subcommands_and_integers_pass_as_numbers(tmp_path):
    path = settings_file(tmp_path, {"learning_rate": 1, "target_return": None})
    algo, settings = file_options("dqn", path, {}, set())
    assert algo == "dqn" and settings == {"learning_rate": 1.0, "target_return": None}
    assert isinstance(settings["learning_rate"], float)


def test_a_redis_url_whose_password_was_left_out_is_not_taken(tmp_path, capsys):
    write_config(tmp_path, ImpalaConfig(redis_url="redis://:hunter2@host:6379/0"), "impala")
    settings = file_settings("f", read_settings(str(tmp_path / "config.json")), "impala", ImpalaConfig)
    assert "redis_url" not in settings and "no password recorded" in capsys.readouterr().err


@pytest.mark.parametrize("settings, message", [
    ({"n_actorz": 3}, "unknown key 'n_actorz': no setting of impala; did you mean 'n_actors'?"),
    ({"zzz": 3}, "unknown key 'zzz': no setting of impala (`rqrl train impala --help` lists them as flags)"),
    ({"n_actors": "3"}, 'n_actors must be an integer, got "3"'),
    ({"n_actors": 3.0}, "n_actors must be an integer, got 3.0"),
    ({"n_actors": True}, "n_actors must be an integer, got true"),
    ({"learning_rate": "fast"}, 'learning_rate must be a number, got "fast"'),
    ({"target_return": "high"}, 'target_return must be a number or null, got "high"'),
    ({"progress": 1}, "progress must be true or false, got 1"),
    ({"env_id": None}, "env_id must be a string, got null"),
    ({"algo": "sac"}, "algo 'sac' is none of impala, ppo, dqn"),
    ([1, 2], "expected a JSON object of settings"),
])
def test_the_command_refuses_a_bad_file_in_one_line_naming_the_key(tmp_path, settings, message):
    path = settings_file(tmp_path, settings)
    result = invoke("train", "--config", path)
    assert result.exit_code == 2, result.output
    assert f"Error: --config {path}: {message}" in result.stderr and "Traceback" not in result.stderr


def test_the_command_refuses_json_it_cannot_read(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{")
    result = invoke("train", "--config", str(path))
    assert result.exit_code == 2 and f"--config {path}: cannot read it as JSON" in result.stderr


def test_the_command_refuses_another_algorithms_file_or_flags_and_resume(tmp_path):
    path = settings_file(tmp_path, {"algo": "ppo"})
    result = invoke("train", "dqn", "--config", path)
    assert result.exit_code == 2
    assert f"holds ppo settings: run it with `rqrl train ppo --config {path}`" in result.stderr
    result = invoke("train", "--config", path, "--n-actors", "3")
    # the file's algorithm's command parses the flags (rqrl.cli.train.TrainGroup), and IMPALA's are none of it
    assert result.exit_code == 2 and "Usage: main train ppo" in result.stderr, result.stderr
    assert re.search(r"No such option:? '?--n-actors", result.stderr), result.stderr  # click 8.1 writes no quotes
    result = invoke("train", "--config", path, "--resume", str(tmp_path))
    assert result.exit_code == 2 and "--config with --resume" in result.stderr
    result = invoke("train", "--config", str(tmp_path / "missing.json"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


@pytest.mark.parametrize("algo, config_class", [("impala", ImpalaConfig), ("ppo", PpoConfig), ("dqn", DqnConfig)])
def test_terminal_on_life_loss_is_a_key_of_every_algorithms_file(tmp_path, algo, config_class):
    path = settings_file(tmp_path, {"algo": algo, "env_id": "ALE/Breakout-v5", "terminal_on_life_loss": True})
    _, settings = file_options(None, path, {}, set())
    assert config_class(**settings).terminal_on_life_loss is True
    path = settings_file(tmp_path, {"algo": algo, "terminal_on_life_loss": "yes"})
    result = invoke("train", "--config", path)
    assert result.exit_code == 2 and 'terminal_on_life_loss must be true or false, got "yes"' in result.stderr


@pytest.mark.parametrize("path", sorted(str(path) for path in (REPO_ROOT / "examples").glob("*.json")))
def test_every_example_config_is_taken_by_rqrl_train(path):
    algo, settings = file_options(None, path, {}, set())
    config = {"impala": ImpalaConfig, "ppo": PpoConfig, "dqn": DqnConfig}[algo](**settings)
    assert config.env_id == json.loads(open(path).read())["env_id"]

