"""Run a group of envs with one batched policy for n steps; knows nothing of Redis.

Episodes continue across consecutive rollouts of the same ``ActorGroup``. A rollout can end
with a *cut* (``cut_at_end=True``): the episodes still running are marked ``truncated`` on the
last step and the next rollout starts from fresh, deterministically seeded resets, so the same
seeds and weights give the same trajectories wherever the next rollout runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import SupportsFloat

import gymnasium
import numpy as np
import torch

from rqrl.errors import ConfigError, EnvError, PolicyError

# stack_obs, to_array and to_tensor are re-exported (rqrl.actors imports them from rollout)
from rqrl.observations import Obs, empty_like_batch, flatten_obs, select
from rqrl.observations import stack_obs as stack_obs
from rqrl.observations import to_array as to_array
from rqrl.observations import to_tensor as to_tensor
from rqrl.policy import ActFunction
from rqrl.records import RecordSignature, RolloutRecord, differing_arrays, record_signature

EnvFactory = Callable[[], gymnasium.Env]
SPACES_HINT = "envs must keep their observation and action spaces: fix the env factory"


def derive_seed(*parts: int) -> int:
    """A 32-bit seed derived from integers (actor seed, rollout id, ...) without collisions in practice."""
    return int(np.random.SeedSequence([int(part) for part in parts]).generate_state(1)[0])


@dataclass
class RolloutSteps:
    """What stepping ``n`` envs for ``T`` steps collected, before it is split into one record per actor.

    ``obs``/``actions``/``log_probs``/``logits`` are lists over steps of ``[n, ...]`` batches;
    ``rewards``/``terminated``/``truncated`` are ``[T, n]``; ``final_obs[i]`` lists ``(step, obs)``
    of env i's truncations and ``episodes[i]`` its finished ``(return, length)``.
    """

    obs: list[Obs]
    actions: list[np.ndarray]
    log_probs: list[np.ndarray]
    logits: list[np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: list[list[tuple[int, Obs]]]
    episodes: list[list[tuple[float, int]]]

    def records(self, actor_ids: Sequence[int], next_obs: Sequence[Obs], policy_version: int, rollout_id: int,
                worker: str, continues_previous: bool) -> list[RolloutRecord]:
        stacked_obs = stack_obs(self.obs)
        return [
            RolloutRecord(
                obs=select(stacked_obs, (slice(None), index)),
                actions=np.stack([a[index] for a in self.actions]),
                rewards=self.rewards[:, index].copy(),
                terminated=self.terminated[:, index].copy(),
                truncated=self.truncated[:, index].copy(),
                log_probs=np.stack([lp[index] for lp in self.log_probs]).astype(np.float32),
                logits=np.stack([lg[index] for lg in self.logits]).astype(np.float32) if self.logits else None,
                next_obs=next_obs[index],
                final_obs=(stack_obs([o for _, o in self.final_obs[index]]) if self.final_obs[index]
                           else empty_like_batch(next_obs[index])),
                final_obs_steps=np.array([s for s, _ in self.final_obs[index]], dtype=np.int64),
                episode_returns=np.array([r for r, _ in self.episodes[index]], dtype=np.float64),
                episode_lengths=np.array([n for _, n in self.episodes[index]], dtype=np.int64),
                policy_version=policy_version,
                actor_id=actor_id,
                rollout_id=rollout_id,
                worker=worker,
                continues_previous=continues_previous,
            )
            for index, actor_id in enumerate(actor_ids)
        ]


class ActorGroup:
    """The envs of a few actors, stepped together so one policy call serves them all."""

    def __init__(
        self,
        env_factory: EnvFactory,
        actor_ids: Sequence[int],
        env_seeds: Sequence[int],
        agent_seeds: Sequence[int],
        n_rollout_steps: int,
    ):
        if not (len(actor_ids) == len(env_seeds) == len(agent_seeds) >= 1):
            raise ConfigError("expected one env seed and one agent seed per actor of the group")
        self.actor_ids = list(actor_ids)
        self.env_seeds = list(env_seeds)
        self.agent_seeds = list(agent_seeds)
        self.n_rollout_steps = n_rollout_steps
        self.envs = [env_factory() for _ in self.actor_ids]
        for env in self.envs:
            if not isinstance(env, gymnasium.Env):
                raise ConfigError(f"env_factory must return a gymnasium.Env, got {type(env).__name__}")
        self.action_space = self.envs[0].action_space
        space_shape = getattr(self.action_space, "shape", None)
        self._action_shape = None if space_shape is None else (len(self.envs), *space_shape)
        self.next_rollout_id: int | None = None
        self._signature: RecordSignature | None = None
        self._obs: list[Obs] = []
        self._returns = np.zeros(len(self.envs))
        self._lengths = np.zeros(len(self.envs), dtype=np.int64)

    def reset(self, rollout_id: int) -> None:
        """Start fresh episodes, seeded by (env seed, rollout id): reproducible wherever it runs."""
        self._obs = [
            to_array(env.reset(seed=derive_seed(seed, rollout_id))[0])
            for env, seed in zip(self.envs, self.env_seeds, strict=True)
        ]
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self.next_rollout_id = rollout_id

    def generator(self, rollout_id: int) -> torch.Generator:
        """The agent's random stream for one rollout, from (agent seeds, rollout id)."""
        return torch.Generator().manual_seed(derive_seed(*self.agent_seeds, rollout_id))

    def run(
        self, act: ActFunction, rollout_id: int, policy_version: int, cut_at_end: bool, worker: str = ""
    ) -> list[RolloutRecord]:
        """Step every env ``n_rollout_steps`` times and return one record per actor."""
        continues_previous = self.next_rollout_id == rollout_id
        if not continues_previous:
            self.reset(rollout_id)
        generator = self.generator(rollout_id)
        n_envs, n_steps = len(self.envs), self.n_rollout_steps
        obs_steps: list[Obs] = []
        actions, log_probs, logits = [], [], []
        rewards = np.zeros((n_steps, n_envs), dtype=np.float32)
        terminated = np.zeros((n_steps, n_envs), dtype=bool)
        truncated = np.zeros((n_steps, n_envs), dtype=bool)
        final_obs: list[list[tuple[int, Obs]]] = [[] for _ in self.envs]
        episodes: list[list[tuple[float, int]]] = [[] for _ in self.envs]
        with torch.inference_mode():
            for step in range(n_steps):
                batch = self._stack_current_obs(step)
                obs_steps.append(batch)
                out = act(to_tensor(batch), generator)
                step_actions = out.actions.cpu().numpy()
                step_log_probs = out.log_probs.cpu().numpy()
                step_logits = out.logits.cpu().numpy() if out.logits is not None else None
                self._check_policy_step(step, step_actions, step_log_probs, step_logits)
                actions.append(step_actions)
                log_probs.append(step_log_probs)
                if step_logits is not None:
                    logits.append(step_logits)
                for index, env in enumerate(self.envs):
                    obs, reward, term, trunc, _ = env.step(step_actions[index])
                    self._step_bookkeeping(index, step, obs, reward, term, trunc, rewards, terminated, truncated,
                                           final_obs, episodes)
        if cut_at_end:
            for index in range(n_envs):
                if not (terminated[-1, index] or truncated[-1, index]):
                    truncated[-1, index] = True
                    final_obs[index].append((n_steps - 1, self._obs[index]))
            self.next_rollout_id = None
        else:
            self.next_rollout_id = rollout_id + 1
        steps = RolloutSteps(obs=obs_steps, actions=actions, log_probs=log_probs, logits=logits, rewards=rewards,
                             terminated=terminated, truncated=truncated, final_obs=final_obs, episodes=episodes)
        try:
            records = steps.records(self.actor_ids, self._obs, policy_version, rollout_id, worker, continues_previous)
        except ValueError as error:  # arrays of different shapes across steps
            raise EnvError(f"observations or actions changed shape during rollout {rollout_id}; {SPACES_HINT}") \
                from error
        self._check_spaces_kept(records)
        return records

    def _check_policy_step(self, step: int, actions: np.ndarray, log_probs: np.ndarray,
                           logits: np.ndarray | None) -> None:
        """Refuse what the learner must not train on: actions that do not fit the action space, log-probs
        that are not finite numbers, NaN logits (-inf is a masked action). One pass over [n] per step."""
        if self._action_shape is not None and actions.shape != self._action_shape:
            raise PolicyError(
                f"the policy returned actions of shape {actions.shape} at step {step} of the rollout; actors "
                f"{self.actor_ids} need {self._action_shape} (one action of shape {self._action_shape[1:]} per env "
                f"for action space {self.action_space}): fix the policy's act() or forward()"
            )
        if not np.isfinite(log_probs).all():
            raise PolicyError(
                f"the policy returned log-probs {log_probs.tolist()} at step {step} of the rollout for actors "
                f"{self.actor_ids}; expected finite numbers: check the policy (NaN weights after an "
                f"update, NaN observations, sampling an action of probability 0)"
            )
        if logits is not None and np.isnan(logits).any():
            raise PolicyError(
                f"the policy returned NaN logits at step {step} of the rollout for actors {self.actor_ids}: check "
                f"the policy's weights (a diverged update?) and the observations it got"
            )

    def _stack_current_obs(self, step: int) -> Obs:
        try:
            return stack_obs(self._obs)
        except ValueError as error:  # observations of different shapes
            shapes = {actor: [np.shape(value) for value in flatten_obs(obs, "obs").values()]
                      for actor, obs in zip(self.actor_ids, self._obs, strict=True)}
            raise EnvError(f"observations changed shape at step {step} of the rollout ({shapes}); {SPACES_HINT}") \
                from error

    def _check_spaces_kept(self, records: list[RolloutRecord]) -> None:
        """Refuse envs whose observations or actions change shape or dtype during a run."""
        for record in records:
            signature = record_signature(record)
            if self._signature is None:
                self._signature = signature
            elif signature != self._signature:
                changed = differing_arrays(signature, self._signature)
                before = [self._signature.get(name) for name in changed]
                after = [signature.get(name) for name in changed]
                raise EnvError(
                    f"actor {record.actor_id}'s {changed} changed shape or dtype during the run (from {before} to "
                    f"{after}); {SPACES_HINT}"
                )

    def _step_bookkeeping(self, index: int, step: int, env_obs: object, reward: SupportsFloat, term: bool,
                          trunc: bool, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                          final_obs: list[list[tuple[int, Obs]]], episodes: list[list[tuple[float, int]]]) -> None:
        obs = to_array(env_obs)
        if not math.isfinite(reward):
            raise EnvError(
                f"actor {self.actor_ids[index]}'s env returned reward {reward} at step {step} of the rollout; "
                f"rewards must be finite numbers: fix the env or wrap it to clip or replace them"
            )
        rewards[step, index] = reward
        terminated[step, index] = term
        truncated[step, index] = trunc and not term
        self._returns[index] += reward
        self._lengths[index] += 1
        if term or trunc:
            if trunc and not term:
                final_obs[index].append((step, obs))
            episodes[index].append((float(self._returns[index]), int(self._lengths[index])))
            self._returns[index] = 0.0
            self._lengths[index] = 0
            obs = to_array(self.envs[index].reset()[0])
        self._obs[index] = obs

    def close(self) -> None:
        for env in self.envs:
            env.close()
