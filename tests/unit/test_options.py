"""RunOptions: the one home of the Redis actors' defaults, validated on construction."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import redis

from rqrl import ConfigError, RedisDistributedActors, SubprocDistributedActors
from rqrl.engine.options import DEFAULTS, RunOptions
from tests import fixtures


@pytest.mark.parametrize("name", ["collect_timeout", "no_worker_timeout", "min_job_seconds", "max_job_seconds",
                                  "hang_seconds", "redis_outage_seconds"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "5"])
def test_durations_must_be_positive(name, value):
    with pytest.raises(ConfigError, match=rf"expected {name} > 0, got {value!r}"):
        RunOptions(**{name: value})


def test_the_message_names_the_value():
    with pytest.raises(ConfigError) as raised:
        RunOptions(collect_timeout=0)
    assert str(raised.value) == "expected collect_timeout > 0, got 0"


@pytest.mark.parametrize("options, message", [
    ({"min_job_seconds": 5.0, "max_job_seconds": 1.0}, r"expected max_job_seconds >= min_job_seconds \(5.0\), got 1.0"),
    ({"n_local_workers": -1}, "expected n_local_workers >= 0, got -1"),
    ({"n_local_workers": True}, "expected n_local_workers >= 0, got True"),
    ({"actors_per_job": 0}, "expected actors_per_job >= 1, got 0"),
    ({"queue_name": ""}, "expected queue_name to be a non-empty string"),
    ({"run_name": "bad name!"}, "run name"),
    ({"start_method": "threads"}, r"unknown start_method 'threads'; choose one of multiprocessing"),
    ({"wait_for_workers": -1}, "expected wait_for_workers >= 0 seconds, got -1"),
    ({"wait_for_workers": float("inf")}, "expected wait_for_workers >= 0 seconds, got inf"),
    ({"wait_for_workers": True}, "expected wait_for_workers >= 0 seconds, got True"),
    ({"weights_refresh_seconds": -0.5}, "expected weights_refresh_seconds >= 0 seconds, got -0.5"),
    ({"weights_refresh_seconds": float("nan")}, "expected weights_refresh_seconds >= 0 seconds, got nan"),
    ({"weights_refresh_seconds": "1"}, "expected weights_refresh_seconds >= 0 seconds, got '1'"),
])
def test_inconsistent_options_are_refused_with_the_value(options, message):
    with pytest.raises(ConfigError, match=message):
        RunOptions(**options)


def test_options_are_frozen_keyword_only_and_hide_the_secret():
    options = RunOptions(secret="hunter2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.collect_timeout = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        RunOptions("redis://localhost")  # type: ignore[misc]
    assert "hunter2" not in repr(options)


def test_the_actors_signature_defaults_are_the_options_defaults():
    parameters = inspect.signature(RedisDistributedActors).parameters
    for spec in dataclasses.fields(RunOptions):
        assert parameters[spec.name].default == getattr(DEFAULTS, spec.name), spec.name


def test_actors_accept_an_options_object():
    options = RunOptions(run_name="from-options", collect_timeout=7.0, n_local_workers=1)
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, options=options)
    assert actors.run_name == "from-options"
    assert actors.options.collect_timeout == 7.0 and actors.options.actors_per_job == 2
    assert actors.n_local_workers == 1


def test_options_and_keyword_options_together_are_refused():
    with pytest.raises(ConfigError, match=r"got options= and the keyword options \['collect_timeout'\]"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0,
                               options=RunOptions(), collect_timeout=3.0)


def test_subproc_actors_refuse_options_that_name_an_external_redis():
    for external in ({"redis_url": "redis://localhost:6379/0"}, {"worker_redis_url": "redis://localhost:6379/0"}):
        with pytest.raises(ConfigError, match="always runs a private Redis"):
            SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, "fork", [0, 1],
                                     [2, 3], options=RunOptions(**external))


def test_subproc_actors_refuse_options_and_keyword_options_together():
    with pytest.raises(ConfigError, match=r"got options= and the keyword options \['collect_timeout'\]"):
        SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, "fork", [0, 1], [2, 3],
                                 options=RunOptions(), collect_timeout=3.0)


def test_local_workers_need_a_url_beside_an_injected_connection():
    connection = redis.Redis(host="127.0.0.1", port=1)  # never used: the actors refuse on construction
    with pytest.raises(ConfigError, match="n_local_workers=1 needs a URL for the workers"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, connection=connection,
                               n_local_workers=1, secret="s")


def test_actors_validate_their_options_on_construction():
    with pytest.raises(ConfigError, match="expected no_worker_timeout > 0, got 0"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, no_worker_timeout=0)


def test_the_secret_comes_from_rqrl_secret_only_when_redis_came_from_redis_url(monkeypatch):
    from rqrl.engine.options import run_secret

    monkeypatch.setenv("RQRL_SECRET", "from-the-environment")
    assert run_secret(RunOptions(), embedded=False, redis_from_environment=True) == "from-the-environment"
    assert run_secret(RunOptions(secret="given"), embedded=False, redis_from_environment=True) == "given"
    embedded = run_secret(RunOptions(), embedded=True, redis_from_environment=False)
    assert len(embedded) == 64 and embedded != "from-the-environment"  # a fresh one per embedded run
    with pytest.raises(ConfigError, match="an external Redis needs a shared secret"):
        run_secret(RunOptions(redis_url="redis://elsewhere:6379/0"), embedded=False)  # a URL given: no guessing
    monkeypatch.delenv("RQRL_SECRET")
    with pytest.raises(ConfigError, match=r"set RQRL_SECRET \(for `rqrl train`, and for a script that takes Redis"):
        run_secret(RunOptions(), embedded=False, redis_from_environment=True)


def test_no_local_workers_beside_an_embedded_redis_is_refused_at_once():
    """No worker can join a run on an embedded Redis (a private unix socket, a fresh random secret): n_local_workers=0
    there used to wait out the worker timeouts (95 s for `rqrl train --workers 0`) before NoWorkersError."""
    from rqrl import RQSampler
    from rqrl.engine.options import resolve_workers

    with pytest.raises(ConfigError, match=r"n_local_workers=0 \(--workers 0\) with an embedded Redis: no worker can"):
        resolve_workers(RunOptions(n_local_workers=0), 4, embedded=True, has_url=False)
    assert resolve_workers(RunOptions(n_local_workers=0), 4, embedded=False, has_url=True).n_local_workers == 0
    with pytest.raises(ConfigError, match="give a Redis they reach"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, n_local_workers=0)
    sampler = RQSampler(fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2, n_local_workers=0,
                        progress=False, max_episode_length=10)
    with pytest.raises(ConfigError, match="with an embedded Redis: no worker can ever join"):
        sampler.start_worker()  # refused before its embedded Redis starts
