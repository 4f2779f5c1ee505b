"""Envs and policies for tests; importable by worker processes (the repo root is on their path)."""

from __future__ import annotations

import os
import time

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from rqrl.engine.policy import PolicyStep, categorical_step


def make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


class GlobalRandomRewardCartPole(gymnasium.Wrapper):
    """CartPole whose reward is drawn from the global np.random (as old gym envs draw): a logical worker's rewards
    show whether it ran on its own global streams."""

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(np.random.random()), terminated, truncated, info


def make_global_random_cartpole() -> gymnasium.Env:
    return GlobalRandomRewardCartPole(gymnasium.make("CartPole-v1"))


def mlp_policy(obs_size: int = 4, n_actions: int = 2, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(obs_size, 16), torch.nn.Tanh(), torch.nn.Linear(16, n_actions))


class WeightRevealingPolicy(torch.nn.Module):
    """Acts at random, but reports its weight as every log-prob: a record shows which weights made it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def act(self, obs: torch.Tensor, generator: torch.Generator) -> PolicyStep:
        batch = obs.shape[0]
        actions = torch.randint(0, 2, (batch,), generator=generator)
        return PolicyStep(actions=actions, log_probs=self.weight.detach().expand(batch).clone())


def revealing_state(value: float) -> dict[str, torch.Tensor]:
    return {"weight": torch.tensor(float(value))}


class CountingEnv(gymnasium.Env):
    """Observation is the step count in the episode; episodes last ``length`` steps (terminated). Each step takes
    ``step_sleep`` s, or no time once the file ``release`` names exists (a test releases its slow envs before it
    stops them, so the workers need not step out their sleeps)."""

    observation_space = spaces.Box(0, 1e6, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 50, fail_at_step: int | None = None, step_sleep: float = 0.0,
                 release: str | None = None):
        self.length, self.fail_at_step, self.step_sleep = length, fail_at_step, step_sleep
        self.release = release
        self.count = 0
        self.total_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        if self.step_sleep:
            pause(self.step_sleep, self.release)
        self.count += 1
        self.total_steps += 1
        if self.fail_at_step is not None and self.total_steps >= self.fail_at_step:
            raise RuntimeError(f"CountingEnv exploded at step {self.total_steps} as the test asked")
        return np.array([self.count], np.float32), 1.0, self.count >= self.length, False, {}


def make_counting_env() -> gymnasium.Env:
    return CountingEnv(length=50)


WIDE_OBS_SIZE = 8192


class WideCountingEnv(CountingEnv):
    """CountingEnv whose observation is the step count in WIDE_OBS_SIZE float32s (32 KB): a 16-step rollout is
    about 0.5 MB, so a group's rollouts go in several queue entries (rqrl.maze.group_records.ENTRY_BYTES)."""

    observation_space = spaces.Box(0, 1e6, (WIDE_OBS_SIZE,), np.float32)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return np.full(WIDE_OBS_SIZE, obs[0], np.float32), info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return np.full(WIDE_OBS_SIZE, obs[0], np.float32), reward, terminated, truncated, info


def make_wide_counting_env() -> gymnasium.Env:
    return WideCountingEnv(length=20)


def make_failing_env() -> gymnasium.Env:
    return CountingEnv(length=50, fail_at_step=30)


def make_slow_env(release: str | None = None) -> gymnasium.Env:
    """Half a second a step, until the file ``release`` names exists."""
    return CountingEnv(length=50, step_sleep=0.5, release=release)


def pause(seconds: float, release: str | None) -> None:
    """Sleep ``seconds``, or until the file ``release`` names exists (if given)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if release is not None and os.path.exists(release):
            return
        time.sleep(min(left, 0.02) if release is not None else left)


def make_endless_env() -> gymnasium.Env:
    """Never terminates or truncates: its observation is the number of steps since its last reset."""
    return CountingEnv(length=2**62)


def make_minute_long_episode_env() -> gymnasium.Env:
    """Episodes of 1300 steps of 50 ms each: 65 s, longer than the default max_job_seconds (60 s)."""
    return CountingEnv(length=1300, step_sleep=0.05)


class DictObsEnv(gymnasium.Env):
    """Dict observations (a Box and a Discrete), random start seeded by reset(seed)."""

    observation_space = spaces.Dict({"position": spaces.Box(-1, 1, (2,), np.float32), "goal": spaces.Discrete(3)})
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = int(self.np_random.integers(3))
        self.steps = 0
        return self._obs(), {}

    def _obs(self):
        return {"position": self.position.copy(), "goal": self.goal}

    def step(self, action):
        self.steps += 1
        self.position = np.clip(self.position + self.np_random.normal(0, 0.1, 2), -1, 1).astype(np.float32)
        reward = 1.0 if int(action) == self.goal else 0.0
        return self._obs(), reward, False, self.steps >= 20, {}


def make_dict_env() -> gymnasium.Env:
    return DictObsEnv()


class DictPolicy(torch.nn.Module):
    """Categorical policy over a Dict observation: a linear layer on position + goal embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.position = torch.nn.Linear(2, 3)
        self.goal = torch.nn.Embedding(3, 3)

    def act(self, obs: dict[str, torch.Tensor], generator: torch.Generator) -> PolicyStep:
        logits = self.position(obs["position"]) + self.goal(obs["goal"].long())
        return categorical_step(logits, generator)


class GuessSignEnv(gymnasium.Env):
    """A trivial task: reward 1 when the action is the sign bit of the first observation; 20 steps.

    A random policy scores about 10 per episode, a trained one 20.
    """

    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs, {}

    def step(self, action):
        reward = 1.0 if int(action) == int(self._obs[0] > 0) else 0.0
        self._obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs, reward, False, False, {}


gymnasium.register(id="RqrlGuessSign-v0", entry_point="tests.fixtures:GuessSignEnv", max_episode_steps=20,
                   reward_threshold=19.0)


class PixelSignEnv(gymnasium.Env):
    """GuessSignEnv in pictures: a uint8 ``shape`` image (channels first), all 255 or all 0; reward 1 for action 1
    on a bright image, 0 on a dark one; 20 steps. Image observations for the Nature CNN without ale-py; another
    ``dtype`` or ``shape`` makes observations the learners flatten."""

    action_space = spaces.Discrete(2)

    def __init__(self, shape: tuple[int, ...] = (2, 36, 36), dtype: type = np.uint8):
        self.observation_space = spaces.Box(0, 255, shape, dtype)
        self._bright = False

    def _obs(self) -> np.ndarray:
        self._bright = bool(self.np_random.integers(2))
        return np.full(self.observation_space.shape, 255 if self._bright else 0, self.observation_space.dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        reward = 1.0 if int(action) == int(self._bright) else 0.0
        return self._obs(), reward, False, False, {}


gymnasium.register(id="RqrlPixelSign-v0", entry_point="tests.fixtures:PixelSignEnv", max_episode_steps=20)


def make_nan_reward_env() -> gymnasium.Env:
    return NanRewardEnv(length=50)


class NanRewardEnv(CountingEnv):
    """Returns a NaN reward at its 5th step."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, (float("nan") if self.total_steps == 5 else reward), terminated, truncated, info


class HangOnceEnv(CountingEnv):
    """Hangs in its 20th step for the first process that gets there (a marker file remembers it), for an hour or
    until the test creates the file ``marker + ".release"``."""

    def __init__(self, marker: str):
        super().__init__(length=50)
        self.marker = marker

    def step(self, action):
        if self.total_steps == 19:
            try:
                with open(self.marker, "x"):
                    pass
                pause(3600, self.marker + ".release")  # hang, as a stuck simulator would
            except FileExistsError:
                pass
        return super().step(action)


def make_hang_once_env(marker: str) -> gymnasium.Env:
    return HangOnceEnv(marker)


class GrowingObsEnv(CountingEnv):
    """Breaks its contract: after 40 steps its observations gain a dimension."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return (np.zeros(2, np.float32) if self.total_steps > 40 else obs), reward, terminated, truncated, info


def make_growing_obs_env() -> gymnasium.Env:
    return GrowingObsEnv(length=1000)


class VersionPolicy:
    """A garage policy whose action is its parameter ``value``: every step shows which update made it."""

    def __init__(self, value: int = 0, fail_on_reset: bool = False):
        self.value = int(value)
        self.fail_on_reset = fail_on_reset

    def reset(self) -> None:
        if self.fail_on_reset:
            raise RuntimeError("VersionPolicy.reset exploded as the test asked")

    def get_action(self, observation):
        return self.value, {"value": np.asarray(self.value)}

    def get_param_values(self) -> dict:
        return {"value": np.asarray(self.value)}

    def set_param_values(self, params) -> None:
        self.value = int(params["value"])


class EchoEnv(gymnasium.Env):
    """Observation: [step in episode, last action, a random start drawn at reset]; episodes of ``length`` steps
    (terminated), or of a length drawn at reset when ``random_length``; ``step_sleep`` s per step."""

    observation_space = spaces.Box(-1e6, 1e6, (3,), np.float64)
    action_space = spaces.Discrete(64)

    def __init__(self, length: int = 10, step_sleep: float = 0.0, random_length: bool = False, task: int = 0):
        self.length, self.step_sleep, self.random_length, self.task = length, step_sleep, random_length, task
        self.count, self.start, self.episode_length = 0, 0.0, length

    def set_task(self, task: int) -> None:
        self.task = task

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        self.start = float(self.np_random.uniform(0, 1))
        self.episode_length = int(self.np_random.integers(1, 2 * self.length)) if self.random_length else self.length
        return np.array([0.0, -1.0, self.start]), {"task": np.asarray(self.task)}

    def step(self, action):
        if self.step_sleep:
            time.sleep(self.step_sleep)
        self.count += 1
        obs = np.array([float(self.count), float(action), self.start])
        return obs, float(self.task), self.count >= self.episode_length, False, {"task": np.asarray(self.task)}


def make_echo_env() -> gymnasium.Env:
    return EchoEnv(length=10)


def make_slow_echo_env() -> gymnasium.Env:
    return EchoEnv(length=10, step_sleep=0.01)


def make_very_slow_echo_env() -> gymnasium.Env:
    return EchoEnv(length=8, step_sleep=0.25)


class FrameEnv(gymnasium.Env):
    """``size`` x ``size`` uint8 frames, each a random block on black (a fast stand-in for Atari's 84x84); episodes
    terminate after ``episode_steps`` steps."""

    action_space = spaces.Discrete(2)

    def __init__(self, size: int = 12, episode_steps: int = 11) -> None:
        self.observation_space = spaces.Box(0, 255, (size, size), np.uint8)
        self.episode_steps = episode_steps

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        return self._frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._steps += 1
        return self._frame(), float(action), self._steps >= self.episode_steps, False, {}

    def _frame(self) -> np.ndarray:
        """A dark frame with a bright random 3x3 block somewhere (compressible, as a game's frames are)."""
        frame = np.zeros(self.observation_space.shape, np.uint8)
        row, column = self.np_random.integers(0, frame.shape[0] - 2, 2)
        frame[row:row + 3, column:column + 3] = self.np_random.integers(1, 256, (3, 3), dtype=np.uint8)
        return frame


def make_frame_stack_env(max_episode_steps: int = 7, size: int = 12, episode_steps: int = 11) -> gymnasium.Env:
    """gymnasium's FrameStackObservation of 4 FrameEnv frames, (4, size, size) uint8, truncated after
    ``max_episode_steps`` steps (7) where FrameEnv has not terminated it."""
    env = gymnasium.wrappers.TimeLimit(FrameEnv(size, episode_steps), max_episode_steps)
    return gymnasium.wrappers.FrameStackObservation(env, 4)


class FramePolicy(torch.nn.Module):
    """Categorical policy over (4, 12, 12) uint8 frame stacks: one linear layer on the scaled pixels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4 * 12 * 12, 2)

    def act(self, obs: torch.Tensor, generator: torch.Generator) -> PolicyStep:
        return categorical_step(self.linear(obs.flatten(1).float() / 255.0), generator)


class FramePolicy48(FramePolicy):
    """FramePolicy over (4, 48, 48) frame stacks."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4 * 48 * 48, 2)
