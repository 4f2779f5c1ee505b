"""Config of the SEED trainer: the source's twelve fields and defaults, help texts, validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rqrl.errors import ConfigError
from rqrl.seed.config import Config, batch_that_fills, batch_warning, check_against_replay

SOURCE_DEFAULTS = {
    "max_environment_steps": -1, "n_step": 3, "epsilon": 0.1, "actor_processes": 1, "actor_threads": 4,
    "inference_servers": 1, "broadcast_period": 2.5, "inference_batchsize": 4, "inference_delay": 0.1,
    "inference_device": torch.device("cpu"), "minimum_buffer_size": 1000, "max_train_frequency": -1,
}


def test_the_twelve_source_fields_come_first_in_order_with_their_defaults():
    fields = dataclasses.fields(Config)
    assert [spec.name for spec in fields[:12]] == list(SOURCE_DEFAULTS)
    config = Config()
    assert {name: getattr(config, name) for name in SOURCE_DEFAULTS} == SOURCE_DEFAULTS


def test_positional_arguments_follow_the_source_signature():
    config = Config(100, 5, 0.2)
    assert (config.max_environment_steps, config.n_step, config.epsilon) == (100, 5, 0.2)


def test_every_field_has_a_one_line_help():
    for spec in dataclasses.fields(Config):
        help_text = spec.metadata.get("help", "")
        assert help_text and "\n" not in help_text, spec.name


@pytest.mark.parametrize(("name", "value"), [
    ("n_step", 0), ("actor_processes", 0), ("actor_threads", 0), ("inference_servers", 0),
    ("inference_batchsize", 0), ("minimum_buffer_size", 0), ("transition_queue_size", 0), ("epsilon", 1.5),
    ("epsilon", -0.1), ("broadcast_period", 0), ("inference_delay", -1), ("request_timeout", 0),
    ("max_train_frequency", float("nan")), ("n_step", 2.5), ("max_environment_steps", 1.5), ("run_name", "a b"),
    ("inference_device", "tpu-ish"), ("replay_ratio", float("inf")), ("replay_ratio", "8"), ("request_frames", 1),
    ("drop_when_full", "yes"),
])
def test_bad_values_raise_config_error_naming_them(name, value):
    with pytest.raises(ConfigError, match=name if name != "run_name" else "run name"):
        Config(**{name: value})


def test_device_strings_become_torch_devices():
    assert Config(inference_device="cpu").inference_device == torch.device("cpu")


def test_a_connection_needs_a_url_for_the_processes():
    import fakeredis

    with pytest.raises(ConfigError, match="redis_url"):
        Config(connection=fakeredis.FakeRedis())


def test_minimum_buffer_size_above_the_replay_capacity_is_refused():
    check_against_replay(Config(minimum_buffer_size=100), 100)
    with pytest.raises(ConfigError, match="minimum_buffer_size=101.*replay_capacity=100"):
        check_against_replay(Config(minimum_buffer_size=101), 100)


def test_process_settings_are_json():
    import json

    assert json.loads(json.dumps(Config().process_settings()))["inference_device"] == "cpu"


@pytest.mark.parametrize(("processes", "threads", "batch", "fills"), [
    (1, 4, 4, 4), (1, 2, 4, 2), (2, 1, 4, 2), (3, 2, 8, 6), (2, 8, 4, 4),
])
def test_the_servers_batch_at_most_the_observations_that_can_wait_at_once(processes, threads, batch, fills):
    """One observation per env thread can wait (an actor process's threads share one request): a larger
    inference_batchsize never fills, and every batch waited inference_delay (225 CartPole steps in 12 s)."""
    config = Config(actor_processes=processes, actor_threads=threads, inference_batchsize=batch)
    assert batch_that_fills(config) == fills
    assert (batch_warning(config) is None) == (fills == batch)


def test_the_batch_warning_names_the_values_and_the_fix():
    warning = batch_warning(Config(actor_threads=2))
    assert warning is not None
    for part in ("inference_batchsize=4", "actor_processes=1 x actor_threads=2", "inference_delay=0.1",
                 "Set inference_batchsize <= 2, or raise actor_threads or actor_processes"):
        assert part in warning
