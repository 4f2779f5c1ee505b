"""Run a group of envs with one batched policy for n steps; knows nothing of Redis.

Episodes continue across consecutive rollouts of the same ``ActorGroup``. A rollout can end
with a *cut* (``cut_at_end=True``): the episodes still running are marked ``truncated`` on the
last step and the next rollout starts from fresh, deterministically seeded resets, so the same
seeds and weights give the same trajectories wherever the next rollout runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium
import numpy as np
import torch

from rqrl.engine.observations import Obs, flatten_obs, map_tree, select, to_array, to_tensor
from rqrl.engine.policy import (
    NON_FINITE_LOG_PROB_FIX,
    ActFunction,
    LogitsActFunction,
    action_range,
    actions_out_of_range,
    non_finite_rows,
)
from rqrl.engine.rewards import reward_error
from rqrl.errors import ConfigError, EnvError, PolicyError
from rqrl.maze.group_records import RolloutSteps
from rqrl.maze.records import RecordSignature, RolloutRecord, differing_arrays, record_signature

EnvFactory = Callable[[], gymnasium.Env]
SPACES_HINT = "envs must keep their observation and action spaces: fix the env factory"


def derive_seed(*parts: int) -> int:
    """A 32-bit seed derived from integers (actor seed, rollout id, ...) without collisions in practice."""
    return int(np.random.SeedSequence([int(part) for part in parts]).generate_state(1)[0])


@dataclass
class GroupRollout:
    """One ``ActorGroup.run_group``: the group's ``[T, n]`` buffers and what names them. A worker encodes them as
    one queue entry straight from the buffers (``rqrl.maze.group_records.encode_signed_steps``); ``records()`` splits
    them into one record per actor."""

    steps: RolloutSteps
    actor_ids: list[int]
    policy_version: int
    rollout_id: int
    worker: str
    continues_previous: bool

    def records(self) -> list[RolloutRecord]:
        return self.steps.records(self.actor_ids, self.policy_version, self.rollout_id, self.worker,
                                  self.continues_previous)

    @functools.cached_property
    def first_record(self) -> RolloutRecord:
        """The first actor's record: its arrays' shapes and sizes are every actor's."""
        return self.steps.record(0, self.actor_ids[0], self.policy_version, self.rollout_id, self.worker,
                                 self.continues_previous)


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
        self._action_range = action_range(self.action_space)  # checked every step: worked out once
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

    def numpy_generator(self, rollout_id: int) -> np.random.Generator:
        """The agent's numpy random stream for one rollout (``LogitsActFunction``), from (agent seeds, rollout id)."""
        return np.random.default_rng(derive_seed(*self.agent_seeds, rollout_id))

    def run(
        self, act: ActFunction, rollout_id: int, policy_version: int, cut_at_end: bool, worker: str = ""
    ) -> list[RolloutRecord]:
        """Step every env ``n_rollout_steps`` times and return one record per actor."""
        return self.run_group(act, rollout_id, policy_version, cut_at_end, worker).records()

    def run_group(
        self, act: ActFunction, rollout_id: int, policy_version: int, cut_at_end: bool, worker: str = ""
    ) -> GroupRollout:
        """Step every env ``n_rollout_steps`` times; the rollouts stay in the group's ``[T, n, ...]`` buffers.

        Everything lands in preallocated buffers; a ``LogitsActFunction`` samples in numpy.
        """
        continues_previous = self.next_rollout_id == rollout_id
        if not continues_previous:
            self.reset(rollout_id)
        n_envs, n_steps = len(self.envs), self.n_rollout_steps
        obs = map_tree(lambda first: np.empty((n_steps + 1, n_envs, *first.shape), first.dtype), self._obs[0])
        self._write_obs(obs, 0, self._obs)
        buffers: dict[str, np.ndarray] = {}
        rewards = np.zeros((n_steps, n_envs), dtype=np.float64)  # float32 in the records, checked in float64
        terminated = np.zeros((n_steps, n_envs), dtype=bool)
        truncated = np.zeros((n_steps, n_envs), dtype=bool)
        final_obs: list[list[tuple[int, Obs]]] = [[] for _ in self.envs]
        episodes: list[list[tuple[float, int]]] = [[] for _ in self.envs]
        act_numpy = act.act_numpy if isinstance(act, LogitsActFunction) else None
        rng = self.numpy_generator(rollout_id) if act_numpy is not None else None
        generator = self.generator(rollout_id) if act_numpy is None else None
        with torch.inference_mode():
            for step in range(n_steps):
                batch = torch.from_numpy(obs[step]) if isinstance(obs, np.ndarray) else to_tensor(select(obs, step))
                step_logits: np.ndarray | None
                if act_numpy is not None and rng is not None:
                    step_actions, step_log_probs, step_logits = act_numpy(batch, rng)
                else:
                    assert generator is not None
                    out = act(batch, generator)
                    step_actions = out.actions.cpu().numpy()
                    step_log_probs = out.log_probs.cpu().numpy()
                    step_logits = out.logits.cpu().numpy() if out.logits is not None else None
                self._check_action_shape(step, step_actions)
                self._store_policy_step(buffers, rollout_id, step, step_actions, step_log_probs, step_logits)
                self._step_envs(step, step_actions, obs, rewards, terminated, truncated, final_obs, episodes)
        self._check_policy_outputs(buffers["log_probs"], buffers.get("logits"))
        self._check_rewards(rewards)
        if cut_at_end:
            for index in range(n_envs):
                if not (terminated[-1, index] or truncated[-1, index]):
                    truncated[-1, index] = True
                    final_obs[index].append((n_steps - 1, select(obs, (n_steps, index))))
            self.next_rollout_id = None
        else:
            self.next_rollout_id = rollout_id + 1
        self._obs = [select(obs, (n_steps, index)) for index in range(n_envs)]
        steps = RolloutSteps(obs=obs, actions=buffers["actions"], log_probs=buffers["log_probs"],
                             logits=buffers.get("logits"), rewards=rewards.astype(np.float32), terminated=terminated,
                             truncated=truncated, final_obs=final_obs, episodes=episodes)
        rollout = GroupRollout(steps, self.actor_ids, policy_version, rollout_id, worker, continues_previous)
        self._check_spaces_kept(rollout.first_record)
        return rollout

    def _store_policy_step(self, buffers: dict[str, np.ndarray], rollout_id: int, step: int, actions: np.ndarray,
                           log_probs: np.ndarray, logits: np.ndarray | None) -> None:
        """Write one step's policy outputs into ``[T, n, ...]`` buffers, allocated from the first step's."""
        n_steps = self.n_rollout_steps
        if step == 0:
            buffers["actions"] = np.empty((n_steps, *actions.shape), actions.dtype)
            buffers["log_probs"] = np.empty((n_steps, *log_probs.shape), np.float32)
            if logits is not None:
                buffers["logits"] = np.empty((n_steps, *logits.shape), np.float32)
        stored = buffers.get("logits")
        if (actions.shape != buffers["actions"].shape[1:] or actions.dtype != buffers["actions"].dtype
                or log_probs.shape != buffers["log_probs"].shape[1:] or (stored is None) != (logits is None)
                or (stored is not None and logits is not None and logits.shape != stored.shape[1:])):
            raise EnvError(f"actions, log-probs or logits changed shape, dtype or presence at step {step} of rollout "
                           f"{rollout_id} (actions now {actions.dtype}{list(actions.shape)}); {SPACES_HINT}")
        buffers["actions"][step] = actions
        buffers["log_probs"][step] = log_probs
        if stored is not None:
            stored[step] = logits

    def _check_action_shape(self, step: int, actions: np.ndarray) -> None:
        """Refuse actions that do not fit the action space before an env sees them: their shape, and for integer
        spaces their range (an env fails on one out of range with gymnasium's bare assertion)."""
        if self._action_shape is not None and actions.shape != self._action_shape:
            raise PolicyError(
                f"the policy returned actions of shape {actions.shape} at step {step} of the rollout; actors "
                f"{self.actor_ids} need {self._action_shape} (one action of shape {self._action_shape[1:]} per env "
                f"for action space {self.action_space}): fix the policy's act() or forward()"
            )
        if (wrong := actions_out_of_range(self.action_space, actions, self._action_range)) is not None:
            raise PolicyError(f"the policy returned {wrong} at step {step} of the rollout of actors {self.actor_ids}: "
                              f"fix the policy's act() or forward()")

    def _check_policy_outputs(self, log_probs: np.ndarray, logits: np.ndarray | None) -> None:
        """Refuse what the learner must not train on: log-probs that are not finite numbers, NaN logits (-inf
        is a masked action). One pass over the rollout's ``[T, n]`` buffers, not one per step; the error names
        the first step at fault, as a check per step would have."""
        bad_log_probs = non_finite_rows(log_probs)
        nan_logits = np.zeros_like(bad_log_probs) if logits is None else np.isnan(logits).reshape(
            len(logits), -1).any(axis=1)
        if not (bad_log_probs.any() or nan_logits.any()):
            return
        step = int(np.argmax(bad_log_probs | nan_logits))
        if bad_log_probs[step]:
            raise PolicyError(
                f"the policy returned log-probs {log_probs[step].tolist()} at step {step} of the rollout for actors "
                f"{self.actor_ids}; {NON_FINITE_LOG_PROB_FIX}"
            )
        raise PolicyError(
            f"the policy returned NaN logits at step {step} of the rollout for actors {self.actor_ids}: check "
            f"the policy's weights (a diverged update?) and the observations it got"
        )

    def _write_obs(self, obs: Obs, row: int, observations: Sequence[Obs]) -> None:
        """Stack one observation per env into ``obs[row]``, refusing a changed shape or dtype."""
        try:
            if isinstance(obs, np.ndarray):  # Box or Discrete observations: no tree walk
                target = obs[row]
                shape, dtype = target.shape[1:], target.dtype
                if all(type(one) is np.ndarray and one.shape == shape and one.dtype == dtype
                       for one in observations):
                    target[...] = observations  # what np.stack(casting="no") would do, at a third of its cost
                else:
                    np.stack(observations, out=target, casting="no")  # type: ignore[call-overload]
            else:
                map_tree(lambda out, *leaves: np.stack(leaves, out=out[row], casting="no"), obs, *observations)
        except (ValueError, TypeError, KeyError) as error:  # another shape, dtype or set of keys
            found = {actor: [(np.shape(value), np.asarray(value).dtype.name)
                             for value in flatten_obs(to_array(one), "obs").values()]
                     for actor, one in zip(self.actor_ids, observations, strict=True)}
            expected = [(array.shape[2:], array.dtype.name) for array in flatten_obs(obs, "obs").values()]
            raise EnvError(f"observations changed shape or dtype at step {row} of the rollout ({found}, expected "
                           f"{expected}); {SPACES_HINT}") from error

    def _check_spaces_kept(self, record: RolloutRecord) -> None:
        """Refuse envs whose observations or actions change shape or dtype during a run (``record``: the first
        actor's; one rollout's records all come out of the same buffers, so one signature holds for all)."""
        signature = record_signature(record)
        if self._signature is None:
            self._signature = signature
        elif signature != self._signature:
            changed = differing_arrays(signature, self._signature)
            before = [self._signature.get(name) for name in changed]
            after = [signature.get(name) for name in changed]
            raise EnvError(
                f"actors {self.actor_ids}' {changed} changed shape or dtype during the run (from {before} to "
                f"{after}); {SPACES_HINT}"
            )

    def _step_envs(self, step: int, actions: np.ndarray, obs: Obs, rewards: np.ndarray, terminated: np.ndarray,
                   truncated: np.ndarray, final_obs: list[list[tuple[int, Obs]]],
                   episodes: list[list[tuple[float, int]]]) -> None:
        """Step each env once; the bookkeeping is vectorized over the group, and ended episodes restart."""
        results = [env.step(action) for env, action in zip(self.envs, actions, strict=True)]
        try:
            stepped_obs, reward_list, terminated_list, truncated_list, _ = zip(*results, strict=True)
        except (ValueError, TypeError) as error:  # other lengths, or not sequences
            shapes = sorted({str(len(result)) if isinstance(result, (tuple, list)) else type(result).__name__
                             for result in results})
            raise EnvError(
                f"actors {self.actor_ids}' envs returned step results of lengths or types {shapes} at step {step} of "
                f"the rollout; gymnasium envs return (obs, reward, terminated, truncated, info): convert an old gym "
                f"env with shimmy's GymV21CompatibilityV0, or return the five values") from error
        observations: list[object] = list(stepped_obs)
        try:  # rows written straight from the tuples: no per-step arrays (checked once per rollout, or below)
            rewards[step] = reward_list
        except (TypeError, ValueError):  # one-element arrays, or worse: converted one by one
            rewards[step] = self._scalar_rewards(reward_list, step)
        try:
            terminated[step] = terminated_list
            truncated[step] = truncated_list
        except (TypeError, ValueError) as error:
            raise EnvError(f"actors {self.actor_ids}' envs returned terminated {list(terminated_list)} and truncated "
                           f"{list(truncated_list)} at step {step} of the rollout; each must be one bool per "
                           f"step") from error
        self._returns += rewards[step]
        self._lengths += 1
        if any(terminated_list) or any(truncated_list):
            term, trunc = terminated[step], truncated[step]
            trunc &= ~term  # a view: the row itself
            done = term | trunc
            for index in np.flatnonzero(done).tolist():
                if trunc[index]:
                    final_obs[index].append((step, map_tree(np.array, observations[index])))  # a copy
                episodes[index].append((float(self._returns[index]), int(self._lengths[index])))
                self._returns[index] = 0.0
                self._lengths[index] = 0
                observations[index] = self.envs[index].reset()[0]
        self._write_obs(obs, step + 1, observations)  # type: ignore[arg-type]

    def _scalar_rewards(self, rewards: tuple[object, ...], step: int) -> np.ndarray:
        """One step's rewards that numpy could not take as a row (one-element arrays, text): each as its number;
        EnvError naming the actor for anything that is not one number."""
        values = []
        for actor, reward in zip(self.actor_ids, rewards, strict=True):
            try:
                array = np.asarray(reward, dtype=np.float64)
            except (TypeError, ValueError):
                array = np.zeros(0)
            if array.size != 1:
                raise EnvError(f"actor {actor}'s env returned reward {reward!r} at step {step} of the rollout; rewards "
                               f"must be single numbers: fix the env or wrap it to sum or pick one")
            values.append(array.item())
        return np.array(values, dtype=np.float64)

    def _check_rewards(self, rewards: np.ndarray) -> None:
        """Refuse a rollout whose rewards are not all finite numbers (one pass over ``[T, n]``), naming the first
        step and actor at fault."""
        finite = np.isfinite(rewards)
        if finite.all():
            return
        step, index = (int(i) for i in np.argwhere(~finite)[0])
        raise reward_error(f"actor {self.actor_ids[index]}", rewards[step, index], step, "the rollout")

    def close(self) -> None:
        for env in self.envs:
            env.close()
