"""Maze's ``SubprocVectorEnv`` on gymnasium envs: one subprocess per env, stepped together.

``step(actions)`` returns ``(observations, rewards, dones, infos)`` in env-aggregated form: arrays
(or dicts of arrays) with a leading env dimension, ``dones = terminated | truncated``, and one info
dict per env that also carries ``"terminated"`` and ``"truncated"``. An env that is done is reset
at once; the observation it ended on is kept in its info (``"terminal_observation"``, Maze's and
SB3's key, and gymnasium's ``"final_observation"``/``"final_info"``). Fixed-shape observations,
actions, rewards and flags travel through one shared-memory block; the pipes carry only commands,
infos and errors.

>>> import gymnasium, numpy as np
>>> with SubprocVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 2) as envs:  # doctest: +SKIP
...     envs.seed([0, 1])
...     obs = envs.reset()
...     obs, rewards, dones, infos = envs.step(np.array([0, 1]))
...     obs.shape, rewards.shape, dones.dtype
((2, 4), (2,), dtype('bool'))
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import pickle
import select
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any, NamedTuple, Self

import cloudpickle
import gymnasium
import numpy as np
from gymnasium import spaces

from rqrl.engine.observations import Obs, map_tree, stack_obs, to_array
from rqrl.engine.observations import select as select_obs
from rqrl.engine.process import ProcessContext, exit_when_orphaned, process_context, stop_processes
from rqrl.engine.timings import protocol_timings
from rqrl.errors import ConfigError, EnvProcessDiedError, VectorEnvError
from rqrl.maze.stats import EpochStatsAggregator, LogStatsLevel, RolloutEvents, StatsReader

__all__ = ["ActorID", "EnvProcessDiedError", "SubprocVectorEnv", "VectorEnvError"]

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often a caller waiting on an env process checks that it is still alive
_ALIGN = 64
_FIXED_SHAPE_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
_STEP_FROM_SHARED_MEMORY = pickle.dumps(("step", None), pickle.HIGHEST_PROTOCOL)


@dataclass(frozen=True)
class _RemoteError:
    """What a worker sends back instead of a reply when its env raised."""

    what: str
    error: str
    traceback: str

    @classmethod
    def current(cls, what: str, error: BaseException) -> _RemoteError:
        return cls(what, f"{type(error).__name__}: {error}", traceback.format_exc())

    def raise_for(self, env_index: int) -> VectorEnvError:
        return VectorEnvError(f"env {env_index} raised {self.error} in {self.what}", env_index=env_index,
                              remote_traceback=self.traceback)


def _multiprocessing_context(start_method: str | None) -> ProcessContext:
    """Maze's default, 'forkserver' where available, else 'spawn'; an unknown method is refused."""
    if start_method is None:
        start_method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = process_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(["rqrl.maze.vector_env"])  # import rqrl (and torch) once, not per env
    return context


# ---- shared memory -------------------------------------------------------------------------------


def _leaf_specs(space: gymnasium.Space[Any]) -> Any:
    """``(shape, dtype)`` per leaf of a fixed-shape space (dicts nest), or None if a leaf has no fixed shape."""
    if isinstance(space, spaces.Dict):
        specs = {key: _leaf_specs(sub) for key, sub in space.spaces.items()}
        return specs if specs and all(spec is not None for spec in specs.values()) else None
    if isinstance(space, _FIXED_SHAPE_SPACES) and space.dtype is not None:
        return (tuple(space.shape or ()), np.dtype(space.dtype).str)
    return None


@dataclass(frozen=True)
class _Block:
    """Where one ``[n_envs, ...]`` array lives in the shared block."""

    offset: int
    shape: tuple[int, ...]
    dtype: str


class _SharedArrays:
    """Trees of ``[n_envs, ...]`` arrays in one shared-memory block, seen by the caller and every env process."""

    def __init__(self, memory: SharedMemory, blocks: dict[str, Any]):
        self.memory = memory
        self.blocks = blocks
        self.arrays: dict[str, Any] = {
            name: map_tree(lambda b: np.ndarray(b.shape, np.dtype(b.dtype), buffer=memory.buf, offset=b.offset), tree)
            for name, tree in blocks.items()
        }

    @classmethod
    def create(cls, n_envs: int, specs: dict[str, Any]) -> _SharedArrays:
        size = 0

        def place(spec: tuple[tuple[int, ...], str]) -> _Block:
            nonlocal size
            shape, dtype = (n_envs, *spec[0]), np.dtype(spec[1])
            block = _Block(size, shape, dtype.str)
            size += -(-int(np.prod(shape)) * dtype.itemsize // _ALIGN) * _ALIGN
            return block

        blocks = {name: map_tree(place, spec) for name, spec in specs.items()}
        return cls(SharedMemory(create=True, size=max(size, _ALIGN)), blocks)

    @classmethod
    def attach(cls, name: str, blocks: dict[str, Any]) -> _SharedArrays:
        return cls(SharedMemory(name=name), blocks)

    def release(self, unlink: bool) -> None:
        self.arrays = {}
        try:
            self.memory.close()
        except BufferError:  # arrays still referenced elsewhere; the mapping goes with them
            pass
        if unlink:
            try:
                self.memory.unlink()
            except FileNotFoundError:
                pass


# ---- the env process -----------------------------------------------------------------------------


def _actor_rewards_getter(env: gymnasium.Env) -> Callable[[], Any] | None:
    """A Maze env's ``get_actor_rewards`` (gymnasium wrappers do not forward it, so look beneath them)."""
    for candidate in (env, env.unwrapped):
        getter = getattr(candidate, "get_actor_rewards", None)
        if callable(getter):
            return getter
    return None


def _row(array: np.ndarray, index: int) -> Any:
    return array[index] if array.ndim == 1 else array[index].copy()


class _EnvServer:
    """Runs one env in its process: answers the caller's commands, one reply per command."""

    def __init__(self, index: int, env: gymnasium.Env, connection: multiprocessing.connection.Connection):
        self.index = index
        self.env = env
        self.connection = connection
        self.actor_rewards = _actor_rewards_getter(env)
        self.next_seed: int | None = None
        self.hold_resets = False  # True: a done env waits for the caller's reset_with (its seed), see seed()
        self.shared: _SharedArrays | None = None
        self.obs_arrays: Any = None
        self.action_arrays: Any = None

    def serve(self) -> None:
        handlers: dict[str, Callable[[Any], Any]] = {
            "step": self.step, "reset": self.reset, "seed": self.seed, "attach": self.attach,
            "reset_with": self.reset_with, "hold_resets": self.set_hold_resets,
        }
        while True:
            command, data = self.connection.recv()
            if command == "close":
                return
            try:
                reply = handlers[command](data)
            except Exception as error:
                reply = _RemoteError.current(f"{command}()", error)
            try:
                payload = pickle.dumps(reply, pickle.HIGHEST_PROTOCOL)
            except Exception as error:
                payload = pickle.dumps(_RemoteError.current(f"{command}() (pickling its reply)", error))
            self.connection.send_bytes(payload)

    def attach(self, data: tuple[str, dict[str, Any]]) -> None:
        self.shared = _SharedArrays.attach(*data)
        self.obs_arrays = self.shared.arrays.get("obs")
        self.action_arrays = self.shared.arrays.get("action")

    def seed(self, seed: int | None) -> None:
        self.next_seed = seed

    def set_hold_resets(self, hold: bool) -> None:
        self.hold_resets = hold

    def _reset(self) -> tuple[Any, dict[str, Any]]:
        seed, self.next_seed = self.next_seed, None
        return self.env.reset(seed=seed)

    def _put_obs(self, obs: Any) -> Obs | None:
        """Write the observation to shared memory, or return it for the pipe if its space has no fixed shape."""
        if self.obs_arrays is None:
            return to_array(obs)
        map_tree(lambda array, value: array.__setitem__(self.index, value), self.obs_arrays, obs)
        return None

    def reset(self, _: None) -> tuple[dict[str, Any], Obs | None, None]:
        obs, info = self._reset()
        return info, self._put_obs(obs), None

    def reset_with(self, seed: int | None) -> tuple[dict[str, Any], Obs | None, None]:
        self.next_seed = seed
        return self.reset(None)

    def step(self, action: Any) -> tuple[dict[str, Any] | None, Obs | None, Any]:
        if action is None:
            action = map_tree(lambda array: _row(array, self.index), self.action_arrays)
        obs, reward, terminated, truncated, info = self.env.step(action)
        actor_rewards = self.actor_rewards() if self.actor_rewards is not None else None
        if terminated or truncated:
            final_obs = to_array(obs)
            info = {**info, "terminal_observation": final_obs, "final_observation": final_obs, "final_info": info}
            if not self.hold_resets:  # held: the caller resets it next, with the next seed of its list
                obs, info["reset_info"] = self._reset()
        assert self.shared is not None, "attach comes first"
        arrays = self.shared.arrays
        arrays["reward"][self.index] = reward
        arrays["terminated"][self.index] = terminated
        arrays["truncated"][self.index] = truncated
        return info or None, self._put_obs(obs), actor_rewards

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            if self.shared is not None:
                self.obs_arrays = self.action_arrays = None
                self.shared.release(unlink=False)


def _worker(index: int, connection: multiprocessing.connection.Connection,
            parent_connection: multiprocessing.connection.Connection, factory: bytes, parent_pid: int) -> None:
    """Entry point of an env process: build the env, report its spaces, then serve commands until close."""
    parent_connection.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle; it closes us
    exit_when_orphaned(parent_pid)
    try:
        env = cloudpickle.loads(factory)()
        if not isinstance(env, gymnasium.Env):
            raise ConfigError(f"env_factories[{index}] must return a gymnasium.Env, got {type(env).__name__}")
        server = _EnvServer(index, env, connection)
    except Exception as error:
        connection.send(_RemoteError.current(f"env_factories[{index}]()", error))
        return
    connection.send((env.observation_space, env.action_space, server.actor_rewards is not None))
    try:
        server.serve()
    except (EOFError, OSError):  # the caller is gone
        pass
    finally:
        server.close()


# ---- the caller's side ---------------------------------------------------------------------------


class ActorID(NamedTuple):
    """Maze's actor id: the sub-step and the agent acting in it (a gymnasium env has one of each, 0 and 0)."""

    step_key: int | str
    agent_id: int


class _VectorEnvStats(EpochStatsAggregator):
    """Epoch statistics of a SubprocVectorEnv: episodes as they end; env steps and their rate are folded in
    whenever the statistics are read, so stepping adds no per-step values to the epoch."""

    def __init__(self, n_envs: int, logging_prefix: str | None = None):
        super().__init__()
        self.logging_prefix = logging_prefix
        self.returns = np.zeros(n_envs)
        self.lengths = np.zeros(n_envs, dtype=np.int64)
        self._steps = 0
        self._window_start: float | None = None
        self._window_end = 0.0

    def start_episodes(self) -> None:
        """Every env starts a fresh episode (an explicit reset): running episodes are dropped, not counted."""
        self.returns[:] = 0.0
        self.lengths[:] = 0

    def record_step(self, rewards: np.ndarray, dones: np.ndarray, started: float) -> None:
        """One vector step that began at ``started`` (perf_counter): count it, close the episodes it ended."""
        if self._window_start is None:
            self._window_start = started
        self._window_end = time.perf_counter()
        self._steps += len(rewards)
        self.returns += rewards
        self.lengths += 1
        if dones.any():
            for index in np.flatnonzero(dones):
                self.add(RolloutEvents.episode_return, self.returns[index])
                self.add(RolloutEvents.episode_length, self.lengths[index])
            self.returns[dones] = 0.0
            self.lengths[dones] = 0

    def current(self) -> dict[str, dict[str, float]]:
        if self._steps:
            elapsed = self._window_end - (self._window_start or self._window_end)
            self.add(RolloutEvents.env_steps, self._steps)
            self.add(RolloutEvents.env_steps_per_second, self._steps / max(elapsed, 1e-9))
            self._steps, self._window_start = 0, None
        return super().current()

    def clear(self) -> None:
        super().clear()
        self._steps, self._window_start = 0, None

    def reduce(self) -> dict[str, dict[str, float]]:
        stats = super().reduce()
        if self.logging_prefix is not None and stats:
            log.info("%s: %s", self.logging_prefix, stats)
        return stats


class SubprocVectorEnv(StatsReader):
    """Maze's ``SubprocVectorEnv``: each env in its own process, stepped in parallel, results stacked.

    ``env_factories`` build the gymnasium envs (in their processes; cloudpickled, so lambdas work).
    ``start_method`` is one of ``multiprocessing.get_all_start_methods()``; default 'forkserver' where
    available, else 'spawn' (with either, guard your script with ``if __name__ == "__main__":``).
    ``logging_prefix``, if given, logs each reduced epoch of statistics under that prefix.
    """

    epoch_stats: _VectorEnvStats

    def __init__(
        self,
        env_factories: Sequence[Callable[[], gymnasium.Env]],
        logging_prefix: str | None = None,
        start_method: str | None = None,
    ):
        factories = list(env_factories)
        if not factories:
            raise ConfigError("expected at least one env factory in env_factories, got none")
        for index, factory in enumerate(factories):
            if not callable(factory):
                raise ConfigError(f"env_factories[{index}] must be a callable returning a gymnasium.Env, "
                                  f"got {factory!r}")
        context = _multiprocessing_context(start_method)
        self.n_envs = len(factories)
        self.logging_prefix = logging_prefix
        self.start_method = context.get_start_method()
        self.epoch_stats = _VectorEnvStats(self.n_envs, logging_prefix)
        self.reset_infos: list[dict[str, Any]] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._connections: list[multiprocessing.connection.Connection] = []
        self._pollers: list[Any] = []  # one select.poll per pipe (POSIX): cheaper than Connection.poll per step
        self._shared: list[_SharedArrays] = []  # the finalizer's handle on the block
        self._closed = False
        self._dead: tuple[int, int | None] | None = None  # (env index, exit code) of a dead env process
        self._actor_rewards: list[Any] | None = None
        self._actor_dones = np.zeros(self.n_envs, dtype=bool)
        self.seeds: list[int | None] | None = None
        """The seed list of ``seed()``: reset() seeds env i with ``seeds[i]``, each later reset the next in turn."""
        self._next_seed_index = 0
        self._finalizer = weakref.finalize(self, _shutdown, self.processes, self._connections, self._shared)
        try:
            self._start(context, factories)
        except BaseException:
            self.close()
            raise

    def _start(self, context: ProcessContext, factories: list[Callable[[], gymnasium.Env]]) -> None:
        if os.name == "posix":
            resource_tracker.ensure_running()  # the env processes share ours, which unlinks the block once
        for index, factory in enumerate(factories):
            try:
                payload = cloudpickle.dumps(factory)
            except Exception as error:
                raise ConfigError(f"env_factories[{index}] cannot be pickled: {error}; pass a module-level "
                                  "function or a picklable callable") from error
            parent_connection, child_connection = context.Pipe(duplex=True)
            process = context.Process(
                target=_worker, args=(index, child_connection, parent_connection, payload, os.getpid()),
                name=f"rqrl-vector-env-{index}", daemon=True,
            )
            process.start()
            child_connection.close()  # only the child holds its end now: its death is an EOF here
            self.processes.append(process)
            self._connections.append(parent_connection)
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(parent_connection.fileno(), select.POLLIN)
                self._pollers.append(poller)
        handshakes = self._gather()
        self.observation_space, self.action_space, _ = handshakes[0]
        for index, (observation_space, action_space, _) in enumerate(handshakes):
            if observation_space != self.observation_space or action_space != self.action_space:
                raise ConfigError(
                    f"env {index} has spaces ({observation_space}, {action_space}) but env 0 has "
                    f"({self.observation_space}, {self.action_space}); every env must have the same spaces"
                )
        self._has_actor_rewards = all(has for _, _, has in handshakes)
        specs = {"reward": ((), "<f8"), "terminated": ((), "|b1"), "truncated": ((), "|b1")}
        for name, space in (("obs", self.observation_space), ("action", self.action_space)):
            if (spec := _leaf_specs(space)) is not None:
                specs[name] = spec
        shared = _SharedArrays.create(self.n_envs, specs)
        self._shared.append(shared)
        self._arrays = shared.arrays
        for index in range(self.n_envs):
            self._send(index, ("attach", (shared.memory.name, shared.blocks)))
        self._gather()

    # -- Maze's spaces -----------------------------------------------------------------------------

    @property
    def observation_spaces_dict(self) -> dict[int, gymnasium.Space[Any]]:
        """Maze's per-sub-step spaces: a gymnasium env has one sub-step, 0."""
        return {0: self.observation_space}

    @property
    def action_spaces_dict(self) -> dict[int, gymnasium.Space[Any]]:
        """Maze's per-sub-step action spaces: a gymnasium env has one sub-step, 0."""
        return {0: self.action_space}

    @property
    def agent_counts_dict(self) -> dict[int, int]:
        """Maze's agents per sub-step: a gymnasium env has one agent in its one sub-step."""
        return {0: 1}

    def actor_id(self) -> ActorID:
        """The actor to act next in every env (Maze steps vector envs in sync): sub-step 0, agent 0."""
        return ActorID(step_key=0, agent_id=0)

    def is_actor_done(self) -> np.ndarray:
        """Whether each env's last step ended its episode (terminated or truncated), ``[n_envs]`` bool."""
        return self._actor_dones.copy()

    def get_env_time(self) -> np.ndarray:
        """Each env's time: the steps taken in its running episode, ``[n_envs]`` (0 right after a reset)."""
        return self.epoch_stats.lengths.copy()

    # -- Maze's statistics -------------------------------------------------------------------------

    def get_stats(self, level: LogStatsLevel = LogStatsLevel.EPOCH) -> EpochStatsAggregator:
        """The aggregator of the episodes' statistics; only ``LogStatsLevel.EPOCH`` is kept, as in Maze."""
        if getattr(level, "name", None) != LogStatsLevel.EPOCH.name:
            raise ConfigError(f"expected level=LogStatsLevel.EPOCH, got {level}; a vector env keeps epoch "
                              f"statistics only")
        return self.epoch_stats

    def write_epoch_stats(self) -> None:
        """End the epoch: reduce its statistics (logged under ``logging_prefix``, if given)."""
        self.epoch_stats.reduce()

    def clear_epoch_stats(self) -> None:
        """Drop the statistics collected so far in this epoch, without reducing them."""
        self.epoch_stats.clear()

    # -- VectorEnv ---------------------------------------------------------------------------------

    def reset(self) -> Obs:
        """Reset every env and return the stacked observations; the envs' reset infos are in ``reset_infos``.
        With a seed list (``seed``), env i is seeded with ``seeds[i]``, and the list starts over."""
        self._check_usable()
        self._next_seed_index = 0
        for index in range(self.n_envs):
            self._send(index, ("reset", None) if self.seeds is None else ("reset_with", self.get_next_seed()))
        replies = self._gather()
        self.reset_infos = [info for info, _, _ in replies]
        self._actor_rewards = None
        self._actor_dones[:] = False
        self.epoch_stats.start_episodes()
        return self._observations(replies)

    def step(self, actions: Any) -> tuple[Obs, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step the environments with the given actions (an array ``[n_envs, ...]``, a dict of those for Dict
        action spaces, or a sequence of one action per env).

        Returns observations, rewards (float ``[n_envs]``), dones (bool ``[n_envs]``, terminated or
        truncated) and one info dict per env, all in env-aggregated form. Done envs are reset already:
        their info holds ``terminal_observation``. Maze's call form, a dict of one key (``{"action": array}``)
        for an action space that is no Dict, is taken as that array.
        """
        self._check_usable()
        started = time.perf_counter()
        actions = self._unwrap_maze_actions(actions)
        if "action" in self._arrays:
            self._write_actions(actions)
            for index in range(self.n_envs):
                self._send_bytes(index, _STEP_FROM_SHARED_MEMORY)
        else:
            for index, action in enumerate(self._split_actions(actions)):
                self._send(index, ("step", action))
        replies = self._gather()
        rewards = self._arrays["reward"].copy()
        terminated = self._arrays["terminated"].copy()
        truncated = self._arrays["truncated"].copy()
        dones = terminated | truncated
        infos = []
        for index, (info, _, _) in enumerate(replies):
            info = {} if info is None else info
            info["terminated"] = bool(terminated[index])
            info["truncated"] = bool(truncated[index])
            infos.append(info)
        if self._has_actor_rewards:
            self._actor_rewards = [actor_rewards for _, _, actor_rewards in replies]
        if self.seeds is not None and dones.any():
            replies = self._reset_done_envs(np.flatnonzero(dones), replies, infos)
        self._actor_dones = dones.copy()
        self.epoch_stats.record_step(rewards, dones, started)
        return self._observations(replies), rewards, dones, infos

    def _reset_done_envs(self, done: np.ndarray, replies: list[Any], infos: list[dict[str, Any]]) -> list[Any]:
        """Reset the envs that ended an episode, in env order, each with the next seed of the list."""
        for index in done:
            self._send(int(index), ("reset_with", self.get_next_seed()))
        replies = list(replies)
        for index, (reset_info, obs, _) in zip(done, self._gather([int(index) for index in done]), strict=True):
            infos[index]["reset_info"] = reset_info
            replies[index] = (replies[index][0], obs, replies[index][2])
        return replies

    def seed(self, seeds: Sequence[Any]) -> None:
        """Maze's seed list: at least one seed (a non-negative int, or None) per env. The next ``reset()``
        seeds env i with ``seeds[i]``; every reset after an episode ends takes the next seed of the list in
        turn, cycling, so the list fixes the start of every episode, not only the first."""
        seeds = list(seeds)
        if len(seeds) < self.n_envs:
            raise ConfigError(f"expected at least one seed per env: {self.n_envs} seeds for n_envs={self.n_envs}, "
                              f"got {len(seeds)} ({seeds!r})")
        for index, seed in enumerate(seeds):
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0):
                raise ConfigError(f"seeds[{index}] must be a non-negative int or None, got {seed!r}")
        self._check_usable()
        if self.seeds is None:  # from now on, done envs wait for their seed instead of resetting on their own
            for index in range(self.n_envs):
                self._send(index, ("hold_resets", True))
            self._gather()
        self.seeds = [None if seed is None else int(seed) for seed in seeds]
        self._next_seed_index = 0

    def get_next_seed(self) -> int | None:
        """The next seed of the list ``seed`` set (cycling), or None without one."""
        if self.seeds is None:
            return None
        seed = self.seeds[self._next_seed_index]
        self._next_seed_index = (self._next_seed_index + 1) % len(self.seeds)
        return seed

    def get_actor_rewards(self) -> np.ndarray | None:
        """Stack actor rewards from encapsulated environments as Maze does: each env's ``get_actor_rewards()``
        at its last step, ``[n_actors, n_envs]`` float32; None unless every env has that method (plain
        gymnasium envs do not)."""
        if not self._has_actor_rewards or self._actor_rewards is None:
            return None
        if any(rewards is None for rewards in self._actor_rewards):
            return None
        return np.stack([np.asarray(rewards) for rewards in self._actor_rewards], axis=1).astype(np.float32)

    def close(self) -> None:
        """Close every env and end its process (terminated, then killed, if it does not exit in time);
        safe to call twice."""
        self._closed = True
        self._arrays = {}
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise VectorEnvError("this SubprocVectorEnv is closed; build a new one", env_index=None)
        if self._dead is not None:
            raise EnvProcessDiedError(*self._dead)

    def _check_count(self, count: int) -> None:
        if count != self.n_envs:
            raise ConfigError(f"expected actions for {self.n_envs} envs (a leading dimension of {self.n_envs}), "
                              f"got {count}")

    def _unwrap_maze_actions(self, actions: Any) -> Any:
        """The array of a dict of one key given for an action space that is no Dict: Maze's gym wrapper puts a
        gym env's action under one key (``"action"``), so Maze code steps its vector envs with such dicts."""
        if not isinstance(actions, Mapping) or isinstance(self.action_space, spaces.Dict):
            return actions
        if len(actions) != 1:
            raise ConfigError(f"expected actions for the action space {self.action_space}: an array [n_envs, ...], "
                              f"a list of one action per env, or Maze's dict of one key ({{'action': array}}); got "
                              f"a dict of keys {sorted(map(str, actions))}")
        return next(iter(actions.values()))

    def _write_actions(self, actions: Any) -> None:
        """Copy the actions into shared memory, checking their count, shape and dtype."""
        buffers = self._arrays["action"]
        if isinstance(actions, list | tuple):
            self._check_count(len(actions))
            actions = stack_obs([to_array(action) for action in actions])
        if isinstance(buffers, Mapping) != isinstance(actions, Mapping):
            raise ConfigError(f"expected actions for the action space {self.action_space}, got {type(actions)}")

        def write(buffer: np.ndarray, value: Any) -> None:
            value = np.asarray(value)
            self._check_count(value.shape[0] if value.ndim else 0)
            try:
                np.copyto(buffer, value, casting="same_kind")
            except (TypeError, ValueError) as error:
                raise ConfigError(f"expected actions of shape {buffer.shape} and dtype {buffer.dtype} for "
                                  f"{self.action_space}, got {value.shape} {value.dtype}: {error}") from error

        try:
            map_tree(write, buffers, actions)
        except KeyError as error:
            raise ConfigError(f"actions lack key {error} of the action space {self.action_space}") from error

    def _split_actions(self, actions: Any) -> list[Any]:
        """One action per env, for action spaces without a fixed shape (sent through the pipes)."""
        if isinstance(actions, list | tuple):
            self._check_count(len(actions))
            return list(actions)
        if isinstance(actions, Mapping):
            map_tree(lambda leaf: self._check_count(len(leaf)), actions)
            return [select_obs(dict(actions), index) for index in range(self.n_envs)]
        actions = np.asarray(actions)
        self._check_count(actions.shape[0] if actions.ndim else 0)
        return list(actions)

    def _observations(self, replies: list[tuple[Any, Any, Any]]) -> Obs:
        if "obs" in self._arrays:
            return map_tree(np.copy, self._arrays["obs"])
        return stack_obs([obs for _, obs, _ in replies])

    def _died(self, index: int) -> EnvProcessDiedError:
        process = self.processes[index]
        process.join(1.0)  # reap it, for its exit code
        self._dead = (index, process.exitcode)
        return EnvProcessDiedError(index, process.exitcode)

    def _send(self, index: int, message: Any) -> None:
        self._send_bytes(index, pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def _send_bytes(self, index: int, payload: bytes) -> None:
        try:
            self._connections[index].send_bytes(payload)
        except OSError as error:
            raise self._died(index) from error

    def _receive(self, index: int) -> Any:
        """The reply of env ``index``; never waits on a dead process (EOF, or a liveness check per poll)."""
        connection, process = self._connections[index], self.processes[index]
        poller = self._pollers[index] if self._pollers else None
        try:
            while not (poller.poll(POLL_SECONDS * 1000) if poller is not None else connection.poll(POLL_SECONDS)):
                if not process.is_alive():
                    raise self._died(index)
            return connection.recv()
        except (EOFError, OSError) as error:
            raise self._died(index) from error

    def _gather(self, indices: Sequence[int] | None = None) -> list[Any]:
        """Every env's reply (or those of ``indices``) to the command just sent; the first error is raised after
        all have answered, so the pipes stay in step."""
        replies: list[Any] = []
        failure: VectorEnvError | None = None
        for index in range(self.n_envs) if indices is None else indices:
            try:
                reply = self._receive(index)
            except EnvProcessDiedError as error:
                failure = failure or error
                continue
            if isinstance(reply, _RemoteError):
                failure = failure or reply.raise_for(index)
            replies.append(reply)
        if failure is not None:
            raise failure
        return replies


def _shutdown(processes: list[multiprocessing.process.BaseProcess],
              connections: list[multiprocessing.connection.Connection], shared: list[_SharedArrays]) -> None:
    """Close the envs, end their processes and free the shared block (runs once: close() or garbage collection)."""
    for connection in connections:
        try:
            connection.send(("close", None))
        except OSError:
            pass
    deadline = time.monotonic() + protocol_timings().env_close
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    stop_processes([process for process in processes if process.is_alive()], timeout=1.0)
    for process in processes:
        if not process.is_alive():
            process.close()
    for connection in connections:
        connection.close()
    for block in shared:
        block.release(unlink=True)
