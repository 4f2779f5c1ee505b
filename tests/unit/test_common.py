"""rqrl.algorithms.common: what a resumed run must keep from its config.json, and the clear errors otherwise."""

from __future__ import annotations

import json

import pytest

from rqrl.algorithms.common import check_resume, env_spaces, recorded_settings, write_config
from rqrl.algorithms.dqn import DqnConfig
from rqrl.algorithms.impala import ImpalaConfig
from rqrl.algorithms.ppo import PpoConfig
from rqrl.errors import ConfigError


def run_folder(tmp_path, config, algo):
    folder = tmp_path / "run"
    folder.mkdir()
    write_config(folder, config, algo)
    return folder


def test_config_json_records_the_algorithm_and_no_redis_password(tmp_path):
    folder = run_folder(tmp_path, PpoConfig(redis_url="redis://:hunter2@host:6379/0"), "ppo")
    recorded = json.loads((folder / "config.json").read_text())
    assert recorded["algo"] == "ppo" and "hunter2" not in json.dumps(recorded)


def test_a_run_without_an_algorithm_recorded_was_impala(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"env_id": "CartPole-v1"}))
    assert recorded_settings(tmp_path)["algo"] == "impala"


def test_a_folder_without_config_json_is_named_as_no_run_folder(tmp_path):
    with pytest.raises(ConfigError, match="no run folder of rqrl train"):
        recorded_settings(tmp_path)


def test_resuming_another_algorithms_run_names_the_command_that_resumes_it(tmp_path):
    folder = run_folder(tmp_path, PpoConfig(), "ppo")
    with pytest.raises(ConfigError, match="is a ppo run, not impala: resume it with `rqrl train ppo --resume"):
        check_resume(ImpalaConfig(resume=str(folder)), "impala")


def test_resuming_on_another_env_or_network_size_names_each_setting(tmp_path):
    folder = run_folder(tmp_path, ImpalaConfig(env_id="LunarLander-v3", hidden_size=128), "impala")
    with pytest.raises(ConfigError) as raised:
        check_resume(ImpalaConfig(resume=str(folder)), "impala")
    assert "--env-id 'CartPole-v1' (recorded: 'LunarLander-v3')" in str(raised.value)
    assert "--hidden-size 64 (recorded: 128)" in str(raised.value)


def test_dqn_keeps_its_heads_on_resume_and_the_same_settings_pass(tmp_path):
    folder = run_folder(tmp_path, DqnConfig(dueling=True), "dqn")
    with pytest.raises(ConfigError, match="--dueling False"):
        check_resume(DqnConfig(resume=str(folder / "checkpoint.safetensors")), "dqn")
    check_resume(DqnConfig(resume=str(folder), dueling=True, learning_rate=5e-4), "dqn")  # the rest may change


def test_an_unknown_env_id_is_one_line_with_the_nearest_ids():
    with pytest.raises(ConfigError, match=r"unknown env id 'CartPol-v1'.*did you mean CartPole-v1"):
        env_spaces("CartPol-v1")


def test_an_env_whose_dependency_is_missing_names_rqrls_extra():
    try:
        import Box2D  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("Box2D is installed here, so LunarLander builds")
    with pytest.raises(ConfigError, match=r"pip install 'rqrl\[box2d\]'"):
        env_spaces("LunarLander-v3")


def test_negative_workers_name_the_flag():
    for config_class in (ImpalaConfig, PpoConfig):
        with pytest.raises(ConfigError, match="expected --workers >= 0"):
            config_class(workers=-1)
