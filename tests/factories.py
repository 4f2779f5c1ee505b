"""Builders of the objects tests make again and again: actors with small defaults, valid rollout records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rqrl import RedisDistributedActors
from rqrl.maze.records import RolloutRecord
from tests import fixtures
from tests.conftest import TEST_SECRET


def redis_actors(redis_url: str | None, run_name: str | None = None, env_factory=fixtures.make_cartpole,
                 policy: Any = None, *, n_rollout_steps: int = 16, n_actors: int = 2, batch_size: int = 2,
                 queue_out_of_sync_factor: float = 2.0, **options: Any) -> RedisDistributedActors:
    """RedisDistributedActors on ``redis_url`` with small defaults (CartPole, fixtures.mlp_policy(), 16 steps,
    2 actors, batches of 2, the test secret); ``options`` go to the constructor as they are (n_local_workers,
    actors_per_job, ...)."""
    if run_name is not None:
        options["run_name"] = run_name
    options.setdefault("secret", TEST_SECRET)  # learners no longer read RQRL_SECRET; workers get it in their env
    return RedisDistributedActors(env_factory, fixtures.mlp_policy() if policy is None else policy, n_rollout_steps,
                                  n_actors, batch_size, queue_out_of_sync_factor, redis_url=redis_url, **options)


def rollout_record(steps: int = 4, obs_size: int = 2, *, obs: Any = None, next_obs: Any = None,
                   terminated: Sequence[int] = (), final_obs_steps: Sequence[int] = (), final_obs: Any = None,
                   log_prob: float = 0.0, logits: bool = False, actor_id: int = 0, rollout_id: int = 0,
                   policy_version: int = 1, worker: str = "", continues_previous: bool = False) -> RolloutRecord:
    """A valid record of ``steps`` Box observations of ``obs_size`` (zeros unless ``obs`` is given): actions 0,
    rewards 1, ``log_prob`` at every step, terminated at the ``terminated`` steps, truncated at the
    ``final_obs_steps`` with ``final_obs`` (zeros by default), no finished episode."""
    terminated_array = np.zeros(steps, bool)
    terminated_array[list(terminated)] = True
    truncated = np.zeros(steps, bool)
    truncated[list(final_obs_steps)] = True
    final = np.zeros((len(final_obs_steps), obs_size)) if final_obs is None else final_obs
    return RolloutRecord(
        obs=np.zeros((steps, obs_size), np.float32) if obs is None else np.asarray(obs, np.float32),
        actions=np.zeros(steps, np.int64), rewards=np.ones(steps, np.float32), terminated=terminated_array,
        truncated=truncated, log_probs=np.full(steps, log_prob, np.float32),
        logits=np.zeros((steps, 2), np.float32) if logits else None,
        next_obs=np.zeros(obs_size, np.float32) if next_obs is None else np.asarray(next_obs, np.float32),
        final_obs=np.asarray(final, np.float32).reshape(-1, obs_size),
        final_obs_steps=np.asarray(final_obs_steps, np.int64), episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64), policy_version=policy_version, actor_id=actor_id,
        rollout_id=rollout_id, worker=worker, continues_previous=continues_previous)
