"""A run's record in Redis, stopped by its learner or by `rqrl stop`, also when Redis is full."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from rqrl.engine.keys import RunKeys
from rqrl.engine.rq_safety import rollout_queue
from rqrl.engine.run_config import RunConfig
from rqrl.engine.run_store import RunStore
from rqrl.engine.server import EmbeddedRedis
from tests.cli_runner import invoke


def fill_up(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)


@pytest.mark.parametrize("leave_stop_flag", [False, True], ids=["learner", "rqrl-stop"])
def test_a_full_redis_refuses_the_stop_flag_and_the_run_is_deleted_all_the_same(caplog, leave_stop_flag):
    """The stop that would free a full Redis used to fail on its first write (the flag), leaving every key."""
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        keys = RunKeys("full-run")
        client.set(keys.config, "{}")
        client.rpush(keys.trajectories, b"x" * 100_000)
        fill_up(client)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, "rqrl.engine.run_store"):
            RunStore(client, keys, b"").stop(rollout_queue(None, client), timeout=10, leave_stop_flag=leave_stop_flag)
        assert time.monotonic() - started < 5, "no wait for jobs that were never told"
        assert client.keys("rqrl:full-run:*") == []  # a Redis still full (maxmemory 1 byte) takes no flag either
        assert "refused the stop flag; deleting the run's keys without it" in caplog.text
        assert "still running" not in caplog.text


def test_rqrl_stop_of_a_live_learner_on_a_full_redis_says_how_to_make_room():
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        keys = RunKeys("full-live")
        client.set(keys.config, RunConfig(run_name="full-live", run_id="f", queue_name="rqrl", n_rollout_steps=4,
                                          n_actors=1, batch_size=1, queue_bound=1, actor_env_seeds=[0],
                                          actor_agent_seeds=[0], actor_groups=[[0]]).to_json())
        client.set(keys.learner_deadline, time.time() + 60)
        fill_up(client)
        result = invoke("stop", "full-live", "--redis-url", server.url, "--wait", "1")
        assert result.exit_code == 1, result.stdout
        assert "is at its maxmemory and refused the run's stop flag" in result.stderr
        assert "CONFIG SET maxmemory" in result.stderr
        client.config_set("maxmemory", 0)
        assert client.get(keys.config) is not None, "a live learner's run is its to delete"


def test_a_resume_takes_the_run_from_a_live_learner_which_stops_at_its_next_check_in(connection, run_name):
    from rqrl import RunTakenOverError
    from rqrl.engine.weights import WeightStore

    keys = RunKeys(run_name)
    config = RunConfig(run_name=run_name, run_id="r", queue_name="rqrl", n_rollout_steps=4, n_actors=1, batch_size=1,
                       queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    first, second = RunStore(connection, keys, b"s", "first"), RunStore(connection, keys, b"s", "second")
    first.open(config, dict, dict, resume=False)
    first_weights = WeightStore(connection, keys, b"k" * 32, learner_token="first")
    assert first.check_in(10) == (True, False) and first_weights.publish({}) == 1
    second.open(config, dict, dict, resume=True)
    assert second.check_in(10) == (True, False)
    with pytest.raises(RunTakenOverError, match=f"run '{run_name}' was taken over by another learner"):
        first.check_in(10)
    with pytest.raises(RunTakenOverError):
        first_weights.publish({})
    assert WeightStore(connection, keys, b"k" * 32, learner_token="second").publish({}) == 2
    first.stop(rollout_queue(None, connection), timeout=1)
    assert connection.exists(keys.config), "the taken-over learner's stop deleted the run"
    RunStore(connection, keys, b"").stop(rollout_queue(None, connection), timeout=1)  # `rqrl stop` has no token
    assert connection.keys(f"rqrl:{run_name}:*") == []


def test_the_stop_flag_a_stop_leaves_reads_as_stopped_and_a_new_run_of_the_name_clears_it(connection, run_name):
    keys = RunKeys(run_name)
    config = RunConfig(run_name=run_name, run_id="r", queue_name="rqrl", n_rollout_steps=4, n_actors=1, batch_size=1,
                       queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    store = RunStore(connection, keys, b"s")
    store.open(config, dict, dict, resume=False)
    store.stop(rollout_queue(None, connection), timeout=1, leave_stop_flag=True)
    assert store.check_in(10) == (False, True), "a learner that looked dead would store the stopped run again"
    assert connection.keys(f"rqrl:{run_name}:*") != [] and connection.ttl(keys.stopped) > 0
    _, new = RunStore(connection, keys, b"s").open(config, dict, dict, resume=False)
    assert new and RunStore(connection, keys, b"s").check_in(10) == (True, False)


def test_a_run_left_by_a_dead_learner_is_refused_with_what_works_and_when(connection, run_name):
    """After kill -9 of a PPO or DQN learner the refusal offered a takeover (`rqrl train --resume`), which only
    IMPALA's learner does, and said nothing of when `rqrl stop` would remove the run."""
    from rqrl.errors import ConfigError

    keys = RunKeys(run_name)
    config = RunConfig(run_name=run_name, run_id="r", queue_name="rqrl", n_rollout_steps=4, n_actors=1, batch_size=1,
                       queue_bound=1, actor_env_seeds=[0], actor_agent_seeds=[0], actor_groups=[[0]])
    RunStore(connection, keys, b"s").open(config, dict, dict, resume=False)
    connection.set(keys.learner_deadline, f"{time.time() + 300:.3f}")  # a dead learner's last heartbeat
    with pytest.raises(ConfigError) as sampler_like:  # no learner token: no takeover (PPO's sampler)
        RunStore(connection, keys, b"s").open(config, dict, dict, resume=False)
    message = str(sampler_like.value)
    assert "its heartbeat deadline passes at " in message and "(in 300 s)" in message, message
    assert f"after that `rqrl stop {run_name}` removes the run at once" in message
    assert "take the run over" not in message and "only IMPALA's learner takes over a run still in Redis" in message
    with pytest.raises(ConfigError, match=r"take the run over \(`rqrl train --resume RUN_DIR`"):
        RunStore(connection, keys, b"s", learner_token="impala").open(config, dict, dict, resume=False)
    connection.set(keys.learner_deadline, f"{time.time() - 1:.3f}")
    with pytest.raises(ConfigError, match=rf"deadline passed at .*: `rqrl stop {run_name}` removes the run now"):
        RunStore(connection, keys, b"s").open(config, dict, dict, resume=False)
