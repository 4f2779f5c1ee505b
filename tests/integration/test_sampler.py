"""MultiprocessingSampler / RQSampler against a real Redis and real worker processes (garage's sampler tests,
spec §9, on gymnasium envs; plus staleness, seeding across process counts, failures and kills).

The tests here run in-process; those that start processes are in tests/processes/test_sampler.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from rqrl import (
    ActorFailedError,
    ConfigError,
    NoWorkersError,
    RQSampler,
)
from rqrl.engine.rq_safety import rollout_queue
from tests import fixtures
from tests.conftest import TEST_SECRET
from tests.in_process import obtain_in_process, work_burst
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(120)


def make_sampler(redis_url, agents, envs, **options) -> RQSampler:
    """An RQSampler on the test Redis with one local worker process (fork) unless asked otherwise, no bar."""
    options.setdefault("secret", TEST_SECRET)
    options.setdefault("n_local_workers", 1)
    options.setdefault("start_method", "fork")
    options.setdefault("progress", False)
    options.setdefault("max_episode_length", 100)
    return RQSampler(agents, envs, redis_url=redis_url, **options)


def test_no_worker_gives_no_workers_error_within_the_timeout(connection, redis_url):
    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2,
                      n_local_workers=0, no_worker_timeout=1.0) as sampler:
        started = time.monotonic()
        with pytest.raises(NoWorkersError, match="rqrl worker"):
            sampler.obtain_exact_episodes(1, None)
        assert time.monotonic() - started < 30


def test_without_a_factory_or_max_episode_length_it_is_a_type_error():
    with pytest.raises(TypeError, match="Must construct a sampler from WorkerFactory or parameters"):
        RQSampler(fixtures.VersionPolicy(), fixtures.make_echo_env())
    with pytest.raises(TypeError, match="missing"):
        RQSampler(fixtures.VersionPolicy(), max_episode_length=5)
    with pytest.raises(ConfigError, match="is_tf_worker"):
        RQSampler(fixtures.VersionPolicy(), fixtures.make_echo_env(), max_episode_length=5, is_tf_worker=True)


def test_a_garage_script_is_configured_by_redis_url_and_rqrl_secret_alone(connection, redis_url, monkeypatch):
    """garage's MultiprocessingSampler takes no secret: with Redis from REDIS_URL, RQRL_SECRET signs the run."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    with RQSampler(fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2, max_episode_length=100,
                   n_local_workers=0, no_worker_timeout=0.5, progress=False) as sampler:
        with pytest.raises(NoWorkersError):  # the run started on REDIS_URL's Redis, signed: it only lacks workers
            sampler.obtain_exact_episodes(1, None)
        assert sampler.redis_url == redis_url
    monkeypatch.delenv("RQRL_SECRET")
    with RQSampler(fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2, max_episode_length=100,
                   n_local_workers=0, progress=False) as sampler:
        with pytest.raises(ConfigError, match="a script that takes Redis from REDIS_URL"):
            sampler.obtain_exact_episodes(1, None)


def test_nan_weights_reach_the_caller_as_the_workers_policy_error(connection, redis_url):
    """The job (run in-process) refuses to push episodes sampled under NaN weights; the call raises its error."""
    policy = fixtures.mlp_policy()
    nan = {key: value * float("nan") for key, value in policy.state_dict().items()}
    with make_sampler(redis_url, policy, fixtures.make_cartpole(), n_workers=2, n_local_workers=0,
                      no_worker_timeout=60) as sampler:
        sampler.start_worker()
        raised: list[BaseException] = []
        call = threading.Thread(target=lambda: _record_error(raised, sampler.obtain_samples, 0, 100, nan), daemon=True)
        call.start()
        queue = rollout_queue(sampler.config.queue_name, connection)
        wait_until(lambda: queue.count == len(sampler.config.actor_groups), 10, message="the call's jobs enqueued")
        work_burst(connection, (sampler.config.queue_name,))
        call.join(30)
    assert len(raised) == 1 and isinstance(raised[0], ActorFailedError), raised
    assert "PolicyError: the policy returned log-prob nan at step 0" in str(raised[0])


def _record_error(errors: list[BaseException], function, *args) -> None:
    """Call ``function(*args)`` and keep what it raises (a thread's exception, for the test to read)."""
    try:
        function(*args)
    except BaseException as error:  # noqa: BLE001 - the test asserts on whatever it is
        errors.append(error)


def test_a_run_rqrl_stop_removed_between_calls_stops_the_sampler_instead_of_being_stored_again(connection,
                                                                                                 redis_url):
    """A sampler beats its heartbeat only during calls: training longer than learner_timeout between two calls
    looks like a dead learner, and `rqrl stop` then removes the run. The next call raised nothing and stored the
    run again; now the stop flag `rqrl stop` leaves behind stops it."""
    from rqrl import RunStoppedError
    from tests.cli_runner import invoke

    with make_sampler(redis_url, fixtures.VersionPolicy(1), fixtures.make_echo_env(), n_workers=2,
                      n_local_workers=0) as sampler:
        sampler.start_worker()
        obtain_in_process(connection, sampler, 2)
        connection.delete(sampler.keys.learner_deadline)  # the sampler trains between calls: its deadline passed
        result = invoke("stop", sampler.config.run_name, "--redis-url", redis_url, "--wait", "1")
        assert result.exit_code == 0 and "no live learner" in result.output, result.output
        assert 0 < connection.ttl(sampler.keys.stopped) <= 24 * 3600
        with pytest.raises(RunStoppedError, match="stopped from outside this sampler"):
            sampler.obtain_exact_episodes(1, None)
        assert not connection.exists(sampler.keys.config), "the stopped run was stored again"

