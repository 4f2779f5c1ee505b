"""`rqrl` commands that refuse or explain before they touch Redis or start a process, through click's CliRunner
(tests/e2e/test_cli.py runs whole commands as a user does)."""

from __future__ import annotations

from tests.cli_runner import invoke


def test_help_lists_every_command_with_train_among_them():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("dashboard", "demo", "evaluate", "health", "status", "stop", "train", "worker"):
        assert f"  {command} " in result.stdout, command
    assert "Train IMPALA (V-trace) on distributed actors" in result.stdout


def test_train_help_is_built_on_demand_with_every_algorithms_flags():
    result = invoke("train", "--help")
    assert result.exit_code == 0
    for flag in ("--algo", "--n-actors", "[ppo]", "[dqn]", "--env"):
        assert flag in result.stdout, flag


def test_train_refuses_flags_of_the_other_algorithm():
    result = invoke("train", "--algo", "ppo", "--n-actors", "3", "--total-env-steps", "1")
    assert result.exit_code != 0 and "--n-actors" in result.stderr and "ppo" in result.stderr
    result = invoke("train", "--num-samples", "100", "--total-env-steps", "1")
    assert result.exit_code != 0 and "--num-samples" in result.stderr


def test_impala_only_options_are_refused_with_dqn():
    result = invoke("train", "--algo", "dqn", "--n-actors", "3")
    assert result.exit_code == 2 and "--n-actors" in result.stderr


def test_seconds_is_refused_with_impala():
    result = invoke("train", "--seconds", "3")
    assert result.exit_code == 2 and "--seconds do(es) not apply to --algo impala" in result.stderr


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
