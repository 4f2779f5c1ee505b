"""rqrl.algorithms.common: what a resumed run must keep from its config.json, and the clear errors otherwise."""

from __future__ import annotations

import json

import pytest

from rqrl.algorithms.common import (
    check_checkpoint,
    check_resume,
    check_unfinished,
    env_spaces,
    improves,
    recorded_settings,
    write_config,
)
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


def test_a_checkpoint_is_checked_by_what_it_records_and_an_old_one_without_algo_was_impala(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    with pytest.raises(ConfigError, match=f"{path} is a checkpoint of impala, not of ppo: resume it with `rqrl train "
                                          f"impala --resume {path}`"):
        check_checkpoint(path, {"env_id": "CartPole-v1", "hidden_size": 64}, PpoConfig(), "ppo")
    check_checkpoint(path, {"env_id": "CartPole-v1", "hidden_size": 64}, ImpalaConfig(), "impala")
    with pytest.raises(ConfigError, match=r"--hidden-size 32 \(the checkpoint's: 64\)"):
        check_checkpoint(path, {"algo": "impala", "hidden_size": 64}, ImpalaConfig(hidden_size=32), "impala")


def test_a_nan_mean_return_is_never_the_best_and_any_return_beats_a_nan_best():
    nan = float("nan")
    assert not improves(nan, None) and not improves(None, None) and not improves(float("inf"), 1.0)
    assert improves(5.0, nan) and improves(5.0, None) and improves(5.0, 4.0) and not improves(5.0, 5.0)


@pytest.mark.parametrize(("settings", "flags"), [
    ({"env_steps": 2048, "total_env_steps": 2048}, "a higher --total-env-steps$"),
    ({"solved": True, "mean_return": 480.0, "target_return": 475.0}, r"\(the mean return of its last 100 episodes, "
                                                                      r"480.00, reached --target-return 475\).*"
                                                                      r"a higher --target-return$"),
    ({"seconds": 12.5, "time_budget": 12.0}, r"time budget \(12.5 s of --seconds 12\).*a higher --seconds$"),
])
def test_a_finished_run_names_why_and_the_flag_to_raise(settings, flags):
    arguments = {"env_steps": 10, "total_env_steps": 2048, "solved": False, "mean_return": None,
                 "target_return": None, **settings}
    with pytest.raises(ConfigError, match=f"^runs/x is finished: .*{flags}"):
        check_unfinished("runs/x", **arguments)
    check_unfinished("runs/x", env_steps=10, total_env_steps=2048, solved=False, mean_return=None,
                     target_return=None, seconds=1.0, time_budget=12.0)
