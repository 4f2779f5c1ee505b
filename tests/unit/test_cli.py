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


def test_demo_refuses_an_env_its_policy_cannot_act_in():
    result = invoke("demo", "--seconds", "1", "--env", "Pendulum-v1")  # a Box action space
    assert result.exit_code == 1, result.stderr
    assert "needs a flat Box observation space and a Discrete action space" in result.stderr
    assert "Pendulum-v1" in result.stderr
