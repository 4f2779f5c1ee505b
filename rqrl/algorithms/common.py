"""What the learners share: the env helpers, the result of a run, and the run folder's config.json, which
``--resume`` reads back (the algorithm, env and network sizes of a run cannot change when it resumes)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from rqrl.engine.connection import redact_url
from rqrl.errors import ConfigError

ALGORITHMS = ("impala", "ppo", "dqn")
FROZEN_ON_RESUME: dict[str, tuple[str, ...]] = {
    "impala": ("env_id", "hidden_size"),
    "ppo": ("env_id", "hidden_size"),
    "dqn": ("env_id", "hidden_size", "distributional", "dueling", "v_min", "v_max"),
}
"""Per algorithm, the settings a resumed run must keep: they shape the networks in its checkpoint."""
NOT_RESUMED = frozenset({"resume", "run_name", "run_dir", "redis_url", "worker_redis_url"})
"""Settings of config.json a resumed run does not take over: where it runs and where it writes."""


@dataclass
class TrainResult:
    run_dir: Path
    solved: bool
    interrupted: bool
    env_steps: int
    updates: int
    seconds: float
    mean_return: float | None
    best_mean_return: float | None
    episodes: int
    stopped_by: str | None = None
    """What interrupted the run: "SIGINT" (Ctrl-C), "SIGTERM" or "rqrl stop"; None if it ran to its end."""
    budget: str = "step"
    """Which budget an unsolved run that ran to its end reached: "step" (total_env_steps) or "time" (seconds)."""
    bottleneck: str | None = None
    """What limited throughput: "workers", "learner" or "balanced" (rqrl.algorithms.metrics.Bottleneck); None if
    unknown."""
    bottleneck_detail: str | None = None
    """The summary's line saying why."""

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "run_dir": str(self.run_dir)}


def env_spaces(env_id: str) -> tuple[int, int, float | None]:
    """Observation size, number of actions and reward threshold of a Gymnasium env."""
    env = gymnasium.make(env_id)
    try:
        obs_space, action_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gymnasium.spaces.Box) or not isinstance(action_space, gymnasium.spaces.Discrete):
            raise ConfigError(f"rqrl's learners need Box observations and Discrete actions; {env_id} has "
                              f"{obs_space} and {action_space}")
        threshold = env.spec.reward_threshold if env.spec is not None else None
        return int(np.prod(obs_space.shape)), int(action_space.n), threshold
    finally:
        env.close()


def make_flat_env(env_id: str) -> gymnasium.Env:
    """The env with observations flattened to a float32 vector (what the MLP expects)."""
    env = gymnasium.make(env_id)
    shape = env.observation_space.shape
    if shape is None or len(shape) != 1:  # None: a Dict or Tuple space
        env = gymnasium.wrappers.FlattenObservation(env)
    return env


def write_config(run_dir: Path, config: Any, algo: str) -> None:
    """The run's settings as config.json, with its algorithm and without Redis passwords."""
    stored = {**asdict(config), "algo": algo}
    for name in ("redis_url", "worker_redis_url"):
        if name in stored:
            stored[name] = redact_url(stored[name])
    (run_dir / "config.json").write_text(json.dumps(stored, indent=2))


def run_folder(resume: str | Path) -> Path:
    """The run folder of ``resume``: the folder itself, or the folder of a checkpoint file."""
    path = Path(resume)
    return path if path.is_dir() else path.parent


def recorded_settings(resume: str | Path) -> dict[str, Any]:
    """The config.json of the run ``resume`` names (a run folder or a file in it); ConfigError if it has none.
    A run written before config.json recorded ``algo`` was an IMPALA run."""
    path = run_folder(resume) / "config.json"
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{resume} is no run folder of rqrl train: it holds no config.json") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from error
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path} holds no settings object")
    return {"algo": "impala", **recorded}


def check_resume(config: Any, algo: str) -> None:
    """ConfigError, naming each setting, if ``config.resume`` is another algorithm's run or ``config`` changes a
    setting that shapes its networks (FROZEN_ON_RESUME). Nothing to check for a checkpoint outside a run folder."""
    if not config.resume or not (run_folder(config.resume) / "config.json").is_file():
        return
    recorded = recorded_settings(config.resume)
    if recorded["algo"] != algo:
        raise ConfigError(f"{config.resume} is a {recorded['algo']} run, not {algo}: resume it with "
                          f"`rqrl train {recorded['algo']} --resume {config.resume}`")
    changed = [f"--{name.replace('_', '-')} {getattr(config, name)!r} (recorded: {recorded[name]!r})"
               for name in FROZEN_ON_RESUME[algo] if name in recorded and recorded[name] != getattr(config, name)]
    if changed:
        raise ConfigError(f"cannot resume {config.resume} with other network-shaping settings: {', '.join(changed)}; "
                          f"leave them out to take the recorded ones (`rqrl train --resume` does)")
