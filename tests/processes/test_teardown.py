"""Each family's learner stops within seconds when its Redis is gone (a crash, a host down), warns what it left
there, raises nothing over the error that stopped it, and stops its local processes all the same. Before, each
command of the tear-down rode out the whole outage window (60 s), and the error it then raised hid the first."""

from __future__ import annotations

import _thread
import logging
import threading
import time

import pytest

from rqrl import MultiprocessingSampler, WorkerFactory
from rqrl.seed import Config, Trainer
from tests import fixtures
from tests.conftest import TEST_SECRET
from tests.factories import redis_actors
from tests.redis_servers import RedisServer
from tests.seed_fixtures import cartpole_agent, make_cartpole

pytestmark = pytest.mark.timeout(120)

STOPPED_WITHIN = 20.0
"""The tear-down's grace (3 s) plus the local workers' own exit on a Redis that is gone (about 4 s), with room."""


def assert_warned_what_is_left(caplog, run_name: str) -> None:
    assert f"`rqrl stop {run_name} --redis-url URL` deletes them" in caplog.text, caplog.text


def test_maze_actors_stop_within_seconds_when_redis_is_gone(tmp_path, run_name, caplog):
    server = RedisServer(tmp_path, tcp=True).start()
    actors = redis_actors(server.url, run_name, n_local_workers=1)
    try:
        actors.start()
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")  # the next batch's pop is in flight now (pop_ahead)
        workers = list(actors.local_workers.processes)
        server.kill()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, "rqrl.engine.teardown"):
            actors.stop(timeout=10)
        assert time.monotonic() - started < STOPPED_WITHIN
    finally:
        actors.stop(timeout=1)
        server.stop()
    assert_warned_what_is_left(caplog, run_name)
    assert workers and all(not process.is_alive() for process in workers)


def test_the_garage_sampler_shuts_down_within_seconds_when_redis_is_gone(tmp_path, run_name, caplog):
    server = RedisServer(tmp_path, tcp=True).start()
    sampler = MultiprocessingSampler(WorkerFactory(max_episode_length=100, n_workers=2, seed=0),
                                     [fixtures.VersionPolicy(worker) for worker in range(2)], fixtures.make_echo_env(),
                                     redis_url=server.url, run_name=run_name, secret=TEST_SECRET, n_local_workers=1,
                                     progress=False)
    try:
        assert sampler.obtain_samples(0, 50, None).lengths.sum() >= 50
        workers = list(sampler._local.processes)
        server.kill()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, "rqrl.engine.teardown"):
            sampler.shutdown_worker()
        assert time.monotonic() - started < STOPPED_WITHIN
    finally:
        sampler.shutdown_worker()
        server.stop()
    assert_warned_what_is_left(caplog, run_name)
    assert workers and all(not process.is_alive() for process in workers)


def test_a_seed_trainer_interrupted_after_its_redis_went_returns_within_seconds(tmp_path, run_name, caplog):
    """Ctrl-C while the trainer rides out the outage: the KeyboardInterrupt reaches the caller, not a Redis error
    from the tear-down a minute later, and the actor and server processes are stopped."""
    server = RedisServer(tmp_path, tcp=True).start()
    config = Config(redis_url=server.url, run_name=run_name, secret=TEST_SECRET, actor_processes=1, actor_threads=2,
                    minimum_buffer_size=50, inference_batchsize=2, inference_delay=0.01, broadcast_period=0.5,
                    request_timeout=1.0)
    trainer = Trainer(cartpole_agent(), config, make_cartpole)
    training, interrupted_at = threading.Event(), []

    def pull_the_plug() -> None:
        deadline = time.monotonic() + 60
        while trainer.stats.train_steps < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        server.kill()
        time.sleep(1.0)  # the trainer is riding out the outage now
        if training.is_set():
            interrupted_at.append(time.monotonic())
            _thread.interrupt_main()  # Ctrl-C

    plug = threading.Thread(target=pull_the_plug, daemon=True)
    plug.start()
    try:
        with caplog.at_level(logging.WARNING, "rqrl.engine.teardown"), pytest.raises(KeyboardInterrupt):
            training.set()
            try:
                trainer.start(90)
            finally:
                training.clear()
        returned_at = time.monotonic()
    finally:
        plug.join(timeout=70)
        server.stop()
    assert interrupted_at and returned_at - interrupted_at[0] < STOPPED_WITHIN
    assert trainer.stats.train_steps >= 5 and trainer.processes == {}
    assert all(not process_alive(pid) for pid in trainer.started_pids)
    assert_warned_what_is_left(caplog, run_name)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (and is no zombie), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
