"""rqrl.seed.store: a SEED run keeps the run record and heartbeat every family keeps, so `rqrl status`,
`rqrl health --run` and `rqrl stop` treat it as they treat the others (real Redis, no process)."""

from __future__ import annotations

import time

import pytest

from rqrl.cli.status import read_status
from rqrl.engine.health import learner_is_healthy
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import RunConfig
from rqrl.errors import ConfigError
from rqrl.seed.config import Config
from rqrl.seed.store import SEED_KIND, SeedRecord, SeedRun
from rqrl.seed.trainer import Trainer
from tests.cli_runner import invoke
from tests.conftest import TEST_SECRET
from tests.seed_fixtures import cartpole_agent, make_cartpole


def seed_run(connection, run_name, queue_name=None):
    run = SeedRun(connection, RunKeys(run_name), TEST_SECRET.encode())
    run.record(SeedRecord(queue_name, actor_processes=2, actor_threads=3))
    return run


def test_the_record_names_the_kind_the_actors_and_the_queue(connection, run_name):
    seed_run(connection, run_name, queue_name="gpu-box")
    config = RunConfig.from_json(connection.get(RunKeys(run_name).config))
    assert config.extra == {"kind": SEED_KIND, "actors": "jobs"} and config.queue_name == "gpu-box"
    assert config.n_actors == 6 and config.actor_groups == [[0, 1, 2], [3, 4, 5]]


def test_status_and_health_see_a_seed_run_that_checks_in(connection, run_name, redis_url):
    run = seed_run(connection, run_name)
    assert not learner_is_healthy(connection, run_name)[0], "no heartbeat yet"
    run.check_in({"beat": time.time(), "env_steps": 1234.0})
    assert learner_is_healthy(connection, run_name) == (True, f"the learner of run {run_name} is alive")
    [status] = read_status(connection, run_name)
    assert status.n_actors == 6 and status.learner["env_steps"] == 1234.0
    result = invoke("status", "--run", run_name, "--redis-url", redis_url)
    assert result.exit_code == 0 and run_name in result.stdout


def test_rqrl_stop_sets_the_flag_the_trainer_and_its_actors_read(connection, run_name, redis_url):
    run = seed_run(connection, run_name)
    result = invoke("stop", run_name, "--redis-url", redis_url, "--wait", "5")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "no live learner; stopped its jobs and removed its keys" in result.stdout  # never checked in
    assert connection.keys(f"rqrl:{run_name}:*") == []
    run.record(SeedRecord(None, 1, 1))
    run.check_in({"beat": time.time()})
    invoke("stop", run_name, "--redis-url", redis_url, "--wait", "0.5")  # a live trainer: it waits on it
    assert run.stopped()


def test_a_trainer_refuses_a_run_name_another_familys_run_holds(connection, run_name, redis_url):
    connection.set(RunKeys(run_name).config, "{}")
    config = Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET)
    trainer = Trainer(cartpole_agent(), config, make_cartpole)
    with pytest.raises(ConfigError, match="running in this Redis already"):
        trainer.start(1.0)
    assert connection.get(RunKeys(run_name).config) == b"{}"
