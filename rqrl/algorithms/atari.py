"""Atari for the learners (the extra ``rqrl[atari]``: ale-py, which ships the ROMs, and opencv): an ``ALE/...`` env id
becomes the env of DQN's Nature paper and of IMPALA's and PPO's Atari runs.

``gymnasium.make(env_id, frameskip=1)`` (the frame skip moves into the preprocessing; v5's sticky actions,
``repeat_action_probability=0.25``, stay unless given), wrapped in gymnasium's ``AtariPreprocessing`` (up to 30
no-op actions at reset, each action repeated for 4 frames and the last two frames max-pooled, 84x84 grayscale, and
optionally an episode's end at each life lost) and ``FrameStackObservation`` (the last 4 frames): observations are
uint8 ``(4, 84, 84)``, which the learners feed to the Nature CNN (rqrl.algorithms.cnn). The base env's own
observations are never used (the preprocessing reads the frames it keeps off the emulator's screen), so it makes its
cheapest, the 128-byte RAM, instead of copying out a 210x160 RGB screen at every frame: the same observations, and
an agent step 16-20% cheaper (Pong: 263 instead of 331 us on the 2-core VM, ``benchmarks/atari_step.py``).
``rqrl.algorithms.common.make_train_env`` builds every ALE id with ``make_atari_env``: the workers (which get a
pickled reference to it and register ale-py's envs in their own process), the evaluations and ``rqrl evaluate``.

>>> env = make_atari_env("ALE/Pong-v5")  # doctest: +SKIP
>>> env.observation_space  # doctest: +SKIP
Box(0, 255, (4, 84, 84), uint8)
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from rqrl.errors import ConfigError, MissingExtraError

PREFIX = "ALE/"
"""The namespace of ale-py's ids (``ALE/Pong-v5``, ``ALE/Breakout-v5``, ...)."""
NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
STACK_SIZE = 4
MAX_EPISODE_STEPS = 108_000 // FRAME_SKIP
"""v5's cap on an episode (``max_num_frames_per_episode``, 108,000 frames: 30 minutes of play) in agent steps."""
TERMINAL_ON_LIFE_LOSS_HELP = (
    "Atari (ALE/...) only: end an episode at each life lost (AtariPreprocessing's terminal_on_life_loss); the "
    "training episodes and their returns are then lives, evaluations still play whole games.")

REPEAT_ACTION_PROBABILITY_HELP = (
    "Atari (ALE/...) only: the chance that the emulator repeats the previous action instead of the one taken "
    "(sticky actions; default: v5's 0.25, as Machado et al. 2018 recommend; 0 for the deterministic v4 setting of "
    "the Nature DQN and IMPALA papers). Evaluations use the same.")


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is one of ale-py's (``ALE/...``)."""
    return env_id.startswith(PREFIX)


def check_atari_options(env_id: str, terminal_on_life_loss: bool,
                        repeat_action_probability: float | None = None) -> None:
    """ConfigError naming the flag if an Atari-only option is set for an env that is not Atari, or out of range."""
    given = [flag for flag, value in (("--terminal-on-life-loss", terminal_on_life_loss),
                                      ("--repeat-action-probability", repeat_action_probability is not None)) if value]
    if given and not is_atari(env_id):
        raise ConfigError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for Atari env ids "
                          f"({PREFIX}...), not {env_id!r}; leave {'it' if len(given) == 1 else 'them'} out")
    if repeat_action_probability is not None and not (
            isinstance(repeat_action_probability, (int, float)) and not isinstance(repeat_action_probability, bool)
            and 0.0 <= repeat_action_probability <= 1.0):
        raise ConfigError(f"expected --repeat-action-probability between 0 and 1, got {repeat_action_probability!r}")


def register_atari_envs() -> None:
    """Register ale-py's ``ALE/...`` ids with gymnasium in this process (again is harmless); MissingExtraError if
    ale-py, or the opencv that AtariPreprocessing resizes frames with, is not installed."""
    try:
        import ale_py
    except ImportError as error:
        raise MissingExtraError(f"Atari envs need ale-py, which is not installed ({error})", extra="atari") from None
    try:
        import cv2  # noqa: F401 - AtariPreprocessing imports it when it wraps an env
    except ImportError as error:
        raise MissingExtraError(f"Atari's preprocessing (gymnasium's AtariPreprocessing) needs opencv, which is not "
                                f"installed ({error})", extra="atari") from None
    gymnasium.register_envs(ale_py)


class ScreenSized(gymnasium.Wrapper):
    """An ALE env that observes its RAM, declared with its screen's shape: AtariPreprocessing sizes its frame
    buffers by the env's observation space and fills them off the emulator's screen, discarding the observations
    the env returns, which are therefore best the cheapest the ALE makes."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        height, width = env.unwrapped.ale.getScreenDims()  # type: ignore[attr-defined]
        self.observation_space = gymnasium.spaces.Box(0, 255, (height, width, 3), np.uint8)


def make_atari_env(env_id: str, *, terminal_on_life_loss: bool = False, **kwargs: Any) -> gymnasium.Env:
    """The preprocessed Atari env of ``env_id`` (see the module's docstring); ``kwargs`` go to gymnasium.make (for
    instance ``repeat_action_probability=0.0`` for no sticky actions, ``render_mode="rgb_array"`` to film it).
    ConfigError in one line for an id ale-py does not have, MissingExtraError without the extra."""
    register_atari_envs()
    try:
        env = gymnasium.make(env_id, **{"frameskip": 1, "obs_type": "ram", **kwargs})
    except gymnasium.error.Error as error:  # NameNotFound, VersionNotFound, ... (gymnasium's message has hints)
        raise ConfigError(f"unknown Atari env id {env_id!r} ({error}); `python -c 'import gymnasium, ale_py; "
                          f"gymnasium.pprint_registry()'` lists them") from None
    if kwargs.get("obs_type", "ram") == "ram":
        env = ScreenSized(env)
    env = gymnasium.wrappers.AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP,
                                                screen_size=SCREEN_SIZE, grayscale_obs=True,
                                                terminal_on_life_loss=terminal_on_life_loss)
    return gymnasium.wrappers.FrameStackObservation(env, stack_size=STACK_SIZE)
