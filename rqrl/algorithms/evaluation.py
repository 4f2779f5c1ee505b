"""Episodes of a trained model on an env of its own: ``rqrl evaluate`` (``--video`` films them with gymnasium's
RecordVideo) and the evaluation during training (``--eval-every``), greedy unless asked to sample."""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from rqrl.algorithms.common import make_train_env
from rqrl.errors import ConfigError

EVAL_SEED_OFFSET = 1_000_000
"""Training's evaluations reset their episodes with seeds ``seed + EVAL_SEED_OFFSET + i``: the same starting states
at each evaluation, none of them an actor's."""
VIDEO_EXTRA = "pip install 'rqrl[video]'"


def run_episodes(model: nn.Module, env: gymnasium.Env, episodes: int, seed: int, greedy: bool = True) -> list[float]:
    """Returns of ``episodes`` episodes of ``env`` reset with seeds ``seed``, ``seed + 1``, ...; actions are the
    argmax of ``model``'s outputs if ``greedy`` (an ActorCritic's logits, a DQN's Q-values), else sampled from
    their softmax."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                logits = model(torch.as_tensor(obs, device=device).unsqueeze(0)).cpu()
            action = (int(logits.argmax(-1)) if greedy
                      else int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)))
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def check_video_support() -> None:
    """ConfigError in one line, naming rqrl's extra, unless moviepy (RecordVideo's encoder) is installed."""
    if importlib.util.find_spec("moviepy") is None:
        raise ConfigError(f"--video needs moviepy (gymnasium's RecordVideo writes mp4 files with it), which is not "
                          f"installed: {VIDEO_EXTRA}")


def evaluate(model: nn.Module, env_id: str, episodes: int = 10, seed: int = 0, greedy: bool = True,
             video_folder: str | Path | None = None, **env_options: Any) -> list[float]:
    """Returns of ``episodes`` episodes with ``model`` (see run_episodes) on make_train_env(env_id, **env_options);
    with ``video_folder``, each episode is also an mp4 file there (gymnasium's RecordVideo: needs moviepy, and the
    env's renderer, pygame for the classic control envs: both in ``rqrl[video]``)."""
    if video_folder is None:
        env = make_train_env(env_id, **env_options)
    else:
        check_video_support()
        prefix = env_id.replace(":", "-").replace("/", "-")  # ALE/Pong-v5: no folder of its own
        env = gymnasium.wrappers.RecordVideo(make_train_env(env_id, render_mode="rgb_array", **env_options),
                                             str(video_folder),
                                             episode_trigger=lambda _: True, name_prefix=prefix)
    try:
        return run_episodes(model, env, episodes, seed, greedy)
    except gymnasium.error.DependencyNotInstalled as error:  # the renderer, on the first frame
        raise ConfigError(f"--video: {env_id} cannot render frames ({error}): {VIDEO_EXTRA}") from None
    finally:
        env.close()


def check_evaluation(eval_every: float | None, eval_episodes: int) -> None:
    """ConfigError naming the setting unless ``eval_every`` is None or > 0 and ``eval_episodes`` an int >= 1."""
    if eval_every is not None and not eval_every > 0:
        raise ConfigError(f"expected eval_every > 0 seconds (or none: no evaluation), got {eval_every!r}")
    if not isinstance(eval_episodes, int) or eval_episodes < 1:
        raise ConfigError(f"expected eval_episodes to be an int >= 1, got {eval_episodes!r}")


class PeriodicEvaluation:
    """``--eval-every``: every ``every_seconds`` of training, ``episodes`` greedy episodes on an env of its own,
    in the learner's process (training waits for them: ``eval_seconds`` says how long). None: never."""

    def __init__(self, env_id: str, every_seconds: float | None, episodes: int, seed: int,
                 clock: Callable[[], float] = time.monotonic, **env_options: Any):
        self.every_seconds, self.episodes, self.seed = every_seconds, episodes, seed + EVAL_SEED_OFFSET
        self._clock = clock
        self._env = make_train_env(env_id, **env_options) if every_seconds is not None else None
        self._next = clock() + every_seconds if every_seconds is not None else math.inf

    def maybe_run(self, model: nn.Module) -> dict[str, float] | None:
        """The evaluation's figures (eval_return, its std, eval_seconds) if one is due, else None."""
        if self._env is None or self.every_seconds is None or self._clock() < self._next:
            return None
        started = time.perf_counter()
        returns = run_episodes(model, self._env, self.episodes, self.seed)
        self._next = self._clock() + self.every_seconds  # training time between two evaluations, not counting them
        return {"eval_return": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
                "eval_seconds": time.perf_counter() - started}

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
