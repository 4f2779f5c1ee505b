"""garage's worker side of sampling: ``WorkerFactory``, the ``EnvUpdate`` family and ``LogicalWorker``.

A ``LogicalWorker`` is one of garage's ``n_workers`` (DefaultWorker semantics): it owns an env, an agent copy
and its RNG streams, and turns them into one-episode ``EpisodeBatch``es. It knows nothing of Redis: the
sampler decides where each logical worker runs, and several can share a process.

Updates are applied only between episodes: ``update_agent``/``update_env`` change what the *next*
``start_episode`` uses, and ``rollout()`` runs one whole episode, so an episode never mixes two agent versions
as long as callers update between rollouts (the sampler does).

>>> import gymnasium, torch
>>> factory = WorkerFactory(seed=1, max_episode_length=5, n_workers=2)
>>> worker = factory(1)
>>> worker.update_agent(torch.nn.Linear(4, 2))
>>> worker.update_env(gymnasium.make("CartPole-v1"))
>>> batch = worker.rollout()
>>> int(batch.lengths[0]) <= 5
True
"""

from __future__ import annotations

import inspect
import os
import random
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, runtime_checkable

import gymnasium
import numpy as np
import torch

from rqrl.engine.observations import map_tree, stack_obs, to_array, to_tensor
from rqrl.engine.policy import (
    NON_FINITE_LOG_PROB_FIX,
    ActFunction,
    LogitsActFunction,
    as_state_dict,
    check_state_dict,
    make_act_function,
    non_finite_rows,
)
from rqrl.engine.rewards import finite_reward
from rqrl.errors import ConfigError, EnvError, PolicyError
from rqrl.garage.episodes import EnvSpec, EpisodeBatch, StepType

T = TypeVar("T")

_ENV_STREAM, _EPISODE_STREAM = 1, 2  # SeedSequence tags: seeds derived for new envs and for reseeded episodes

LANES = 8
"""Rows of every CPU forward of a ModuleAgent: worker ``w`` always computes its logits in row ``w % lanes``
(``lanes = min(LANES, n_workers)``) of a ``lanes``-row batch, alone or stepped together with others
(``rqrl.garage.lockstep``). A matrix product's row depends on the batch's shape and the row's place in it, never on
the other rows, so this makes batched and unbatched steps give bit-identical episodes."""


@runtime_checkable
class GaragePolicy(Protocol):
    """garage's agent protocol, as a LogicalWorker calls it."""

    def get_action(self, observation: Any) -> tuple[Any, dict[str, Any]]:
        """One action and its agent info for one observation."""
        ...

    def reset(self) -> None:
        """Called at the start of every episode."""
        ...


def identity(value: T) -> T:
    """The default ``preprocess`` of ``prepare_worker_messages``."""
    return value


class WorkerFactory:
    """Builds the logical workers of a sampler and spreads per-worker messages (garage's WorkerFactory).

    Keyword-only. ``n_workers`` is the number of logical workers (default: the CPU count), whatever the
    number of processes that run them; worker ``i`` is seeded with ``seed + i``.
    """

    def __init__(self, *, max_episode_length: int, is_tf_worker: bool = False, seed: int | None = None,
                 n_workers: int | None = None, worker_class: type[LogicalWorker] | None = None,
                 worker_args: Mapping[str, Any] | None = None) -> None:
        if is_tf_worker:
            raise ConfigError("is_tf_worker=True asks for TensorFlow sessions, which rqrl does not run; use a torch "
                              "or numpy policy and leave is_tf_worker=False")
        if isinstance(max_episode_length, bool) or not isinstance(max_episode_length, int) or max_episode_length < 1:
            raise ConfigError(f"expected max_episode_length >= 1 (an int), got {max_episode_length!r}")
        n_workers = os.cpu_count() or 1 if n_workers is None else n_workers
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            raise ConfigError(f"expected n_workers >= 1 (an int), got {n_workers!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigError(f"expected seed to be an int >= 0 (gymnasium's resets need one) or None, got {seed!r}")
        self.n_workers = n_workers
        self._seed = seed
        self._max_episode_length = max_episode_length
        self._worker_class = LogicalWorker if worker_class is None else worker_class
        self._worker_args = dict(worker_args or {})

    def prepare_worker_messages(self, objs: Any, preprocess: Callable[[Any], Any] = identity) -> list[Any]:
        """One message per worker: a ``list`` is spread (its length must be n_workers); anything else, tuples
        included, goes whole to every worker. ``preprocess`` is applied to each message."""
        if type(objs) is list:
            if len(objs) != self.n_workers:
                raise ValueError(f"Length of list doesn't match number of workers: got a list of {len(objs)}, "
                                 f"expected {self.n_workers} (one per worker), or pass a non-list to send it to all")
            return [preprocess(obj) for obj in objs]
        return [preprocess(objs) for _ in range(self.n_workers)]

    def __call__(self, worker_number: int) -> LogicalWorker:
        """Build logical worker ``worker_number`` (0 <= worker_number < n_workers)."""
        if worker_number >= self.n_workers:
            raise ValueError(f"Worker number is too big: {worker_number} >= n_workers={self.n_workers}")
        if worker_number < 0:
            raise ValueError(f"Worker number must be >= 0, got {worker_number}")
        worker = self._worker_class(worker_number=worker_number, seed=self._seed,
                                    max_episode_length=self._max_episode_length, **self._worker_args)
        worker.lanes = min(LANES, self.n_workers)
        return worker


# --- env updates -------------------------------------------------------------------------------------------

class EnvUpdate:
    """A picklable recipe applied to a worker's env between episodes: ``update(old_env) -> env``."""

    def __call__(self, old_env: gymnasium.Env[Any, Any] | None = None) -> gymnasium.Env[Any, Any]:
        """Return the env to use from now on (``old_env`` may be reused, or closed and replaced)."""
        raise NotImplementedError


class NewEnvUpdate(EnvUpdate):
    """Close the old env and build a new one with ``env_constructor()``."""

    def __init__(self, env_constructor: Callable[[], gymnasium.Env[Any, Any]]) -> None:
        self._env_constructor = env_constructor

    def __call__(self, old_env: gymnasium.Env[Any, Any] | None = None) -> gymnasium.Env[Any, Any]:
        if old_env is not None:
            old_env.close()
        return self._env_constructor()


class SetTaskUpdate(EnvUpdate):
    """Call ``set_task(task)`` on an env whose unwrapped type is exactly ``env_type``; otherwise close it and
    build ``env_type()``, set its task, and wrap it with ``wrapper_constructor(env, task)`` if given."""

    def __init__(self, env_type: type, task: Any,
                 wrapper_constructor: Callable[[Any, Any], gymnasium.Env[Any, Any]] | None = None) -> None:
        if not isinstance(env_type, type):
            raise ValueError(f"env_type should be a type, not {env_type!r}")
        self._env_type = env_type
        self._task = task
        self._wrapper_cons = wrapper_constructor

    def _make_env(self) -> gymnasium.Env[Any, Any]:
        env = self._env_type()
        env.set_task(self._task)
        if self._wrapper_cons is not None:
            env = self._wrapper_cons(env, self._task)
        return env

    def __call__(self, old_env: gymnasium.Env[Any, Any] | None = None) -> gymnasium.Env[Any, Any]:
        if old_env is None:
            return self._make_env()
        unwrapped = getattr(old_env, "unwrapped", old_env)
        if type(unwrapped) is not self._env_type:
            warnings.warn(f"SetTaskUpdate is closing an env of type {type(unwrapped).__name__} to build a "
                          f"{self._env_type.__name__}. This may indicate a very slow TaskSampler setup.",
                          stacklevel=2)
            old_env.close()
            return self._make_env()
        target: Any = old_env if hasattr(old_env, "set_task") else unwrapped
        target.set_task(self._task)
        return old_env


class ExistingEnvUpdate(EnvUpdate):
    """Replace the env with ``env`` itself (it travels pickled: slow for big envs, hence the warning)."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        self._env = env

    def __call__(self, old_env: gymnasium.Env[Any, Any] | None = None) -> gymnasium.Env[Any, Any]:
        return self._env

    def __getstate__(self) -> dict[str, Any]:
        warnings.warn("ExistingEnvUpdate is generally not the most efficient method of transmitting "
                      "environments to other processes.", stacklevel=2)
        return self.__dict__


def check_env_update(env_update: Any) -> None:
    """Raise TypeError unless ``env_update`` is None, a gymnasium env, an EnvUpdate or a callable old_env -> env
    (so a sampler can refuse it before sending it anywhere); ConfigError for a zero-argument env factory."""
    if env_update is None or isinstance(env_update, gymnasium.Env | EnvUpdate):
        return
    if callable(env_update):
        if not _takes_old_env(env_update):
            name = getattr(env_update, "__qualname__", None) or repr(env_update)
            raise ConfigError(
                f"env {name} is a callable that cannot take one argument, but a callable env or env_update is read as "
                f"garage's update old_env -> env (called with the worker's current env, None at first); pass an "
                f"env (e.g. gymnasium.make(...)), or wrap the factory as rqrl.NewEnvUpdate({name})")
        return
    raise TypeError(f"Unknown environment update type: {type(env_update).__name__}; expected None, a "
                    f"gymnasium.Env, an rqrl.EnvUpdate or a callable old_env -> env")


def _takes_old_env(update: Callable[..., Any]) -> bool:
    """Whether ``update`` can be called with one positional argument, the old env (True if its signature is
    unreadable, as for some builtins: the call itself then says)."""
    try:
        signature = inspect.signature(update)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(None)
    except TypeError:
        return False
    return True


def apply_env_update(old_env: gymnasium.Env[Any, Any] | None,
                     env_update: Any) -> tuple[gymnasium.Env[Any, Any] | None, bool]:
    """``(env, changed)`` after ``env_update``; an env given in place of an update replaces (and closes) the
    old one."""
    check_env_update(env_update)
    if env_update is None:
        return old_env, False
    if isinstance(env_update, gymnasium.Env):
        if old_env is not None and old_env is not env_update:
            old_env.close()
        return env_update, True
    env = env_update(old_env)
    if not isinstance(env, gymnasium.Env):
        raise EnvError(f"env update {env_update!r} returned {type(env).__name__}, expected a gymnasium.Env")
    return env, True


# --- agents ------------------------------------------------------------------------------------------------

class LaneDistribution:
    """The categorical distributions of a ``lanes``-row forward's logits, computed once for all rows;
    ``sample(slot, rng)`` draws like ``rqrl.engine.policy.sample_logits`` on row ``slot`` (inverse CDF, one draw)."""

    def __init__(self, logits: np.ndarray) -> None:
        self.shifted = logits - logits.max(axis=-1, keepdims=True)
        self.cdf = np.cumsum(np.exp(self.shifted), axis=-1)
        self.total = self.cdf[:, -1]  # >= 1: the largest weight is exp(0)
        self.log_total = np.log(self.total)

    def sample(self, slot: int, rng: np.random.Generator) -> tuple[int, dict[str, Any]]:
        """An action for row ``slot`` and its ``{"log_prob": ...}``; u < total strictly (see sample_logits)."""
        u = np.float64(rng.random()) * np.float64(self.total[slot])
        action = int((self.cdf[slot] <= u).sum())
        return action, {"log_prob": np.float32(self.shifted[slot, action] - self.log_total[slot])}


class ModuleAgent:
    """A plain ``torch.nn.Module`` giving logits for a Discrete action space, as a garage policy: actions are
    sampled with ``rng`` in numpy (a CPU module), else with ``generator`` in torch; ``agent_info`` holds the
    action's ``log_prob``; params are its state dict."""

    def __init__(self, module: torch.nn.Module, generator: torch.Generator,
                 rng: np.random.Generator | None = None, *, slot: int = 0, lanes: int = 1) -> None:
        self.module = module
        self.generator = generator
        self.rng = rng
        self.slot, self.lanes = slot, lanes
        self._act: ActFunction | None = None
        self._action_space: gymnasium.Space[Any] | None = None
        self._device: torch.device | None = None
        self._lane_buffer: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        """The module's device (of its first parameter; CPU without any), looked up once."""
        if self._device is None:
            self._device = next((parameter.device for parameter in self.module.parameters()), torch.device("cpu"))
        return self._device

    @property
    def numpy_sampling(self) -> bool:
        """Whether actions are sampled in numpy from ``rng`` after a CPU forward (what ``rqrl.garage.lockstep``
        batches)."""
        return self.rng is not None and self.device.type == "cpu" and isinstance(self._act, LogitsActFunction)

    def lane_logits(self, rows: Mapping[int, np.ndarray]) -> np.ndarray:
        """Logits ``[lanes, n]`` of one forward of a ``lanes``-row batch holding ``rows[slot]`` in row ``slot``
        (zeros elsewhere); see ``LANES``."""
        assert isinstance(self._act, LogitsActFunction)
        first = next(iter(rows.values()))
        buffer = self._lane_buffer
        if buffer is None or buffer.shape[1:] != first.shape:
            buffer = self._lane_buffer = torch.zeros((self.lanes, *first.shape), dtype=torch.float32)
        else:
            buffer.zero_()
        for slot, row in rows.items():
            buffer[slot] = torch.from_numpy(np.asarray(row, dtype=np.float32))
        with torch.no_grad():
            return self._act.logits(buffer).numpy()

    def bind(self, action_space: gymnasium.Space[Any]) -> None:
        """Use ``action_space`` (the env's) to read the logits; PolicyError if it is not Discrete."""
        if action_space is not self._action_space:
            self._act = make_act_function(self.module, action_space)
            self._action_space = action_space

    def reset(self) -> None:
        """Nothing to reset: the module is stateless."""

    def get_actions(self, observations: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions and ``{"log_prob": ...}`` for a batch of observations (a leading batch axis)."""
        if self._act is None:
            raise PolicyError("ModuleAgent.bind(action_space) must be called before it acts")
        device = self.device
        if isinstance(observations, np.ndarray):  # the common case, without the tree walk
            batch = observations.astype(np.float32) if observations.dtype == np.float64 else observations
            obs: Any = torch.as_tensor(batch, device=device)
        else:
            batch = map_tree(lambda array: np.asarray(array, np.float32) if np.asarray(array).dtype == np.float64
                             else np.asarray(array), observations)
            obs = map_tree(lambda tensor: tensor.to(device), to_tensor(batch))
        with torch.no_grad():
            if self.rng is not None and device.type == "cpu" and isinstance(self._act, LogitsActFunction):
                actions, log_probs, _ = self._act.act_numpy(obs, self.rng)
                return actions.astype(np.int64), {"log_prob": log_probs.astype(np.float32)}
            step = self._act(obs, self.generator)
        return step.actions.cpu().numpy(), {"log_prob": step.log_probs.cpu().numpy()}

    def get_action(self, observation: Any) -> tuple[Any, dict[str, Any]]:
        """One action (an int for Discrete) and its ``{"log_prob": ...}``."""
        observation = to_array(observation)
        if isinstance(observation, np.ndarray) and self.numpy_sampling:
            return self.sample(LaneDistribution(self.lane_logits({self.slot: observation})))
        batch = observation[None] if isinstance(observation, np.ndarray) else map_tree(
            lambda array: np.asarray(array)[None], observation)
        actions, infos = self.get_actions(batch)
        return actions[0].item(), {key: value[0] for key, value in infos.items()}

    def sample(self, lanes: LaneDistribution) -> tuple[int, dict[str, Any]]:
        """An action drawn with ``rng`` from this worker's row of ``lanes``, and its ``{"log_prob": ...}``."""
        assert self.rng is not None
        return lanes.sample(self.slot, self.rng)

    def get_param_values(self) -> dict[str, torch.Tensor]:
        """The module's state dict (detached copies)."""
        return {key: value.detach().clone() for key, value in self.module.state_dict().items()}

    def set_param_values(self, params: Any) -> None:
        """Load a state dict whose keys and shapes match the module's."""
        state_dict = as_state_dict(params)
        check_state_dict(dict(self.module.state_dict()), state_dict)
        self.module.load_state_dict(state_dict)
        self._device = None


# --- the logical worker ------------------------------------------------------------------------------------

class LogicalWorker:
    """One garage worker (DefaultWorker semantics) on gymnasium envs; see the module docstring.

    With a ``seed``, everything random in it derives from ``seed + worker_number``: the first reset of each env
    it is given (and its spaces' RNGs), a torch generator for ModuleAgent sampling, and private states of
    ``random``, ``np.random`` and torch's global RNG, swapped in while it runs (garage seeds the globals), so
    logical workers sharing a process do not disturb each other's streams.
    """

    def __init__(self, *, seed: int | None, max_episode_length: int, worker_number: int) -> None:
        self._seed = seed
        self._max_episode_length = max_episode_length
        self._worker_number = worker_number
        self.agent: Any = None
        self.env: gymnasium.Env[Any, Any] | None = None
        self._worker_seed = None if seed is None else seed + worker_number
        self._envs_seen = 0
        self._pending_reset_seed: int | None = None
        self.lanes = 1
        """Rows of a ModuleAgent's forward (see ``LANES``); the WorkerFactory sets ``min(LANES, n_workers)``."""
        self.generator = torch.Generator()
        self.numpy_rng = np.random.default_rng()  # ModuleAgent's sampling stream; seeded in place below
        # private random/np.random/torch global states, or the seed they are derived from when first swapped in
        self._global_states: tuple[Any, Any, torch.Tensor] | int | None = None
        if self._worker_seed is None:
            self.generator.seed()
        else:
            self._seed_streams(self._worker_seed)
        self._in_own_rngs = False
        self._prev_obs: Any = None
        self._clear_episode()

    @property
    def seed(self) -> int | None:
        """``seed + worker_number``, or None for an unseeded worker."""
        return self._worker_seed

    @property
    def worker_number(self) -> int:
        """This worker's index among the sampler's n_workers."""
        return self._worker_number

    def __getstate__(self) -> dict[str, Any]:
        raise ValueError("Workers are not pickleable. Please pickle the WorkerFactory instead.")

    # --- updates (between episodes) ---

    def update_agent(self, agent_update: Any) -> None:
        """dict/tuple/ndarray: new parameters for the agent; None: no change; anything else becomes the agent
        (a plain torch.nn.Module is wrapped in a ModuleAgent sampling with this worker's generator)."""
        if self._prev_obs is not None:
            raise PolicyError(f"update_agent called in the middle of an episode of logical worker "
                              f"{self._worker_number}; updates apply between episodes: step_episode() until it "
                              f"returns True first")
        if isinstance(agent_update, dict | tuple | np.ndarray):
            if self.agent is None:
                raise PolicyError("update_agent got parameters, but this worker has no agent yet; send the policy "
                                  "object first")
            self.agent.set_param_values(agent_update)
        elif agent_update is not None:
            if isinstance(agent_update, torch.nn.Module) and not hasattr(agent_update, "get_action"):
                agent_update = ModuleAgent(agent_update, self.generator, self.numpy_rng,
                                           slot=self._worker_number % self.lanes, lanes=self.lanes)
            elif not isinstance(agent_update, GaragePolicy):
                raise PolicyError(f"expected a policy with get_action(obs) and reset() (garage's protocol) or a "
                                  f"torch.nn.Module giving logits, got {type(agent_update).__name__}")
            self.agent = agent_update

    def update_env(self, env_update: Any) -> None:
        """None: no change; a gymnasium env replaces the current one; an EnvUpdate or a callable old_env -> env
        gives the env to use. A new env's first reset is seeded (see the class docstring)."""
        if self._prev_obs is not None and env_update is not None:
            raise EnvError(f"update_env called in the middle of an episode of logical worker {self._worker_number}; "
                           f"updates apply between episodes: step_episode() until it returns True first")
        env, changed = apply_env_update(self.env, env_update)
        if changed and env is not None and env is not self.env:
            self._new_env(env)
        self.env = env

    def _new_env(self, env: gymnasium.Env[Any, Any] | None) -> None:
        if env is not None and self._worker_seed is not None:
            seed = self._worker_seed if self._envs_seen == 0 else self._derived_seed(_ENV_STREAM, self._envs_seen)
            self._pending_reset_seed = seed
            env.action_space.seed(seed)
            env.observation_space.seed(seed)
        self._envs_seen += 1

    def reseed(self, episode_index: int) -> None:
        """Make the next episode depend only on (seed + worker_number, episode_index), wherever this worker runs
        and whatever it ran before: seeds the next reset, the env's spaces and all of this worker's RNG streams.
        ``reseed(0)`` restores a fresh worker's state. ConfigError for an unseeded worker."""
        if self._worker_seed is None:
            raise ConfigError(f"logical worker {self._worker_number} has no seed to derive episode "
                              f"{episode_index}'s seeds from; give the WorkerFactory a seed")
        if episode_index < 0:
            raise ConfigError(f"expected episode_index >= 0, got {episode_index}")
        seed = self._worker_seed if episode_index == 0 else self._derived_seed(_EPISODE_STREAM, episode_index)
        self._seed_streams(seed)
        self._pending_reset_seed = seed
        if self.env is not None:
            self.env.action_space.seed(seed)
            self.env.observation_space.seed(seed)

    def _derived_seed(self, stream: int, index: int) -> int:
        assert self._worker_seed is not None
        entropy = [self._worker_seed % 2**64, stream, index]
        return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])

    def _seed_streams(self, seed: int) -> None:
        """Seed the torch generator and this worker's private ``random``/``np.random``/torch global states (those
        lazily: they are built from ``seed`` when first swapped in, which an episode that never swaps skips)."""
        self.generator.manual_seed(seed)
        self.numpy_rng.bit_generator.state = np.random.PCG64(seed).state
        self._global_states = seed

    def _private_global_states(self) -> tuple[Any, Any, torch.Tensor] | None:
        states = self._global_states
        if isinstance(states, int):
            saved = global_rng_states()
            random.seed(states)
            np.random.seed(states % 2**32)
            torch.default_generator.manual_seed(states)  # CPU only: the caller's CUDA streams are left alone
            states = self._global_states = global_rng_states()
            set_global_rng_states(saved)
        return states

    # --- episodes ---

    def start_episode(self) -> None:
        """Reset the env (seeded on a new env's first reset) and the agent."""
        with self._own_rngs():
            self._start_episode()

    def step_episode(self) -> bool:
        """Take one step; True when the episode is over (terminated, truncated, or max_episode_length)."""
        with self._own_rngs():
            return self._step_episode()

    def collect_episode(self) -> EpisodeBatch:
        """The finished episode(s) since the last collect, as one EpisodeBatch."""
        env = self._require_env()
        if not self._lengths:
            raise EnvError("collect_episode called before an episode finished; call rollout() or step_episode() "
                           "until it returns True")
        try:
            batch = EpisodeBatch(
                env_spec=EnvSpec(env.observation_space, env.action_space, self._max_episode_length),
                episode_infos=_stack_infos(self._episode_infos),
                observations=stack_obs(self._observations),
                last_observations=stack_obs(self._last_observations),
                actions=stack_obs([to_array(action) for action in self._actions]),
                rewards=np.asarray(self._rewards, dtype=np.float64),
                env_infos=_stack_infos(self._env_infos),
                agent_infos=self._checked_agent_infos(),
                step_types=np.asarray(self._step_types, dtype=np.uint8),
                lengths=np.asarray(self._lengths, dtype=np.int64))
        finally:
            self._clear_episode()
        return batch

    def _checked_agent_infos(self) -> dict[str, Any]:
        """The collected steps' agent infos, stacked; PolicyError if their ``log_prob`` holds a number that is not
        finite (the Maze actors' check: a sampler must not return what a learner would train on as data)."""
        infos = _stack_infos(self._agent_infos)
        log_probs = infos.get("log_prob")
        if not isinstance(log_probs, np.ndarray) or log_probs.dtype.kind != "f" or log_probs.ndim == 0:
            return infos
        bad = non_finite_rows(log_probs)
        if not bad.any():
            return infos
        step = int(np.argmax(bad))
        ends = np.cumsum(self._lengths)
        episode_start = int(ends[ends <= step].max(initial=0))  # steps are counted within their episode
        raise PolicyError(
            f"the policy returned log-prob {log_probs[step].tolist()} at step {step - episode_start} of an episode "
            f"of logical worker {self._worker_number}; {NON_FINITE_LOG_PROB_FIX}")

    def rollout(self, on_step: Callable[[], None] | None = None) -> EpisodeBatch:
        """Run one whole episode under the current agent and env, and return it; ``on_step()`` after each step
        (the sampler's job keeps its lease alive with it through long episodes). An exception, from the env, the
        agent or ``on_step`` (a job whose call is over), leaves no half-collected episode behind."""
        with self._own_rngs():
            try:
                self._start_episode()
                while not self._step_episode():
                    if on_step is not None:
                        on_step()
            except BaseException:
                self._clear_episode()
                raise
        return self.collect_episode()

    def shutdown(self) -> None:
        """Close the env."""
        if self.env is not None:
            self.env.close()

    def _start_episode(self) -> None:
        env = self._require_env()
        if self.agent is None:
            raise PolicyError(f"logical worker {self._worker_number} has no agent; call update_agent(policy) first")
        if isinstance(self.agent, ModuleAgent):
            self.agent.bind(env.action_space)
        obs, info = env.reset(seed=self._pending_reset_seed)
        self._pending_reset_seed = None
        self._episode_infos.append(_info_arrays(info))
        self.agent.reset()
        self._prev_obs = to_array(obs)
        self._episode_length = 0

    def _step_episode(self) -> bool:
        if self._prev_obs is None:
            raise EnvError("step_episode called outside an episode; call start_episode() first")
        return self._step_with(*self.agent.get_action(self._prev_obs))

    def _step_with(self, action: Any, agent_info: Mapping[str, Any]) -> bool:
        """Take ``action`` (the agent's, for ``self._prev_obs``) and record the step; True when the episode is over."""
        env = self._require_env()
        obs, reward, terminated, truncated, info = env.step(action)
        self._episode_length += 1
        step_type = StepType.get_step_type(self._episode_length, self._max_episode_length, bool(terminated),
                                           bool(truncated))
        self._observations.append(self._prev_obs)
        self._actions.append(action)
        self._rewards.append(finite_reward(reward, f"worker {self._worker_number}", self._episode_length - 1,
                                           "its episode"))
        self._env_infos.append(_info_arrays(info, self._env_infos[0] if self._env_infos else None, "env info"))
        self._agent_infos.append(_info_arrays(agent_info, self._agent_infos[0] if self._agent_infos else None,
                                              "agent info"))
        self._step_types.append(step_type)
        self._prev_obs = to_array(obs)
        if step_type in (StepType.TERMINAL, StepType.TIMEOUT):
            self._lengths.append(self._episode_length)
            self._last_observations.append(self._prev_obs)
            self._prev_obs = None
            return True
        return False

    def _require_env(self) -> gymnasium.Env[Any, Any]:
        if self.env is None:
            raise EnvError(f"logical worker {self._worker_number} has no env; call update_env(env) first")
        return self.env

    def _clear_episode(self) -> None:
        self._prev_obs = None
        self._episode_length = 0
        self._observations: list[Any] = []
        self._actions: list[Any] = []
        self._rewards: list[float] = []
        self._env_infos: list[dict[str, Any]] = []
        self._agent_infos: list[dict[str, Any]] = []
        self._episode_infos: list[dict[str, Any]] = []
        self._step_types: list[StepType] = []
        self._lengths: list[int] = []
        self._last_observations: list[Any] = []

    @contextmanager
    def _own_rngs(self) -> Iterator[None]:
        if self._global_states is None or self._in_own_rngs:
            yield
            return
        private = self._private_global_states()
        assert private is not None
        saved = global_rng_states()
        set_global_rng_states(private)
        self._in_own_rngs = True
        try:
            yield
        finally:
            self._in_own_rngs = False
            self._global_states = global_rng_states()
            set_global_rng_states(saved)


def global_rng_states() -> tuple[Any, Any, torch.Tensor]:
    """The process's ``random``, ``np.random`` and torch (CPU) global RNG states."""
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def set_global_rng_states(states: tuple[Any, Any, torch.Tensor]) -> None:
    """Restore states from ``global_rng_states()``."""
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _stack_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    return stack_obs(infos) if infos and infos[0] else {}  # type: ignore[return-value]


def _info_arrays(info: Mapping[str, Any], first: Mapping[str, Any] | None = None,
                 what: str = "reset info") -> dict[str, Any]:
    """``info`` with array leaves; EnvError if its keys differ from the episode's first step's."""
    if not isinstance(info, Mapping):
        raise PolicyError(f"expected the {what} to be a dict, got {type(info).__name__}")
    if not info and not first:
        return {}
    arrays = {key: map_tree(np.asarray, value) for key, value in info.items()}
    if first is not None and set(arrays) != set(first):
        raise EnvError(f"{what} keys changed within an episode: the first step had {sorted(first)}, this step has "
                       f"{sorted(arrays)}; return the same keys at every step")
    return arrays
