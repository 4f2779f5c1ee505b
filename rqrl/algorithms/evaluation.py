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


def load_trained_model(path: str | Path, device: str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """The model ``rqrl evaluate`` plays with, and the facts of its weights (env_id, env steps, ...), from a run
    folder (its best, else final weights) or a file of any algorithm: a DQN weights file or checkpoint gives the
    Q-model (argmax of its Q-values is greedy), IMPALA's and PPO's the ActorCritic."""
    from rqrl.algorithms.checkpoint import load_weights, weights_file
    from rqrl.algorithms.dqn import load_q_model
    from rqrl.algorithms.impala import load_policy

    path = weights_file(path)
    tensors, metadata = load_weights(path, device)
    if is_dqn_checkpoint(metadata):
        return dqn_checkpoint_model(path, tensors, metadata["counters"], device)
    if metadata.get("algo") == "dqn":
        return load_q_model(path, device)
    return load_policy(path, device)


def is_dqn_checkpoint(metadata: dict[str, Any]) -> bool:
    """Whether a weights file's ``metadata`` is a DQN training checkpoint's: its facts sit under ``counters`` (with
    ``algo``), where a weights file has them at the top level, and its networks under ``model.online.`` and
    ``model.target.``."""
    counters = metadata.get("counters")
    return isinstance(counters, dict) and counters.get("algo") == "dqn"


def dqn_checkpoint_model(path: Path, tensors: dict[str, torch.Tensor], counters: dict[str, Any],
                         device: str) -> tuple[nn.Module, dict[str, Any]]:
    """The online Q-model of the DQN checkpoint at ``path`` and its facts: the network's settings come from the
    checkpoint's counters (this version's record them) over the config.json of its run folder (older ones)."""
    from rqrl.algorithms.common import recorded_settings
    from rqrl.algorithms.dqn import q_model

    has_config = (path.parent / "config.json").is_file()
    if "hidden_size" not in counters and not has_config:
        raise ConfigError(f"{path} is a DQN checkpoint of an older rqrl, whose network settings (hidden_size, "
                          f"dueling, ...) are in the config.json of its run folder, and {path.parent} has none: "
                          f"evaluate it inside its run folder, or evaluate the run's best or final weights")
    facts = {**(recorded_settings(path) if has_config else {}), **counters}
    env_id = facts["env_id"]
    model = q_model(facts)
    prefix = "model.online."  # a training checkpoint's model tensors are under model., the online network's then
    online = {key.removeprefix(prefix): value for key, value in tensors.items() if key.startswith(prefix)}
    try:
        model.load_state_dict(online)
    except RuntimeError as error:
        raise ConfigError(f"{path} does not fit the network its recorded settings describe: {error}") from error
    recent = counters.get("recent_returns") or []
    facts = {**counters, "env_id": env_id, "mean_return": float(np.mean(recent)) if recent else None}
    return model.to(device).eval(), facts


def check_evaluation(eval_every: float | None, eval_episodes: int) -> None:
    """ConfigError naming the setting unless ``eval_every`` is None or > 0 and ``eval_episodes`` an int >= 1."""
    if eval_every is not None and not eval_every > 0:
        raise ConfigError(f"expected eval_every > 0 seconds (or none: no evaluation), got {eval_every!r}")
    if not isinstance(eval_episodes, int) or eval_episodes < 1:
        raise ConfigError(f"expected eval_episodes to be an int >= 1, got {eval_episodes!r}")


class PeriodicEvaluation:
    """``--eval-every``: every ``every_seconds`` of training, ``episodes`` greedy episodes on an env of its own,
    in the learner's process (training waits for them: ``eval_seconds`` says how long). None: never.

    The clock starts at the first ``maybe_run``, which the learners call after their first batch: the time a learner
    waits for its workers to come (made before them, the evaluation would count it) is no training time."""

    def __init__(self, env_id: str, every_seconds: float | None, episodes: int, seed: int,
                 clock: Callable[[], float] = time.monotonic, **env_options: Any):
        self.every_seconds, self.episodes, self.seed = every_seconds, episodes, seed + EVAL_SEED_OFFSET
        self._clock = clock
        self._env = make_train_env(env_id, **env_options) if every_seconds is not None else None
        self._next: float | None = None if every_seconds is not None else math.inf
        """When the next evaluation is due; None until training starts (the first maybe_run)."""

    def maybe_run(self, model: nn.Module) -> dict[str, float] | None:
        """The evaluation's figures (eval_return, its std, eval_seconds) if one is due, else None; the first call
        starts the clock (the first evaluation is due ``every_seconds`` after it)."""
        if self._env is None or self.every_seconds is None:
            return None
        if self._next is None:
            self._next = self._clock() + self.every_seconds
        if self._clock() < self._next:
            return None
        started = time.perf_counter()
        returns = run_episodes(model, self._env, self.episodes, self.seed)
        self._next = self._clock() + self.every_seconds  # training time between two evaluations, not counting them
        return {"eval_return": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
                "eval_seconds": time.perf_counter() - started}

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
