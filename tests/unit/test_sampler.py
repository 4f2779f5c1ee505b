"""MultiprocessingSampler's parts that need no Redis: call forms, validation before anything starts, the
round-robin prefix obtain_samples returns."""

from __future__ import annotations

import io

import gymnasium
import numpy as np
import pytest
import tqdm

from rqrl import (
    ConfigError,
    EnvSpec,
    EpisodeBatch,
    LocalSampler,
    MultiprocessingSampler,
    NewEnvUpdate,
    PolicyError,
    RQSampler,
    StepType,
    WorkerFactory,
)
from rqrl.garage.sampler import _ClampedBar, _Order
from tests import fixtures


def one_episode(length: int) -> EpisodeBatch:
    spec = EnvSpec(gymnasium.spaces.Box(-1, 1, (1,)), gymnasium.spaces.Discrete(2))
    step_types = np.array([StepType.MID] * (length - 1) + [StepType.TERMINAL])
    return EpisodeBatch(spec, {}, np.zeros((length, 1)), np.zeros((1, 1)), np.zeros(length, np.int64),
                        np.ones(length), {}, {}, step_types, np.array([length]))


def test_both_call_forms_build_the_same_factory_and_nothing_starts():
    factory = WorkerFactory(max_episode_length=7, n_workers=3, seed=2)
    old = MultiprocessingSampler(factory, fixtures.VersionPolicy(), fixtures.make_echo_env())
    new = RQSampler(fixtures.VersionPolicy(), fixtures.make_echo_env(), max_episode_length=7, n_workers=3, seed=2)
    keyword = RQSampler(agents=fixtures.VersionPolicy(), envs=fixtures.make_echo_env(), worker_factory=factory)
    for sampler in (old, new, keyword):
        assert sampler.n_workers == 3 and sampler._factory._seed == 2 and sampler._factory._max_episode_length == 7
        assert sampler.total_env_steps == 0 and not sampler._started
        sampler.shutdown_worker()  # harmless before start
    with pytest.raises(TypeError, match="both"):
        RQSampler(factory, fixtures.VersionPolicy(), fixtures.make_echo_env(), worker_factory=factory)


def test_bad_arguments_fail_before_anything_starts():
    with pytest.raises(ValueError, match="Length of list"):
        RQSampler(fixtures.VersionPolicy(), [fixtures.make_echo_env()] * 2, max_episode_length=5, n_workers=3)
    with pytest.raises(TypeError, match="Unknown environment update type"):
        RQSampler(fixtures.VersionPolicy(), 3.5, max_episode_length=5, n_workers=3)
    sampler = RQSampler(fixtures.VersionPolicy(), fixtures.make_echo_env(), max_episode_length=5, n_workers=2)
    with pytest.raises(ValueError, match="num_samples"):
        sampler.obtain_samples(0, 0, None)
    with pytest.raises(ValueError, match="Length of list"):
        sampler.obtain_exact_episodes(1, [None] * 3)
    assert not sampler._started


def test_samples_order_is_the_shortest_round_robin_prefix():
    order = _Order("samples", 10, 2)
    episodes = {(0, 0): one_episode(3), (1, 0): one_episode(4), (0, 1): one_episode(2)}
    assert not order.complete(episodes)  # 9 steps so far, (1, 1) missing
    episodes[(0, 2)] = one_episode(5)  # arrives early: not part of the prefix
    assert not order.complete(episodes)
    episodes[(1, 1)] = one_episode(1)
    assert order.complete(episodes)
    assert order.chosen(episodes) == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_exact_order_is_worker_order():
    order = _Order("exact", 2, 2)
    episodes = {(1, 1): one_episode(1), (0, 0): one_episode(1), (1, 0): one_episode(1)}
    assert not order.complete(episodes)
    episodes[(0, 1)] = one_episode(1)
    assert order.complete(episodes) and order.chosen(episodes) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_the_call_bar_stops_at_its_total_and_writes_nothing_into_a_file(tmp_path, monkeypatch):
    sampler = MultiprocessingSampler(WorkerFactory(max_episode_length=10, n_workers=2), agents=fixtures.mlp_policy(),
                                     envs=fixtures.make_cartpole())
    log = (tmp_path / "stderr.txt").open("w")
    monkeypatch.setattr("sys.stderr", log)  # a job's log file: no terminal
    with sampler._progress_bar("samples", 100) as bar:
        bar.update(70)
        bar.update(70)  # the last episode brings more steps than the call needs
    log.close()
    assert (tmp_path / "stderr.txt").read_text() == ""
    shown = _ClampedBar(tqdm.tqdm(total=100, file=io.StringIO()))
    shown.update(70)
    shown.update(70)
    assert shown.bar.n == 100, "the bar overshot its total"


def test_a_zero_argument_env_factory_is_refused_at_construction_with_the_way_to_pass_it():
    for sampler_class in (RQSampler, LocalSampler):
        with pytest.raises(ConfigError, match=r"make_cartpole is a callable that cannot take one argument.*"
                                              r"rqrl\.NewEnvUpdate\(make_cartpole\)"):
            sampler_class(fixtures.mlp_policy(), fixtures.make_cartpole, max_episode_length=50, n_workers=2)
    wrapped = LocalSampler(fixtures.mlp_policy(), NewEnvUpdate(fixtures.make_cartpole), max_episode_length=5,
                           n_workers=2)
    assert int(wrapped.obtain_samples(0, 5, None).lengths.sum()) >= 5


def test_the_local_sampler_refuses_nan_weights_instead_of_returning_nan_log_probs():
    policy = fixtures.mlp_policy()
    sampler = LocalSampler(policy, fixtures.make_cartpole(), max_episode_length=50, n_workers=2, seed=0)
    nan = {key: value * float("nan") for key, value in policy.state_dict().items()}
    with pytest.raises(PolicyError, match=r"log-prob nan at step 0 of an episode of logical worker 0"):
        sampler.obtain_samples(0, 100, nan)
