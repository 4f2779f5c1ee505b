"""The protocol's windows: production defaults, one scale for all of them, and what a run record carries."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rqrl.engine.run_config import RunConfig
from rqrl.engine.timings import TIME_SCALE_VARIABLE, ProtocolTimings, protocol_timings, time_scale
from rqrl.errors import ConfigError
from tests.unit.test_run_config import config_fields


def test_production_windows_keep_their_documented_values():
    timings = ProtocolTimings()
    assert (timings.heartbeat, timings.liveness, timings.lease) == (5.0, 20.0, 5.0)
    assert (timings.sideline_first, timings.sideline_max) == (1.0, 30.0)
    assert (timings.seed_job_start, timings.seed_queued_warning) == (60.0, 15.0)
    assert (timings.seed_alive, timings.seed_beat, timings.env_close, timings.stop_wait) == (3.0, 1.0, 5.0, 15.0)
    assert timings.liveness >= 4 * timings.heartbeat, "a worker is judged gone only after four missed beats"


def test_scaling_shortens_every_window_by_the_same_factor_down_to_its_floor():
    production, fast = ProtocolTimings(), ProtocolTimings.scaled(0.1)
    floors = {"lease": 1.0, "seed_alive": 1.0}  # refreshed by busy processes: never shorter than a second
    for spec in dataclasses.fields(ProtocolTimings):
        expected = max(getattr(production, spec.name) * 0.1, floors.get(spec.name, 0.0))
        assert getattr(fast, spec.name) == pytest.approx(expected), spec.name
    assert ProtocolTimings.scaled(0.5).lease == 2.5 and ProtocolTimings.scaled(2).seed_alive == 6.0
    assert fast.lease < fast.liveness, "a killed worker's lease lapses before it is judged gone"


@pytest.mark.parametrize("factor", [0.0, -1.0, float("nan"), float("inf")])
def test_a_scale_that_is_no_positive_number_is_refused(factor):
    with pytest.raises(ConfigError, match="positive number"):
        ProtocolTimings.scaled(factor)


def test_the_environment_sets_the_scale(monkeypatch):
    monkeypatch.setenv(TIME_SCALE_VARIABLE, "0.5")
    assert time_scale() == 0.5 and protocol_timings().heartbeat == 2.5
    monkeypatch.setenv(TIME_SCALE_VARIABLE, "")
    assert time_scale() == 1.0 and protocol_timings() == ProtocolTimings()
    monkeypatch.delenv(TIME_SCALE_VARIABLE)
    assert protocol_timings() == ProtocolTimings()


@pytest.mark.parametrize("raw", ["fast", "0", "-0.1", "nan"])
def test_a_bad_scale_in_the_environment_names_the_variable_and_the_fix(monkeypatch, raw):
    monkeypatch.setenv(TIME_SCALE_VARIABLE, raw)
    with pytest.raises(ConfigError, match=rf"RQRL_TIME_SCALE='{raw}' is not a positive number: unset it"):
        protocol_timings()


def test_the_tests_run_the_protocol_ten_times_faster():
    assert protocol_timings() == ProtocolTimings.scaled(0.1)  # tests/conftest.py sets RQRL_TIME_SCALE for every test


def test_a_run_record_carries_its_learners_timings_to_the_workers(monkeypatch):
    config = RunConfig(**config_fields(timings=ProtocolTimings.scaled(0.2)))
    monkeypatch.setenv(TIME_SCALE_VARIABLE, "1")  # a worker with other timings of its own still follows the run's
    again = RunConfig.from_json(config.to_json())
    assert again.timings == ProtocolTimings.scaled(0.2) and again == config
    assert again.lease_seconds == pytest.approx(1.0)  # 5 s times 0.2


def test_a_record_without_timings_takes_the_readers_and_an_old_lease_field_is_ignored():
    values = json.loads(RunConfig(**config_fields()).to_json())
    del values["timings"]
    values["lease_seconds"] = 5.0  # what records of earlier versions held
    config = RunConfig.from_json(json.dumps(values))
    assert config.timings == protocol_timings()


def test_record_timings_that_are_not_positive_seconds_are_refused():
    values = json.loads(RunConfig(**config_fields()).to_json())
    values["timings"]["heartbeat"] = -1
    with pytest.raises(ConfigError, match="positive seconds"):
        RunConfig.from_json(json.dumps(values))
    with pytest.raises(ConfigError, match="expected timings to be a ProtocolTimings"):
        RunConfig(**config_fields(timings={"heartbeat": 1.0}))
