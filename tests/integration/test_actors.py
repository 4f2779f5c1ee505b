"""RedisDistributedActors / SubprocDistributedActors against a real Redis and real worker processes.

The tests here run in-process; those that start processes are in tests/processes/test_actors.py.
"""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch

from rqrl import (
    ConfigError,
    NoWorkersError,
    PolicyError,
    RedisDistributedActors,
)
from rqrl.engine.codec import records_key
from rqrl.engine.policy import make_act_function
from rqrl.engine.trajectories import MAX_ENTRY_BYTES
from rqrl.maze.group_records import encode_signed_group
from rqrl.maze.rollout import ActorGroup
from tests import fixtures
from tests.conftest import TEST_SECRET
from tests.factories import redis_actors

pytestmark = pytest.mark.timeout(120)

# actors on the test Redis with local worker processes (one unless a test asks for more) started by fork
local_actors = functools.partial(redis_actors, n_local_workers=1, start_method="fork")


def test_no_worker_raises_instead_of_hanging(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_local_workers=0, no_worker_timeout=1.0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        started = time.monotonic()
        with pytest.raises(NoWorkersError, match="rqrl worker"):
            actors.collect_outputs("cpu")
    assert time.monotonic() - started < 10


def test_a_collect_before_the_first_broadcast_is_refused_at_once_as_the_serial_actors_do(connection, redis_url,
                                                                                          run_name):
    from rqrl import RqrlError

    with local_actors(redis_url, run_name, n_local_workers=0) as actors:
        started = time.monotonic()
        with pytest.raises(RqrlError, match=r"call broadcast_updated_policy\(\) before collect_outputs\(\)"):
            actors.collect_outputs("cpu")
        assert time.monotonic() - started < 5, "it waited for weights that were never broadcast"


def test_mismatching_state_dict_is_refused_before_reaching_workers(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_local_workers=0) as actors:
        bad = {"0.weight": torch.zeros(3, 3)}
        with pytest.raises(PolicyError, match=r"missing keys .*'2.bias'.*wrong shapes \['0.weight"):
            actors.broadcast_updated_policy(bad)
        assert connection.get(actors.keys.latest_version) is None


@pytest.mark.parametrize("arguments, message", [
    ({"n_actors": 0}, "n_actors >= 1"),
    ({"queue_out_of_sync_factor": 0}, "queue_out_of_sync_factor > 0"),
    ({"queue_out_of_sync_factor": 0.25}, "gives a queue of 0 rollouts"),
    ({"start_method": "threads"}, "unknown start_method 'threads'"),
    ({"actor_env_seeds": [1, 2, 3]}, "one seed per actor"),
    ({"actor_agent_seeds": [1]}, "one seed per actor"),
    ({"n_rollout_steps": 0}, "n_rollout_steps >= 1"),
    ({"run_name": "bad name!"}, "run name"),
])
def test_invalid_arguments_are_refused_with_the_fix(redis_url, arguments, message):
    with pytest.raises(ConfigError, match=message):
        local_actors(redis_url, arguments.pop("run_name", "ok"), **arguments)


def test_run_name_in_use_is_refused(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_local_workers=0):
        with pytest.raises(ConfigError, match="already exists"):
            local_actors(redis_url, run_name, n_local_workers=0).start()


def test_policy_that_does_not_fit_the_env_is_refused_at_start(connection, redis_url, run_name):
    with pytest.raises(ConfigError, match="policy failed on a first observation"):
        local_actors(redis_url, run_name, env_factory=fixtures.make_counting_env, n_local_workers=0).start()


def test_worker_redis_url_without_an_external_redis_is_refused():
    with pytest.raises(ConfigError, match="worker_redis_url is for an external Redis"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0,
                               worker_redis_url="redis://worker:pw@127.0.0.1:6379/0")


def test_unpicklable_env_factory_is_refused(connection, redis_url, run_name):
    import threading

    lock = threading.Lock()

    def factory():
        with lock:
            return fixtures.make_cartpole()

    with pytest.raises(ConfigError, match="cannot pickle"):
        local_actors(redis_url, run_name, env_factory=factory, n_local_workers=0).start()
    assert list(connection.scan_iter(match=f"rqrl:{run_name}:*")) == []


def good_entry(actors) -> bytes:
    """One queue entry as a worker pushes it: a signed group of actors 0 and 1's first rollouts."""
    config = actors.config
    group = ActorGroup(fixtures.make_cartpole, [0, 1], config.actor_env_seeds, config.actor_agent_seeds,
                       config.n_rollout_steps)
    try:
        records = group.run(make_act_function(actors.policy, group.action_space), 0, actors.policy_version,
                            cut_at_end=False)
    finally:
        group.close()
    return encode_signed_group(records, config.run_id, records_key(TEST_SECRET, config.run_id))


def test_an_oversized_junk_entry_is_dropped_in_redis_and_never_read(connection, redis_url, run_name):
    """A 65 MB entry before a good one: counted as oversized, dropped in Redis; the learner reads only the good."""
    with local_actors(redis_url, run_name, n_local_workers=0, no_worker_timeout=60) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        good = good_entry(actors)
        connection.rpush(actors.keys.trajectories, b"x" * (MAX_ENTRY_BYTES + 2**20), good)
        collected = actors.collect_outputs("cpu")
    assert collected.record.batch_size == 2
    assert actors.records_rejected_by_reason == {"oversized": 1}


def test_junk_on_the_queue_drains_at_once_and_a_missing_doorbell_stalls_nothing(connection, redis_url, run_name):
    """1000 junk entries before a good one, the doorbell deleted: refused in a few large pops, not 2 per wait."""
    with local_actors(redis_url, run_name, n_local_workers=0, no_worker_timeout=60) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        good = good_entry(actors)
        connection.rpush(actors.keys.trajectories, *[os.urandom(32) for _ in range(1000)], good)
        connection.delete(actors.keys.doorbell)
        started = time.monotonic()
        collected = actors.collect_outputs("cpu")
        waited = time.monotonic() - started
    assert collected.record.batch_size == 2 and actors.records_rejected == 1000
    assert actors.records_rejected_by_reason == {"unauthenticated": 1000}
    assert waited < 20, f"1000 junk entries took {waited:.1f} s (2 per doorbell wait would take 125 s)"


def test_with_no_worker_registered_yet_each_actor_is_a_job_of_its_own(connection, redis_url, run_name):
    with local_actors(redis_url, run_name, n_local_workers=0, n_actors=4) as actors:
        assert actors.config.actor_groups == [[0], [1], [2], [3]]
        assert actors.options.actors_per_job == 1


def test_an_embedded_redis_that_dies_is_said_at_once_not_waited_for(monkeypatch):
    from rqrl import RedisUnavailableError
    from rqrl.engine.local_workers import LocalWorkers

    monkeypatch.delenv("REDIS_URL", raising=False)
    # an embedded Redis needs local workers (n_local_workers=0 is refused there); this test needs none running
    monkeypatch.setattr(LocalWorkers, "start_workers", lambda *args, **kwargs: None)
    actors = redis_actors(None, "embedded-dies", n_local_workers=1, redis_outage_seconds=60)
    with actors:
        actors.queue_size()
        server = actors.local_workers.server
        server.process.kill()
        server.process.wait(10)
        started = time.monotonic()
        with pytest.raises(RedisUnavailableError, match=r"the embedded redis-server \(pid \d+\) exited with code -9"):
            actors.queue_size()
        assert time.monotonic() - started < 5, "it waited out the 60 s outage window for a server that is gone"


def test_a_resume_that_fails_to_start_hands_the_run_back_to_its_learner(connection, redis_url, run_name, monkeypatch):
    from rqrl.engine.local_workers import LocalWorkers

    with local_actors(redis_url, run_name, n_local_workers=0, actors_per_job=1) as first:
        def no_room(*args, **kwargs):
            raise RuntimeError("no room for workers")

        monkeypatch.setattr(LocalWorkers, "start_workers", no_room)
        second = local_actors(redis_url, run_name, n_local_workers=1, actors_per_job=1, resume=True)
        with pytest.raises(RuntimeError, match="no room for workers"):
            second.start()
        assert first._run_store.check_in(10) == (True, False), "the failed resume kept the run, or deleted it"
        assert connection.exists(first.keys.config)
    assert connection.keys(f"rqrl:{run_name}:*") == [], "the first learner's stop() cleans the run up"


def test_a_run_rqrl_stop_removed_while_its_learner_looked_dead_is_not_stored_again(connection, redis_url, run_name):
    """A learner that trains longer than learner_timeout between collects looks dead; `rqrl stop` removes its run.
    Its next collect stored the run again and went on; now it raises RunStoppedError."""
    from rqrl import RunStoppedError
    from tests.cli_runner import invoke

    with local_actors(redis_url, run_name, n_local_workers=0, no_worker_timeout=30.0) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        connection.delete(actors.keys.learner_deadline)
        result = invoke("stop", run_name, "--redis-url", redis_url, "--wait", "1")
        assert result.exit_code == 0 and "no live learner" in result.output, result.output
        with pytest.raises(RunStoppedError, match="stopped from outside this learner"):
            actors.collect_outputs("cpu")
        assert not connection.exists(actors.keys.config), "the stopped run was stored again"


def test_a_collect_after_stop_says_that_stop_ended_the_run(connection, redis_url, run_name):
    from rqrl import RqrlError

    actors = local_actors(redis_url, run_name, n_local_workers=0)
    actors.start()
    actors.stop()
    with pytest.raises(RqrlError, match=r"call start\(\) before collect_outputs\(\): stop\(\) ended the run"):
        actors.collect_outputs("cpu")


def test_a_group_larger_than_the_queue_bound_is_warned_of_with_its_lag(connection, redis_url, run_name, caplog):
    """n_actors=20000 ran with the queue at twice its bound and a policy lag of 390, without a word."""
    import logging

    actors = local_actors(redis_url, run_name, n_local_workers=0, n_actors=40, batch_size=4, actors_per_job=20)
    with caplog.at_level(logging.WARNING, logger="rqrl.maze.actors"), actors:
        actors.start()
    assert ("a group of 20 actors pushes 20 rollouts at a time, more than the queue's bound of 8" in caplog.text
            and "n_actors / batch_size = 10 updates" in caplog.text), caplog.text


class _ActionFive(torch.nn.Module):
    """An act() policy whose every action is 5: none of CartPole's."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def act(self, obs, generator):
        from rqrl.engine.policy import PolicyStep

        return PolicyStep(torch.full((len(obs),), 5), torch.full((len(obs),), -0.69))


def test_an_act_policy_whose_actions_the_env_cannot_take_is_refused_at_start(connection, redis_url, run_name):
    """start() passed it; the workers then failed on gymnasium's bare `AssertionError: np.int64(5) ... invalid`."""
    with pytest.raises(ConfigError, match=r"returned action 5, outside Discrete\(2\) \(each from 0 to 1\) for a "
                                          r"first observation"):
        local_actors(redis_url, run_name, policy=_ActionFive(), n_local_workers=0).start()
