"""RunConfig validation and its JSON form; seed lists, actor groups and the queue bound."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rqrl.engine.run_config import RunConfig, check_seeds, queue_bound, split_actors
from rqrl.errors import ConfigError


def config_fields(**changes) -> dict:
    fields = dict(
        run_name="run-1", run_id="abc123", queue_name="rqrl", n_rollout_steps=16, n_actors=4, batch_size=2,
        queue_bound=4, actor_env_seeds=[0, 1, 2, 3], actor_agent_seeds=[10, 11, 12, 13],
        actor_groups=[[0, 1], [2, 3]],
    )
    fields.update(changes)
    return fields


def test_valid_config_keeps_its_values_and_defaults():
    config = RunConfig(**config_fields())
    assert config.n_actors == 4 and config.queue_bound == 4
    assert (config.min_job_seconds, config.max_job_seconds, config.weights_ttl_seconds) == (1.0, 60.0, 10)
    assert config.extra == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_actors = 5


def test_config_is_keyword_only():
    with pytest.raises(TypeError):
        RunConfig("run-1", "abc")


def test_json_round_trip():
    config = RunConfig(**config_fields(extra={"algo": "impala"}, min_job_seconds=0.5, weights_ttl_seconds=30,
                                       weights_refresh_seconds=2.5))
    text = config.to_json()
    assert isinstance(text, str)
    assert RunConfig.from_json(text) == config
    assert RunConfig.from_json(text.encode()) == config


def test_from_json_validates():
    text = RunConfig(**config_fields()).to_json().replace('"n_rollout_steps": 16', '"n_rollout_steps": 0')
    with pytest.raises(ConfigError, match="n_rollout_steps >= 1, got 0"):
        RunConfig.from_json(text)


@pytest.mark.parametrize(("changes", "message"), [
    ({"n_rollout_steps": 0}, "expected n_rollout_steps >= 1, got 0"),
    ({"n_actors": 0, "actor_env_seeds": [], "actor_agent_seeds": [], "actor_groups": []}, "n_actors >= 1, got 0"),
    ({"batch_size": 0}, "batch_size >= 1, got 0"),
    ({"queue_bound": 0}, "expected queue_bound >= 1, got 0"),
    ({"actor_env_seeds": [0, 1, 2]}, "one env seed per actor"),
    ({"actor_agent_seeds": [0, 1, 2, 3, 4]}, "one agent seed per actor"),
    ({"actor_groups": [[0, 1], [1, 2, 3]]}, "must cover each actor once"),
    ({"actor_groups": [[0, 1], [2]]}, "must cover each actor once"),
    ({"actor_groups": [[0, 1, 2, 3, 4]]}, "must cover each actor once"),
    ({"min_job_seconds": 0}, "0 < min_job_seconds <= max_job_seconds"),
    ({"min_job_seconds": 5, "max_job_seconds": 1}, "0 < min_job_seconds <= max_job_seconds"),
    ({"run_name": "bad name"}, "run name"),
    ({"run_name": ""}, "run name"),
    ({"weights_refresh_seconds": -1}, "expected weights_refresh_seconds >= 0 seconds, got -1"),
    ({"weights_refresh_seconds": math.inf}, "expected weights_refresh_seconds >= 0 seconds, got inf"),
    ({"weights_refresh_seconds": True}, "expected weights_refresh_seconds >= 0 seconds, got True"),
])
def test_invalid_configs_are_refused_with_a_message(changes, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**config_fields(**changes))


def test_config_error_is_also_a_value_error():
    with pytest.raises(ValueError):
        RunConfig(**config_fields(batch_size=0))


def test_check_seeds_defaults_and_copies():
    assert check_seeds("actor_env_seeds", None, 3, 0) == [0, 1, 2]
    assert check_seeds("actor_agent_seeds", None, 2, 1_000_000) == [1_000_000, 1_000_001]
    given = (5, 6)
    assert check_seeds("actor_env_seeds", given, 2, 0) == [5, 6]
    assert check_seeds("s", range(3), 3, 0) == [0, 1, 2]


def test_check_seeds_refuses_a_wrong_count_and_names_the_fix():
    with pytest.raises(ConfigError, match=r"actor_env_seeds to hold one seed per actor \(3\), got 2.*"
                                          r"actor_env_seeds=list\(range\(3\)\)"):
        check_seeds("actor_env_seeds", [1, 2], 3, 0)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, None])
def test_check_seeds_refuses_non_ints(bad):
    with pytest.raises(ConfigError, match=f"non-negative ints, got {bad!r}"):
        check_seeds("actor_agent_seeds", [0, bad], 2, 0)


@pytest.mark.parametrize(("n_actors", "per_job", "groups"), [
    (4, 2, [[0, 1], [2, 3]]),
    (5, 2, [[0, 1], [2, 3], [4]]),
    (3, 3, [[0, 1, 2]]),
    (3, 1, [[0], [1], [2]]),
    (2, 5, [[0, 1]]),
])
def test_split_actors(n_actors, per_job, groups):
    result = split_actors(n_actors, per_job)
    assert result == groups
    assert sorted(actor for group in result for actor in group) == list(range(n_actors))


def test_split_actors_feeds_a_valid_config():
    config = RunConfig(**config_fields(actor_groups=split_actors(4, 3)))
    assert config.actor_groups == [[0, 1, 2], [3]]


@pytest.mark.parametrize(("batch_size", "factor", "bound"), [(4, 1, 4), (4, 2.0, 8), (4, 1.5, 6), (3, 1.9, 5),
                                                               (8, 0.5, 4)])
def test_queue_bound(batch_size, factor, bound):
    assert queue_bound(batch_size, factor) == bound


@pytest.mark.parametrize("factor", [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, "2", None, True])
def test_queue_bound_refuses_bad_factors(factor):
    with pytest.raises(ConfigError, match="queue_out_of_sync_factor > 0"):
        queue_bound(4, factor)


def test_a_factor_below_one_gives_a_queue_smaller_than_a_batch():
    """Maze's queue_out_of_sync_factor < 1: the learner collects a batch as its rollouts arrive."""
    config = RunConfig(**config_fields(batch_size=4, queue_bound=queue_bound(4, 0.5)))
    assert config.queue_bound == 2 < config.batch_size


@pytest.mark.parametrize(("batch_size", "factor"), [(4, 0.2), (1, 0.99), (100, 0.001)])
def test_a_factor_giving_an_empty_queue_is_refused_with_the_smallest_factor(batch_size, factor):
    with pytest.raises(ConfigError, match=r"gives a queue of 0 rollouts; expected a factor >= 1 / batch_size"):
        queue_bound(batch_size, factor)
