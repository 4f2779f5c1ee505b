"""Where a worker's time goes: counted per rollout, published as shares with its steps/s, read by rqrl status."""

from __future__ import annotations

import json

import fakeredis
import pytest

from rqrl.cli.status import read_published, read_worker_times, worker_rates, worker_times
from rqrl.engine import jobs
from rqrl.engine.jobs import worker_label
from rqrl.engine.keys import RunKeys
from rqrl.engine.run_config import RunConfig
from rqrl.engine.worker_times import WORKER_TIME_PARTS, WorkerTimes
from tests.unit.test_run_config import config_fields


@pytest.fixture
def config() -> RunConfig:
    jobs._RATES.clear()
    yield RunConfig(**config_fields(run_name="times-run"))
    jobs._RATES.clear()


def published(connection: fakeredis.FakeRedis, config: RunConfig) -> dict:
    return json.loads(connection.hget(RunKeys(config.run_name).worker_rates, worker_label()))


def test_a_window_of_rollouts_is_published_as_shares_of_its_time(config):
    connection, heartbeat = fakeredis.FakeRedis(), config.timings.heartbeat
    jobs._publish_rate(connection, config, 100, 1000.0, WorkerTimes(step=0.25 * heartbeat, room=0.5 * heartbeat))
    assert connection.hget(RunKeys(config.run_name).worker_rates, worker_label()) is None, "within the window"
    jobs._publish_rate(connection, config, 100, 1000.0 + heartbeat,
                       WorkerTimes(step=0.125 * heartbeat, push=0.0625 * heartbeat))
    shares = published(connection, config)["time"]
    assert shares == {"weights": 0.0, "step": 0.375, "encode": 0.0, "push": 0.0625, "room": 0.5}
    assert published(connection, config)["steps_per_second"] == pytest.approx(200 / heartbeat, abs=0.1)


def test_shares_never_add_up_to_more_than_all_of_the_time(config):
    """A rollout that began before the window counts whole in it."""
    connection, heartbeat = fakeredis.FakeRedis(), config.timings.heartbeat
    jobs._publish_rate(connection, config, 1, 1000.0)
    spent = WorkerTimes(step=1.5 * heartbeat, encode=heartbeat / 2)
    jobs._publish_rate(connection, config, 1, 1000.0 + heartbeat, spent)
    assert published(connection, config)["time"] == {"weights": 0.0, "step": 0.75, "encode": 0.25, "push": 0.0,
                                                      "room": 0.0}


def test_a_job_that_counts_no_times_publishes_its_rate_alone(config):
    connection, heartbeat = fakeredis.FakeRedis(), config.timings.heartbeat
    jobs._publish_rate(connection, config, 10, 1000.0)
    jobs._publish_rate(connection, config, 10, 1000.0 + heartbeat)
    assert "time" not in published(connection, config)


def test_worker_times_older_than_liveness_malformed_or_missing_are_left_out():
    connection, keys = fakeredis.FakeRedis(), RunKeys("r1")
    shares = dict.fromkeys(WORKER_TIME_PARTS, 0.1)
    connection.hset(keys.worker_rates, mapping={
        "fresh": json.dumps({"steps_per_second": 10.0, "at": 1000.0, "time": shares}),
        "stale": json.dumps({"steps_per_second": 10.0, "at": 900.0, "time": shares}),
        "rate-only": json.dumps({"steps_per_second": 10.0, "at": 1000.0}),
        "part-missing": json.dumps({"at": 1000.0, "time": {"step": 1.0}}),
        "junk": "not json"})
    # with the tests' timings (RQRL_TIME_SCALE=0.1) the liveness window is 2 s: 1 s old is fresh, 100 s stale
    assert read_worker_times(connection, keys, now=1001.0) == {"fresh": shares}


def test_one_read_gives_each_worker_its_rate_and_shares_from_the_same_window():
    connection, keys = fakeredis.FakeRedis(), RunKeys("r1")
    shares = dict.fromkeys(WORKER_TIME_PARTS, 0.2)
    connection.hset(keys.worker_rates, mapping={
        "both": json.dumps({"steps_per_second": 10.0, "at": 1000.5, "time": shares}),
        "rate-only": json.dumps({"steps_per_second": 5.0, "at": 1000.5}),
        "shares-only": json.dumps({"steps_per_second": "fast", "at": 1000.5, "time": shares})})
    published = read_published(connection, keys, now=1001.0)
    assert worker_rates(published) == {"both": 10.0, "rate-only": 5.0}
    assert worker_times(published) == {"both": shares, "shares-only": shares}


def test_worker_times_published_before_a_given_time_are_left_out():
    connection, keys = fakeredis.FakeRedis(), RunKeys("r1")
    shares = dict.fromkeys(WORKER_TIME_PARTS, 0.2)
    connection.hset(keys.worker_rates, mapping={
        "inside": json.dumps({"steps_per_second": 10.0, "at": 1000.5, "time": shares}),
        "before": json.dumps({"steps_per_second": 10.0, "at": 999.5, "time": shares})})
    assert read_worker_times(connection, keys, now=1001.0, since=1000.0) == {"inside": shares}


def test_adding_times_adds_every_part():
    total = WorkerTimes(weights=1.0, step=2.0)
    total.add(WorkerTimes(step=1.0, encode=0.5, push=0.25, room=0.125))
    assert total == WorkerTimes(weights=1.0, step=3.0, encode=0.5, push=0.25, room=0.125)
