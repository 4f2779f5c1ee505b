"""Envs, networks and agents for the SEED trainer's tests; importable by its actor and server processes."""

from __future__ import annotations

import itertools
import time

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from rqrl.seed.agent import Agent, AgentConfig


class MaskedEnv(gymnasium.Env):
    """Three actions, of which only ``legal`` is allowed (``info["action_mask"]``); the observation is the
    step count; episodes are truncated after ``length`` steps; reward 1 per step."""

    observation_space = spaces.Box(0, 1e6, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, legal: int = 2, length: int = 10):
        self.legal, self.length, self.count = legal, length, 0
        self.actions: list[int] = []

    def _info(self) -> dict:
        mask = np.zeros(3, bool)
        mask[self.legal] = True
        return {"action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([0.0], np.float32), self._info()

    def step(self, action):
        self.actions.append(int(action))
        self.count += 1
        return np.array([self.count], np.float32), 1.0, False, self.count >= self.length, self._info()


class ExplodingEnv(MaskedEnv):
    """A MaskedEnv whose step raises after ``after`` steps (each new env counts from 0)."""

    def __init__(self, after: int = 5):
        super().__init__()
        self.after = after

    def step(self, action):
        if len(self.actions) >= self.after:
            raise RuntimeError("ExplodingEnv exploded as the test asked")
        return super().step(action)


def make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


def make_misspelt_env() -> gymnasium.Env:
    """An env id with a typo: every actor thread that makes it dies at once."""
    return gymnasium.make("CartPol-v1")


_made = itertools.count()


def make_flaky_env() -> gymnasium.Env:
    """CartPole, but two of every three makes in a process fail (a flaky simulator): the threads that get one go
    on, the others die and are replaced until they get one too."""
    if next(_made) % 3:
        raise RuntimeError("the simulator did not start this time")
    return gymnasium.make("CartPole-v1")


def make_exploding_env() -> gymnasium.Env:
    return ExplodingEnv()


def mlp(obs_size: int = 4, n_actions: int = 2, hidden: int = 16) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(obs_size, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_actions))


def cartpole_agent(**overrides) -> Agent:
    """A small non-distributional agent for CartPole (tests that only need transitions to flow)."""
    values = {"state_shape": (4,), "action_space_size": 2, "use_distributional": False, "replay_capacity": 5000,
              "batch_size": 16, "seed": 0}
    values.update(overrides)
    torch.manual_seed(0)
    return Agent(AgentConfig(**values), mlp)


class SlowAgent(Agent):
    """An agent whose train steps take ``seconds``, and whose first one waits for ``block_until()`` (up to 30 s):
    a learner that falls behind its actors."""

    seconds = 0.1
    block_until = None

    def train_step(self) -> float:
        deadline = time.monotonic() + 30
        while self.block_until is not None and not self.block_until() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.block_until = None
        time.sleep(self.seconds)
        return super().train_step()


def mlp_failing_in_children():
    """The agent's network in the learner's process; in any other process (an inference server) it raises, as a
    factory whose code does not work there would: the server dies at each start."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        raise RuntimeError("this network cannot be built in a child process")
    return mlp()
