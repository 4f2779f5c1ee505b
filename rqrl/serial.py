"""Actors in the learner's own process on a gymnasium SyncVectorEnv: no Redis, no workers.

For debugging a learner step by step (like Sample Factory's serial mode) and as the
single-process baseline in benchmarks. Every rollout uses the latest weights, so the policy lag
is always 0, and the same seeds give the same run.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rqrl.actors import DistributedActors
from rqrl.errors import ConfigError, RqrlError
from rqrl.observations import select, to_tensor
from rqrl.policy import check_state_dict, make_act_function, state_dict_of
from rqrl.records import CollectedOutputs, RolloutRecord, batch_records
from rqrl.rollout import EnvFactory, RolloutSteps, derive_seed
from rqrl.run_config import check_seeds
from rqrl.stats import RolloutEvents


class SerialDistributedActors(DistributedActors):
    """All actors stepped together in this process; each collect_outputs returns ``n_actors`` rollouts."""

    def __init__(self, env_factory: EnvFactory, policy: Any, n_rollout_steps: int, n_actors: int, batch_size: int,
                 actor_env_seeds: Sequence[int] | None = None, actor_agent_seeds: Sequence[int] | None = None):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size)
        if batch_size != n_actors:
            raise ConfigError(
                f"SerialDistributedActors steps all actors at once: expected batch_size == n_actors "
                f"({n_actors}), got {batch_size}"
            )
        self.actor_env_seeds = check_seeds("actor_env_seeds", actor_env_seeds, n_actors, 0)
        self.actor_agent_seeds = check_seeds("actor_agent_seeds", actor_agent_seeds, n_actors, 1_000_000)
        self.actor_policy = copy.deepcopy(policy)
        self._policy_state = state_dict_of(policy)
        self.policy_version = 0
        self.envs: SyncVectorEnv | None = None
        self._rollout_id = 0

    def start(self) -> None:
        self.envs = SyncVectorEnv([self.env_factory] * self.n_actors, autoreset_mode=AutoresetMode.SAME_STEP)
        self._act = make_act_function(self.actor_policy, self.envs.single_action_space)
        self._obs, _ = self.envs.reset(seed=[derive_seed(seed, 0) for seed in self.actor_env_seeds])
        self._returns = np.zeros(self.n_actors)
        self._lengths = np.zeros(self.n_actors, dtype=np.int64)
        self._last_collect = time.monotonic()

    def stop(self) -> None:
        if self.envs is not None:
            self.envs.close()
            self.envs = None

    def broadcast_updated_policy(self, state_dict: dict) -> None:
        check_state_dict(self._policy_state, dict(state_dict))
        self.actor_policy.load_state_dict(state_dict)
        self.policy_version += 1

    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        if self.envs is None:
            raise RqrlError("call start() before collect_outputs()")
        if self.policy_version == 0:
            raise RqrlError("call broadcast_updated_policy() before collect_outputs()")
        started = time.perf_counter()
        steps, n = self.n_rollout_steps, self.n_actors
        generator = torch.Generator().manual_seed(derive_seed(*self.actor_agent_seeds, self._rollout_id))
        obs_steps, actions, log_probs, logits = [], [], [], []
        rewards = np.zeros((steps, n), np.float32)
        terminated = np.zeros((steps, n), bool)
        truncated = np.zeros((steps, n), bool)
        final_obs: list[list[tuple[int, Any]]] = [[] for _ in range(n)]
        episodes: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        with torch.inference_mode():
            for step in range(steps):
                obs_steps.append(self._obs)
                out = self._act(to_tensor(self._obs), generator)
                actions.append(out.actions.numpy())
                log_probs.append(out.log_probs.numpy())
                if out.logits is not None:
                    logits.append(out.logits.numpy())
                self._obs, reward, term, trunc, info = self.envs.step(actions[-1])
                rewards[step], terminated[step], truncated[step] = reward, term, trunc & ~term
                self._returns += reward
                self._lengths += 1
                for index in np.flatnonzero(term | trunc):
                    if trunc[index] and not term[index]:
                        final_obs[index].append((step, select(info["final_obs"], index)))
                    episodes[index].append((float(self._returns[index]), int(self._lengths[index])))
                    self._returns[index], self._lengths[index] = 0.0, 0
        steps_taken = RolloutSteps(obs=obs_steps, actions=actions, log_probs=log_probs, logits=logits,
                                   rewards=rewards, terminated=terminated, truncated=truncated, final_obs=final_obs,
                                   episodes=episodes)
        next_obs = [select(self._obs, index) for index in range(n)]
        records = steps_taken.records(range(n), next_obs, self.policy_version, self._rollout_id, "serial",
                                      continues_previous=self._rollout_id > 0)
        self._rollout_id += 1
        batch = batch_records(records, learner_device)
        self._record_stats(records, time.perf_counter() - started)
        return CollectedOutputs(batch, 0, 0, time.perf_counter() - started)

    def _record_stats(self, records: list[RolloutRecord], dequeue_time: float) -> None:
        now = time.monotonic()
        steps = sum(record.n_steps for record in records)
        elapsed, self._last_collect = now - self._last_collect, now
        for record in records:
            self.epoch_stats.add(RolloutEvents.episode_return, record.episode_returns)
            self.epoch_stats.add(RolloutEvents.episode_length, record.episode_lengths)
        self.epoch_stats.add(RolloutEvents.policy_lag, [0] * len(records))
        self.epoch_stats.add(RolloutEvents.env_steps, steps)
        self.epoch_stats.add(RolloutEvents.env_steps_per_second, steps / max(elapsed, 1e-9))
        self.epoch_stats.add(RolloutEvents.queue_size, 0)
        self.epoch_stats.add(RolloutEvents.dequeue_time, dequeue_time)
