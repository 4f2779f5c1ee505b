"""`rqrl` commands that refuse or explain before they touch Redis or start a process, through click's CliRunner
(tests/e2e/test_cli.py runs whole commands as a user does)."""

from __future__ import annotations

import pytest

from tests.cli_runner import invoke


def test_help_lists_every_command_with_train_among_them():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("dashboard", "demo", "evaluate", "health", "status", "stop", "train", "worker"):
        assert f"  {command} " in result.stdout, command
    assert "Train IMPALA (default), PPO (`rqrl train ppo`) or DQN" in result.stdout


def test_train_help_is_built_on_demand_with_impalas_flags_and_the_algorithms():
    result = invoke("train", "--help")
    assert result.exit_code == 0
    for text in ("--n-actors", "--env", "--resume", "impala", "ppo", "dqn"):
        assert text in result.stdout, text
    assert "--num-samples" not in result.stdout and "--seconds" not in result.stdout


@pytest.mark.parametrize(("algo", "own", "foreign", "default"), [
    ("impala", "--n-actors", "--num-samples", "[default: 0.001]"),
    ("ppo", "--num-samples", "--n-actors", "[default: 0.0003]"),
    ("dqn", "--seconds", "--num-samples", "[default: 0.001]"),
])
def test_each_algorithm_has_its_own_flags_and_true_defaults(algo, own, foreign, default):
    result = invoke("train", algo, "--help")
    assert result.exit_code == 0
    assert own in result.stdout and foreign not in result.stdout
    learning_rate = result.stdout[result.stdout.index("--learning-rate"):]
    assert default in " ".join(learning_rate.split()[:8]), learning_rate[:200]


def test_train_refuses_flags_of_another_algorithm():
    result = invoke("train", "ppo", "--n-actors", "3", "--total-env-steps", "1")
    assert result.exit_code == 2 and "--n-actors" in result.stderr
    result = invoke("train", "--num-samples", "100", "--total-env-steps", "1")
    assert result.exit_code == 2 and "--num-samples" in result.stderr
    result = invoke("train", "--seconds", "3")
    assert result.exit_code == 2 and "--seconds" in result.stderr


def test_flags_before_the_algorithm_are_refused_with_where_they_go():
    result = invoke("train", "--env", "CartPole-v1", "dqn")
    assert result.exit_code == 2 and "rqrl train dqn --env" in result.stderr


def test_the_old_algo_flag_says_what_replaced_it():
    result = invoke("train", "--algo", "ppo")
    assert result.exit_code == 2 and "`rqrl train ppo ...`" in result.stderr


def test_worker_requires_a_redis_url():
    result = invoke("worker")
    assert result.exit_code == 2
    assert "--redis-url" in result.stderr


def test_dashboard_help_documents_its_options():
    result = invoke("dashboard", "--help")
    assert result.exit_code == 0, result.stderr
    for option in ("--bind", "--port", "--url-prefix", "--username", "--password", "--delete / --no-delete"):
        assert option in result.stdout, option
    assert "default: 127.0.0.1" in " ".join(result.stdout.split())


def test_demo_names_an_unknown_env_id_in_one_line_with_the_nearest():
    result = invoke("demo", "--seconds", "1", "--env", "CartPol-v1")
    assert result.exit_code == 1 and "Traceback" not in result.stderr, result.stderr
    assert "unknown env id 'CartPol-v1'" in result.stderr and "did you mean CartPole-v1" in result.stderr


def test_demo_refuses_an_env_its_policy_cannot_act_in():
    result = invoke("demo", "--seconds", "1", "--env", "Pendulum-v1")  # a Box action space
    assert result.exit_code == 1, result.stderr
    assert "needs a flat Box observation space and a Discrete action space" in result.stderr
    assert "Pendulum-v1" in result.stderr


@pytest.fixture
def weights_run(tmp_path):
    """A run folder whose best weights are an untrained CartPole policy, as IMPALA writes them."""
    import torch

    from rqrl.algorithms.checkpoint import save_weights
    from rqrl.algorithms.impala import ActorCritic

    torch.manual_seed(0)
    save_weights(tmp_path / "best.safetensors", ActorCritic(4, 2, 16).state_dict(),
                 {"env_id": "CartPole-v1", "hidden_size": 16, "env_steps": 12345, "updates": 67, "mean_return": 21.5})
    return tmp_path


def test_evaluate_says_which_weights_it_evaluated(weights_run):
    result = invoke("evaluate", str(weights_run), "--episodes", "2")
    assert result.exit_code == 0, result.stderr
    assert (f"weights: {weights_run / 'best.safetensors'} (12,345 env steps, updates 67, mean training return 21.5)"
            in result.stdout), result.stdout
    assert "CartPole-v1: 2 episodes, return" in result.stdout


def test_evaluate_video_without_moviepy_names_the_extra(weights_run, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "moviepy", None)  # what `import moviepy` finds where it is not installed
    result = invoke("evaluate", str(weights_run), "--video")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "Error: --video needs moviepy (gymnasium's RecordVideo writes mp4 files with it), which is not installed: "
        "pip install 'rqrl[video]'"]
    assert not (weights_run / "videos").exists()


def test_ctrl_c_while_a_command_starts_exits_130_not_click_s_aborted(monkeypatch):
    """A Ctrl-C before a command handles its own (`rqrl train` importing torch, say) exits as one later does."""
    import redis

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(redis.Redis, "from_url", interrupted)
    result = invoke("stop", "some-run", "--redis-url", "redis://127.0.0.1:1")
    assert result.exit_code == 130 and "Aborted!" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "interrupted (SIGINT)"


def test_ctrl_c_while_train_is_built_says_no_run_folder_was_written(monkeypatch):
    """docs/training.md promises a run stopped before it started says so; a Ctrl-C while `train` imported torch
    said only "interrupted (SIGINT)"."""
    import rqrl.cli.train
    from rqrl.cli import main

    def importing_torch():
        raise KeyboardInterrupt

    monkeypatch.setattr(rqrl.cli.train, "train_group", importing_torch)
    monkeypatch.delitem(main.commands, "train", raising=False)  # built by an earlier test: build it again
    result = invoke("train", "--env", "CartPole-v1")
    assert result.exit_code == 130, result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("interrupted (SIGINT) before the run started: nothing "
                                                      "written, no run folder")
    monkeypatch.setattr(rqrl.cli.train, "learner_called", True)  # a second Ctrl-C in the learner's final save
    result = invoke("train", "--env", "CartPole-v1")
    assert result.exit_code == 130 and result.stderr.strip().splitlines()[-1] == "interrupted (SIGINT)", result.stderr


def test_evaluate_takes_a_file_of_the_run_by_name_or_a_weights_file_alone(weights_run):
    import shutil

    shutil.copy(weights_run / "best.safetensors", weights_run / "final.safetensors")
    for arguments in (("--checkpoint", "final"), ("--checkpoint", "final.safetensors"),
                      ("--checkpoint", str(weights_run / "final.safetensors"))):
        result = invoke("evaluate", str(weights_run), *arguments, "--episodes", "1")
        assert result.exit_code == 0, result.stderr
        assert f"weights: {weights_run / 'final.safetensors'}" in result.stdout, arguments
    result = invoke("evaluate", "--checkpoint", str(weights_run / "final.safetensors"), "--episodes", "1")
    assert result.exit_code == 0 and f"weights: {weights_run / 'final.safetensors'}" in result.stdout
    result = invoke("evaluate", str(weights_run), "--checkpoint", "checkpoint")
    assert result.exit_code == 2 and "holds no checkpoint.safetensors; its weights files: best, final" in result.stderr
    result = invoke("evaluate", "--checkpoint", "final")
    assert result.exit_code == 2 and "no weights file 'final'; with RUN_DIR, name one" in result.stderr
    assert invoke("evaluate").exit_code == 2
