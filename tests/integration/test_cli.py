"""`rqrl` commands against a private Redis, in-process through click's CliRunner."""

from __future__ import annotations

from tests.cli_runner import invoke


def test_stop_of_a_run_that_is_not_there_says_so(redis_url, connection):
    result = invoke("stop", "nothing-here", "--redis-url", redis_url)
    assert result.exit_code == 1
    assert "no run 'nothing-here'" in result.stderr


def test_status_of_an_empty_redis_says_so(redis_url, connection):
    result = invoke("status", "--redis-url", redis_url)
    assert result.exit_code == 0, result.stderr
    assert "no rqrl runs on this Redis" in result.stdout


def test_health_of_a_worker_that_is_not_there_fails_with_why(redis_url, connection):
    result = invoke("health", "--redis-url", redis_url, "--worker", "nobody")
    assert result.exit_code == 1
    assert "no RQ worker named nobody* is registered" in result.stdout + result.stderr


def test_status_of_a_run_that_is_not_there_fails_and_says_so(redis_url, connection):
    result = invoke("status", "--run", "nosuchrun", "--redis-url", redis_url)
    assert result.exit_code == 1 and "no run 'nosuchrun'" in result.stderr


def test_a_redis_url_without_a_scheme_is_a_usage_error(redis_url):
    for command in (("status",), ("stop", "x"), ("health", "--worker")):
        result = invoke(*command, "--redis-url", "localhost:6379")
        assert result.exit_code == 2 and "has no scheme: use redis://HOST:6379/0" in result.stderr, command
