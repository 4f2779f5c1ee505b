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


def test_status_shows_every_run_when_one_record_is_junk_and_escapes_worker_names(redis_url, connection):
    """Issue 24: junk in one run's record hid every run; a worker named with escape codes reached the terminal."""
    from rqrl.engine.keys import RunKeys
    from rqrl.engine.run_config import RunConfig

    good = RunConfig(run_name="good", run_id="g", queue_name="rqrl", n_rollout_steps=4, n_actors=1, batch_size=1,
                     queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    connection.set(RunKeys("good").config, good.to_json())
    connection.set(RunKeys("junk").config, "not a run record")
    connection.hset(RunKeys("typed").config, "a", "hash, not a string")
    connection.hset("rq:worker:evil\x1b[2J", mapping={"state": "idle\x07", "last_heartbeat": "x"})
    connection.sadd("rq:workers:rqrl", "rq:worker:evil\x1b[2J")
    result = invoke("status", "--redis-url", redis_url)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "run good: queue rqrl, 1 actors in 1 job(s)" in result.stdout
    assert "run junk: its record in Redis cannot be read" in result.stdout
    assert "run typed: its record in Redis cannot be read" in result.stdout
    assert "evil\\x1b[2J" in result.stdout and "\x1b" not in result.stdout and "\x07" not in result.stdout


def _left_run(connection, run_name: str, deadline_in: float) -> None:
    """Run ``run_name`` in Redis as a learner left it, its heartbeat deadline ``deadline_in`` seconds on."""
    import time

    from rqrl.engine.keys import RunKeys
    from rqrl.engine.run_config import RunConfig

    keys = RunKeys(run_name)
    connection.set(keys.config, RunConfig(run_name=run_name, run_id="r", queue_name="rqrl", n_rollout_steps=4,
                                          n_actors=1, batch_size=1, queue_bound=1, actor_env_seeds=[0],
                                          actor_agent_seeds=[0], actor_groups=[[0]]).to_json())
    connection.set(keys.learner_deadline, f"{time.time() + deadline_in:.3f}")


def test_stop_says_a_learner_whose_heartbeat_never_moves_looks_dead_and_when_its_deadline_passes(
        redis_url, connection, run_name):
    """It said "it stops at its next collect" of a learner killed with -9, which never collects again."""
    _left_run(connection, run_name, 300)
    result = invoke("stop", run_name, "--redis-url", redis_url, "--wait", "3")
    assert result.exit_code == 1, result.stdout
    assert "its learner looks dead: its heartbeat did not move in the 3 s waited" in result.stderr
    assert "its heartbeat deadline passes at " in result.stderr
    assert f"after which `rqrl stop {run_name}` removes the run at once" in result.stderr
    assert "next collect" not in result.stderr
    short = invoke("stop", run_name, "--redis-url", redis_url, "--wait", "0.3")  # less than a few heartbeats
    assert short.exit_code == 1 and "looks dead" not in short.stderr
    assert "(too short a wait to tell a dead one); its stop flag stays set" in short.stderr


def test_stop_removes_the_run_once_its_learner_s_deadline_passes_during_the_wait(redis_url, connection, run_name):
    """It waited out --wait and failed, though the deadline had passed and the run was its to remove."""
    _left_run(connection, run_name, 5)
    result = invoke("stop", run_name, "--redis-url", redis_url, "--wait", "15")
    assert result.exit_code == 0, result.stderr
    assert "stop requested" in result.stdout, "the deadline had passed before the stop began: nothing was tested"
    assert "no live learner; stopped its jobs and removed its keys" in result.stdout
    assert connection.keys(f"rqrl:{run_name}:config") == []


def test_stop_of_a_learner_that_beats_but_does_not_stop_in_time_says_it_stops_at_its_next_collect(
        redis_url, connection, run_name):
    import threading
    import time

    from rqrl.engine.keys import RunKeys

    _left_run(connection, run_name, 300)
    done = threading.Event()

    def beat() -> None:  # a learner that collects but has not reached its stop yet
        while not done.wait(0.05):
            connection.set(RunKeys(run_name).learner_deadline, f"{time.time() + 300:.3f}")

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        result = invoke("stop", run_name, "--redis-url", redis_url, "--wait", "1")
    finally:
        done.set()
        beating.join(5)
    assert result.exit_code == 1, result.stderr
    assert "though its heartbeat goes on; its stop flag stays set, so it stops at its next collect" in result.stderr
