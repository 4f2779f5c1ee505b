"""rqrl.seed.store: a SEED run keeps the run record and heartbeat every family keeps, so `rqrl status`,
`rqrl health --run` and `rqrl stop` treat it as they treat the others (real Redis, no process)."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
import redis

from rqrl.cli.status import read_status
from rqrl.engine.health import learner_is_healthy
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import SEED_KIND, RunConfig
from rqrl.engine.screen import MAX_ENTRY_BYTES
from rqrl.errors import ConfigError, RunStoppedError, SignatureError
from rqrl.seed.actor import TransitionSender, encode_transitions
from rqrl.seed.config import Config
from rqrl.seed.nstep import TransitionBatch
from rqrl.seed.store import SeedRecord, SeedRun
from rqrl.seed.trainer import Trainer
from tests.cli_runner import invoke
from tests.conftest import TEST_SECRET
from tests.seed_fixtures import cartpole_agent, make_cartpole, mlp


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
    assert connection.keys(f"rqrl:{run_name}:*") == [RunKeys(run_name).stopped.encode()], "all but the stop flag"
    run.record(SeedRecord(None, 1, 1))
    run.check_in({"beat": time.time()})
    invoke("stop", run_name, "--redis-url", redis_url, "--wait", "0.5")  # a live trainer: it waits on it
    assert run.stopped()


def test_a_trainer_refuses_a_run_name_another_familys_run_holds(connection, run_name, redis_url):
    connection.set(RunKeys(run_name).config, "{}")
    config = Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET)
    trainer = Trainer(cartpole_agent(), config, make_cartpole)
    with pytest.raises(ConfigError, match="already exists in this Redis"):
        trainer.start(1.0)
    assert connection.get(RunKeys(run_name).config) == b"{}"


def test_events_that_are_no_events_are_dropped_and_counted(connection, run_name, caplog):
    run = seed_run(connection, run_name)
    run.report("thread_died", actor=0, thread=1, error="boom")
    planted = json.dumps({"kind": "actor_thread_died", "actor": 0, "thread": 0, "error": "forged"})
    connection.rpush(run.keys.seed("events"), "not json", "[1]", b"\xff\xfe", '{"kind": 3}', planted)
    assert [event["kind"] for event in run.take_events()] == ["thread_died"]
    assert run.junk == 5 and "is no event of this run's actors" in caplog.text
    connection.set(run.keys.seed("events"), "a string, not a list")
    assert run.take_events() == [] and not connection.exists(run.keys.seed("events"))


def test_a_counter_that_is_no_integer_is_left_out_and_pushes_go_on(connection, run_name):
    run = seed_run(connection, run_name)
    connection.hset(run.keys.seed("stats"), mapping={"pushed": "abc", "full_waits": 2})
    sender = TransitionSender(run, bound=10)
    assert sender.send(b"message", count=3)  # HINCRBY on "abc" fails inside the script: the push does not
    assert connection.lrange(run.keys.seed("transitions"), 0, -1) == [b"message"]
    assert run.counters() == {"full_waits": 2}


def test_a_transitions_key_of_the_wrong_type_is_replaced_not_raised(connection, run_name, redis_url):
    run = seed_run(connection, run_name)
    connection.set(run.keys.seed("transitions"), "not a list")
    trainer = Trainer(cartpole_agent(), Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET),
                      make_cartpole)
    assert trainer._receive(run, 10) == 0
    assert not connection.exists(run.keys.seed("transitions")) and run.junk == 1


def test_settings_a_redis_writer_rewrote_are_refused(connection, run_name):
    """Issue 24, item 3: rewriting seed:settings (gamma 1.0, epsilon 1.0, n_step 10) as it appears is refused."""
    run = seed_run(connection, run_name)
    run.write({"gamma": 0.99, "epsilon": 0.05, "n_step": 3}, mlp, make_cartpole)
    assert run.settings() == {"gamma": 0.99, "epsilon": 0.05, "n_step": 3}
    connection.set(run.keys.seed("settings"), json.dumps({"gamma": 1.0, "epsilon": 1.0, "n_step": 10}))
    with pytest.raises(SignatureError, match="unsigned"):
        run.settings()
    other = SeedRun(connection, RunKeys(run_name), b"another secret")
    other.write({"gamma": 1.0}, mlp, make_cartpole)  # signed, but not under this run's secret
    with pytest.raises(SignatureError):
        run.settings()


def cartpole_transitions(value: float = 0.0) -> TransitionBatch:
    return TransitionBatch(np.full((2, 4), value, np.float32), np.zeros(2, np.int64), np.ones(2, np.float32),
                           np.full(2, 0.99, np.float32), np.zeros((2, 4), np.float32), np.ones((2, 2), bool))


def test_replayed_transition_messages_are_refused(connection, run_name, redis_url):
    """Issue 24, item 2: each message pushed 20 times trains once; an older message after a newer one, never."""
    run = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "run-id-1")
    trainer = Trainer(cartpole_agent(), Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET),
                      make_cartpole)
    first = encode_transitions(cartpole_transitions(1), run.message_key, [10.0], "0.0.0.ab", 0)
    second = encode_transitions(cartpole_transitions(2), run.message_key, None, "0.0.0.ab", 1)
    connection.rpush(run.keys.seed("transitions"), *[first] * 20, second, first)
    assert trainer._receive(run, 100) == 22
    assert trainer.stats.transitions_received == 4 and trainer.stats.episodes == 1
    assert trainer.stats.messages_rejected == 20 and run.junk == 20


def test_messages_of_an_earlier_run_of_the_same_name_are_refused(connection, run_name, redis_url):
    """Issue 24, item 2: keys derive from a per-run id, so what an earlier run of the name left cannot verify."""
    earlier = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "earlier-run")
    now = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "this-run")
    assert earlier.message_key != now.message_key and earlier.weights_key != now.weights_key
    trainer = Trainer(cartpole_agent(), Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET),
                      make_cartpole)
    connection.rpush(now.keys.seed("transitions"),
                     encode_transitions(cartpole_transitions(), earlier.message_key, None, "0.0.0.ab", 0))
    assert trainer._receive(now, 10) == 1 and trainer.stats.transitions_received == 0
    assert trainer.stats.messages_rejected == 1


def test_a_planted_oversized_message_is_dropped_in_redis_unread(connection, run_name, redis_url, caplog):
    """The Maze learner screened its pops; the SEED trainer read a Redis writer's 64 MB+ entry whole to refuse it."""
    run = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "run-id-1")
    trainer = Trainer(cartpole_agent(), Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET),
                      make_cartpole)
    good = encode_transitions(cartpole_transitions(1), run.message_key, None, "0.0.0.ab", 0)
    connection.rpush(run.keys.seed("transitions"), b"x" * (MAX_ENTRY_BYTES + 2**20), good)
    with caplog.at_level(logging.WARNING):
        assert trainer._receive(run, 10) == 1
    assert trainer.stats.transitions_received == 2 and trainer.stats.messages_rejected == 1
    assert "a transition message over 64 MB was dropped in Redis, unread" in caplog.text
    assert connection.llen(run.keys.seed("transitions")) == 0

def test_a_refused_right_is_raised_and_never_deletes_the_actors_messages(connection, run_name, redis_url):
    """Only WRONGTYPE means the key is junk to delete; a user whose key patterns leave out the screen's scratch key
    is refused (NOPERM), and the messages stay for a trainer with the right user."""
    run = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "run-id-1")
    message = encode_transitions(cartpole_transitions(1), run.message_key, None, "0.0.0.ab", 0)
    connection.rpush(run.keys.seed("transitions"), message)
    user = "rqrl-test-no-scratch"
    connection.acl_setuser(user, enabled=True, passwords=["+no-scratch-pw"], keys=[f"rqrl:{run_name}:seed:*"],
                           commands=["+@all"])
    try:
        narrow = redis.Redis.from_url(redis_url, username=user, password="no-scratch-pw")
        trainer = Trainer(cartpole_agent(), Config(redis_url=redis_url, run_name=run_name, secret=TEST_SECRET),
                          make_cartpole)
        with pytest.raises(redis.exceptions.NoPermissionError):
            trainer._receive(SeedRun(narrow, RunKeys(run_name), TEST_SECRET, "run-id-1"), 10)
        narrow.close()
    finally:
        connection.acl_deluser(user)
    assert connection.lrange(run.keys.seed("transitions"), 0, -1) == [message]

def test_processes_join_the_run_with_the_id_of_its_record(connection, run_name):
    with pytest.raises(RunStoppedError, match="no SEED run record"):
        SeedRun.attach(connection, RunKeys(run_name), TEST_SECRET)
    trainer_side = SeedRun(connection, RunKeys(run_name), TEST_SECRET, "the-run-id")
    trainer_side.record(SeedRecord(None, 1, 1))
    joined = SeedRun.attach(connection, RunKeys(run_name), TEST_SECRET)
    assert joined.run_id == "the-run-id" and joined.message_key == trainer_side.message_key
