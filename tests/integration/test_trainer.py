"""The SEED trainer end to end, with a real Redis and real actor and server processes: start(duration) returns
having left no process or key, nothing is lost under a slow learner, killed actors and servers are replaced.

The tests here run in-process; those that start processes are in tests/processes/test_trainer.py.
"""

from __future__ import annotations

import functools

import pytest
import redis

from rqrl.errors import ConfigError, RedisUnavailableError
from rqrl.seed import Config, Trainer
from rqrl.seed.agent import Agent, AgentConfig
from tests.children import free_port
from tests.conftest import TEST_SECRET
from tests.seed_fixtures import cartpole_agent, make_cartpole, make_misspelt_env, mlp


def config(redis_url, run_name, **overrides):
    values = {"redis_url": redis_url, "run_name": run_name, "secret": TEST_SECRET, "actor_threads": 2,
              "minimum_buffer_size": 50, "inference_batchsize": 2, "inference_delay": 0.01, "broadcast_period": 0.5,
              "request_timeout": 1.0}
    values.update(overrides)
    return Config(**values)


def test_minimum_buffer_size_above_the_replay_capacity_is_refused_at_once():
    with pytest.raises(ConfigError, match="replay_capacity"):
        Trainer(cartpole_agent(replay_capacity=100), Config(minimum_buffer_size=101), make_cartpole)


@pytest.mark.parametrize(("agent_config", "network", "message"), [
    # state_shape (5,) on CartPole's (4,), with a network that takes (5,): start() ran with servers dying on every
    # request and no transition, then blamed the `__main__` guard
    (AgentConfig(state_shape=(5,), action_space_size=2, use_distributional=False), functools.partial(mlp, obs_size=5),
     r"observations to be shaped \(5,\) \(the agent's state_shape\), got \(4,\); set AgentConfig.state_shape=\(4,\)"),
    (AgentConfig(state_shape=(4,), action_space_size=3, use_distributional=False), functools.partial(mlp, n_actions=3),
     r"action space to be Discrete\(3\) .*got Discrete\(2\); set AgentConfig.action_space_size"),
], ids=["state_shape", "action_space_size"])
def test_an_env_that_does_not_fit_the_agent_is_refused_before_anything_starts(agent_config, network, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(Agent(agent_config, network), Config(minimum_buffer_size=500), make_cartpole)


def test_an_env_the_learner_cannot_make_is_left_to_the_actors_to_report():
    """A worker of queue_name may make envs the learner cannot: the check skips what fails here (the actors report
    it with its traceback, tests/processes/test_trainer.py)."""
    Trainer(cartpole_agent(), Config(minimum_buffer_size=500), make_misspelt_env)


def test_a_second_trainer_on_a_running_run_name_is_refused(redis_url, connection, run_name):
    connection.set(f"rqrl:{run_name}:seed:settings", "{}")
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name), make_cartpole)
    with pytest.raises(ConfigError, match="already exists in this Redis"):
        trainer.start(1.0)
    assert connection.exists(f"rqrl:{run_name}:seed:settings")  # not its run: left alone


def test_an_external_redis_needs_a_secret(redis_url, run_name):
    trainer = Trainer(cartpole_agent(), config(redis_url, run_name, secret=None), make_cartpole)
    with pytest.raises(ConfigError, match="secret"):
        trainer.start(1.0)


def test_with_redis_from_redis_url_and_no_rqrl_secret_the_error_names_both_ways(redis_url, run_name, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.delenv("RQRL_SECRET")
    trainer = Trainer(cartpole_agent(), config(None, run_name, secret=None), make_cartpole)
    with pytest.raises(ConfigError, match=r"needs secret=.*or, with Redis from REDIS_URL, RQRL_SECRET set"):
        trainer.start(1.0)


def test_the_module_offers_the_seed_pages_names():
    import rqrl.seed
    from rqrl.seed.actor import Actor

    assert {"Actor", "Config", "Trainer"} <= set(rqrl.seed.__all__)
    assert rqrl.seed.Actor is Actor and all(hasattr(rqrl.seed, name) for name in rqrl.seed.__all__)


def test_a_redis_that_does_not_answer_is_named_in_rqrls_own_error(run_name):
    """The trainer raised redis-py's errors as they came; the other families raise rqrl's, which name the URL and
    what to do."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)  # injected: no first contact, redis-py's retry
    trainer = Trainer(cartpole_agent(), config(url, run_name, connection=client), make_cartpole)
    with pytest.raises(RedisUnavailableError, match=f"Redis at {url} stayed unreachable") as raised:
        trainer.start(1.0)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
