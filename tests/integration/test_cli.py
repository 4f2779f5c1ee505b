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
