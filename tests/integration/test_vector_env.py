"""SubprocVectorEnv with real env processes and real gymnasium envs (Maze's vector-env test intents, ported).

The tests here run in-process; those that start processes are in tests/processes/test_vector_env.py.
"""

from __future__ import annotations

import multiprocessing
import time

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from rqrl.errors import ConfigError
from rqrl.maze.vector_env import SubprocVectorEnv

pytestmark = pytest.mark.timeout(60)


# ---- envs (module level: the env processes import them by name) ----------------------------------


class CountdownEnv(gymnasium.Env):
    """Terminates after ``length`` steps (or truncates, with ``truncate=True``); the observation is the step
    count, the reward 1 per step; ``explode_at`` makes step number ``explode_at`` raise."""

    observation_space = spaces.Box(0, 1000, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 3, truncate: bool = False, explode_at: int | None = None, delay: float = 0.0):
        self.length, self.truncate, self.explode_at, self.delay = length, truncate, explode_at, delay
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {"reset_by": "CountdownEnv"}

    def step(self, action):
        self.t += 1
        if self.t == self.explode_at:
            explode_in_step(self.t)
        time.sleep(self.delay)
        done = self.t >= self.length
        return np.array([self.t], np.float32), 1.0, done and not self.truncate, done and self.truncate, {
            "action": int(action)}


def explode_in_step(t: int) -> None:
    raise RuntimeError(f"the env exploded at step {t}")


def make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


# ---- helpers --------------------------------------------------------------------------------------


def our_children() -> list[multiprocessing.process.BaseProcess]:
    return [child for child in multiprocessing.active_children() if child.name.startswith("rqrl-vector-env")]


# ---- reset / step ---------------------------------------------------------------------------------


def test_unknown_start_method_and_bad_factories_are_refused():
    with pytest.raises(ConfigError, match=r"get_all_start_methods\(\)") as error:
        SubprocVectorEnv([make_cartpole], start_method="threads")
    assert "threads" in str(error.value) and "spawn" in str(error.value)
    with pytest.raises(ConfigError, match="at least one env factory"):
        SubprocVectorEnv([])
    with pytest.raises(ConfigError, match=r"env_factories\[1\]"):
        SubprocVectorEnv([make_cartpole, "CartPole-v1"])
    assert our_children() == []


# ---- seeding --------------------------------------------------------------------------------------


# ---- auto-reset, stats, actor rewards -------------------------------------------------------------


# ---- bad actions, errors, dead processes, close ---------------------------------------------------


# ---- benchmark smoke ------------------------------------------------------------------------------
