"""What the learners share: the env helpers, the result of a run, and the run folder's config.json, which
``--resume`` reads back (the algorithm, env and network sizes of a run cannot change when it resumes)."""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium
import numpy as np

from rqrl.algorithms.atari import check_atari_options, is_atari, make_atari_env, register_atari_envs
from rqrl.algorithms.checkpoint import recorded_mean_return
from rqrl.algorithms.metrics import MetricsWriter
from rqrl.algorithms.run_folder import RunFolder
from rqrl.engine.connection import redact_url
from rqrl.errors import CheckpointError, ConfigError, RunStoppedError, RunTakenOverError

log = logging.getLogger(__name__)

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
class Tracking:
    """The settings every learner's config shares for evaluation during training and experiment tracking."""

    eval_every: float | None = field(default=None, metadata={
        "help": "Seconds of training between two evaluations: --eval-episodes greedy episodes on an env of their own, "
                "in the learner's process, logged as eval_return (charts/eval_return) beside the training returns "
                "(default: none)."})
    eval_episodes: int = field(default=5, metadata={"help": "Greedy episodes per evaluation (--eval-every)."})
    wandb: bool = field(default=False, metadata={
        "help": "Also log the config and every metrics row's scalars to Weights & Biases (pip install "
                "'rqrl[wandb]'; WANDB_MODE=offline keeps them in the run folder's wandb/)."})
    wandb_project: str = field(default="rqrl", metadata={"help": "The Weights & Biases project of --wandb."})


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
    """What interrupted the run: "SIGINT" (Ctrl-C), "SIGTERM", "rqrl stop" or "taken over" (another learner
    resumed it); None if it ran to its end."""
    budget: str = "step"
    """Which budget an unsolved run that ran to its end reached: "step" (total_env_steps) or "time" (seconds)."""
    bottleneck: str | None = None
    """What limited throughput: "workers", "learner" or "balanced" (rqrl.algorithms.metrics.Bottleneck); None if
    unknown."""
    bottleneck_detail: str | None = None
    """The summary's line saying why."""

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "run_dir": str(self.run_dir)}


def stopped_reason(error: RunStoppedError) -> str:
    """TrainResult.stopped_by of a run that ended with ``error``."""
    return "taken over" if isinstance(error, RunTakenOverError) else "rqrl stop"


EXTRAS = {"box2d": "box2d"}
"""Words in gymnasium's missing-dependency message -> rqrl's extra that installs it."""


def make_env(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """``gymnasium.make(env_id, **kwargs)``; ConfigError in one line for an unknown id (with the nearest ids) or an
    env whose dependency is missing (with the rqrl extra that installs it). No preprocessing: make_train_env makes
    the env the learners step."""
    if is_atari(env_id):
        register_atari_envs()
    try:
        return gymnasium.make(env_id, **kwargs)
    except gymnasium.error.UnregisteredEnv as error:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `python -c 'import gymnasium; " \
            "gymnasium.pprint_registry()'` lists them"
        raise ConfigError(f"unknown env id {env_id!r} ({error}){hint}") from None
    except gymnasium.error.DependencyNotInstalled as error:
        extra = next((name for word, name in EXTRAS.items() if word in str(error).lower()), None)
        fix = f"pip install 'rqrl[{extra}]'" if extra else "install the package gymnasium names"
        raise ConfigError(f"env {env_id!r} needs a package that is not installed ({error}): {fix}") from None


def is_image(space: gymnasium.Space[Any]) -> bool:
    """Whether observations of ``space`` are images for the Nature CNN (rqrl.algorithms.cnn): a uint8 Box of rank 3,
    channels first (Atari's stacked frames: ``(4, 84, 84)``)."""
    return isinstance(space, gymnasium.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def make_train_env(env_id: str, terminal_on_life_loss: bool = False, repeat_action_probability: float | None = None,
                   **kwargs: Any) -> gymnasium.Env:
    """The env the learners' workers, their evaluations and ``rqrl evaluate`` step: an Atari id (``ALE/...``)
    preprocessed by rqrl.algorithms.atari (``terminal_on_life_loss`` and ``repeat_action_probability``, None: v5's,
    are its options), any other as make_env makes it (``kwargs`` go to gymnasium.make); observations that are not
    images (is_image) flattened to a vector, as the MLPs take them. Module level, so the env factory a learner sends
    its workers (a partial of this function) pickles by reference and works wherever rqrl is installed."""
    check_atari_options(env_id, terminal_on_life_loss, repeat_action_probability)
    if is_atari(env_id):
        if repeat_action_probability is not None:
            kwargs["repeat_action_probability"] = repeat_action_probability
        env = make_atari_env(env_id, terminal_on_life_loss=terminal_on_life_loss, **kwargs)
    else:
        env = make_env(env_id, **kwargs)
    shape = env.observation_space.shape
    if not is_image(env.observation_space) and (shape is None or len(shape) != 1):  # None: a Dict or Tuple space
        env = gymnasium.wrappers.FlattenObservation(env)
    return env


def env_factory(config: Any) -> functools.partial[gymnasium.Env]:
    """The env factory a learner's workers call: make_train_env with the run's ``env_id`` and Atari options."""
    return functools.partial(make_train_env, config.env_id, terminal_on_life_loss=config.terminal_on_life_loss,
                             repeat_action_probability=config.repeat_action_probability)


class EnvSpaces(NamedTuple):
    """What the learners size their networks by."""

    obs_shape: tuple[int, ...]
    """``(n,)`` for vector observations (flattened: make_train_env), ``(C, H, W)`` for images (is_image)."""
    n_actions: int
    reward_threshold: float | None
    """The env's, None if it has none."""


def env_spaces(env_id: str) -> EnvSpaces:
    """The observation shape, number of actions and reward threshold of the env make_train_env makes of ``env_id``;
    ConfigError unless its observations are a Box and its actions Discrete."""
    env = make_train_env(env_id)
    try:
        obs_space, action_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gymnasium.spaces.Box) or not isinstance(action_space, gymnasium.spaces.Discrete):
            raise ConfigError(f"rqrl's learners need Box observations and Discrete actions; {env_id} has "
                              f"{obs_space} and {action_space}")
        threshold = env.spec.reward_threshold if env.spec is not None else None
        shape = tuple(obs_space.shape) if is_image(obs_space) else (int(np.prod(obs_space.shape)),)
        return EnvSpaces(shape, int(action_space.n), threshold)
    finally:
        env.close()


def make_flat_env(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """The env (``kwargs`` go to gymnasium.make) with observations flattened to a float32 vector (what the MLP
    expects), images too: make_train_env keeps images for the CNN and preprocesses Atari."""
    env = make_env(env_id, **kwargs)
    shape = env.observation_space.shape
    if shape is None or len(shape) != 1:  # None: a Dict or Tuple space
        env = gymnasium.wrappers.FlattenObservation(env)
    return env


def check_workers(workers: int | None) -> None:
    """ConfigError naming --workers unless it is None (the default) or an int >= 0."""
    if workers is not None and not (isinstance(workers, int) and workers >= 0):
        raise ConfigError(f"expected --workers >= 0 (0: only external `rqrl worker` processes), got {workers!r}")


def recorded_config(config: Any, algo: str) -> dict[str, Any]:
    """The run's settings as config.json records them: with its algorithm, without Redis passwords."""
    stored = {**asdict(config), "algo": algo}
    for name in ("redis_url", "worker_redis_url"):
        if name in stored:
            stored[name] = redact_url(stored[name])
    return stored


def write_config(run_dir: Path, config: Any, algo: str) -> None:
    """The run's settings as config.json (recorded_config)."""
    (run_dir / "config.json").write_text(json.dumps(recorded_config(config, algo), indent=2))


def run_folder(resume: str | Path) -> Path:
    """The run folder of ``resume``: the folder itself, or the folder of a checkpoint file."""
    path = Path(resume)
    return path if path.is_dir() else path.parent


def resumed_folder(resume: str | Path) -> Path | None:
    """The run folder a resumed run goes on writing: ``resume`` if it is a folder, the folder of a file in a run
    folder (one with config.json); None for a loose checkpoint file, which starts a new run folder."""
    path = Path(resume)
    if path.is_dir():
        return path
    return path.parent if (path.parent / "config.json").is_file() else None


def name_run_folder(config: Any, algo: str) -> Path:
    """The folder a learner writes, named in ``config`` (run_name, run_dir): a resumed run's own (the folder
    ``resume`` names, or the run folder its checkpoint file lies in), else ``run_dir/run_name``, the name made up
    (``ALGO-xxxxxxxx``) where none is given."""
    continued = resumed_folder(config.resume) if config.resume else None
    if config.run_name is None and continued is not None:  # the run goes on in its folder
        config.run_name, config.run_dir = continued.name, str(continued.parent)
    if config.run_name is None:
        config.run_name = f"{algo}-{uuid.uuid4().hex[:8]}"
    return Path(config.run_dir) / config.run_name


def held_while(folder: RunFolder, step: Callable[[], None]) -> None:
    """Run ``step`` (what a learner being built reads from its run folder: the checkpoint) with ``folder`` held,
    and release the folder if it raises: the learner is never built, so nothing else would."""
    try:
        step()
    except BaseException:
        folder.close()
        raise


class ResumableLearner:
    """What IMPALA's and PPO's learners share: the mean return of the last 100 episodes, whether it solves the env,
    and resuming (each learner has ``_load``, its checkpoint's state, besides ``run_dir``, ``config`` and the
    counters)."""

    config: Any
    run_dir: Path
    env_steps: int
    recent_returns: deque[float]
    best_mean_return: float | None
    target_return: float | None

    def _load(self, checkpoint_path: Path) -> None:
        raise NotImplementedError

    @property
    def mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    @property
    def solved(self) -> bool:
        mean_return = self.mean_return
        return (self.target_return is not None and len(self.recent_returns) == self.recent_returns.maxlen
                and mean_return is not None and mean_return >= self.target_return)

    def _resume(self, resume: str) -> None:
        """Take the state of the run ``resume`` names, and the best return of the best.safetensors this run writes
        (newer than the checkpoint's); ConfigError if it does not fit or the run has nothing left to train."""
        checkpoint_path = checkpoint_to_resume(resume)
        if checkpoint_path is not None:
            self._load(checkpoint_path)
        self.best_mean_return = recorded_mean_return(self.run_dir / "best.safetensors")
        check_unfinished(resume, env_steps=self.env_steps, total_env_steps=self.config.total_env_steps,
                         solved=self.solved, mean_return=self.mean_return, target_return=self.target_return)
        if checkpoint_path is not None:  # said once the run goes on: a finished one is refused above
            log.info("resumed from %s at %d env steps", checkpoint_path, self.env_steps)


def checkpoint_to_resume(resume: str | Path) -> Path | None:
    """The checkpoint file ``resume`` names; None, said in one log line, where ``resume`` is a run folder (it has
    config.json) that holds no checkpoint yet (its learner was stopped before its first one): nothing was saved to
    go on from, so the run starts again from its first step, with its recorded settings. A file that is not there
    (a typo, a name without .safetensors) is returned as it is, for load_checkpoint to say so: it never restarts
    a run whose checkpoint is only misnamed."""
    path = Path(resume)
    checkpoint = path / "checkpoint.safetensors" if path.is_dir() else path
    if checkpoint.is_file() or not (path.is_dir() and (path / "config.json").is_file()):
        return checkpoint
    log.warning("%s holds no checkpoint (its learner stopped before writing one): nothing to go on from, so the run "
                "starts again from its first step, with its recorded settings", checkpoint.parent)
    return None


def check_checkpoint(path: str | Path, counters: dict[str, Any], config: Any, algo: str) -> None:
    """ConfigError naming both values if the checkpoint at ``path`` (its ``counters``) is another algorithm's, or
    was trained with other network-shaping settings (FROZEN_ON_RESUME) than ``config``: what a loose checkpoint
    file, which has no config.json beside it, is checked by. A checkpoint that records no ``algo`` is IMPALA's
    (older IMPALA checkpoints recorded none); a setting it does not record is not checked."""
    recorded = counters.get("algo", "impala")
    if recorded != algo:
        raise ConfigError(f"{path} is a checkpoint of {recorded}, not of {algo}: resume it with `rqrl train "
                          f"{recorded} --resume {path}`")
    _check_frozen_settings(path, counters, config, algo, "the checkpoint's", "give the checkpoint's")


def improves(mean_return: float | None, best: float | None) -> bool:
    """Whether ``mean_return`` beats the best so far (None: none yet): a NaN or infinite one never does, and any
    finite one beats a NaN best an older learner recorded."""
    return (mean_return is not None and math.isfinite(mean_return)
            and (best is None or not math.isfinite(best) or mean_return > best))


def close_quietly(metrics: MetricsWriter) -> None:
    """Close a run's metrics after a save failed: on a full disk their last row fails too, and that second error
    (logged here) would bury the save's, which says what to do."""
    try:
        metrics.close()
    except (OSError, CheckpointError) as error:  # MetricsWriter's write errors are CheckpointErrors
        log.warning("could not finish metrics.csv after the failed save: %s", error)


def check_unfinished(resume: str | Path, *, env_steps: int, total_env_steps: int, solved: bool,
                     mean_return: float | None, target_return: float | None, seconds: float | None = None,
                     time_budget: float | None = None) -> None:
    """ConfigError if the run ``resume`` names has nothing left to train: it reached its step budget, or its time
    budget (DQN's --seconds, over all its sessions), or is solved. Said at once, before Redis and workers start
    and before its folder is written; the message names the flag to raise."""
    reasons, flags = [], []
    if env_steps >= total_env_steps:
        reasons.append(f"it reached its step budget ({env_steps:,} env steps of --total-env-steps "
                       f"{total_env_steps:,})")
        flags.append("--total-env-steps")
    if time_budget is not None and seconds is not None and seconds >= time_budget:
        reasons.append(f"it used its time budget ({seconds:,.1f} s of --seconds {time_budget:g})")
        flags.append("--seconds")
    if solved:
        reasons.append(f"it is solved (the mean return of its last 100 episodes, {mean_return:.2f}, reached "
                       f"--target-return {target_return:g})")
        flags.append("--target-return")
    if reasons:
        raise ConfigError(f"{resume} is finished: {' and '.join(reasons)}; nothing to train. To train it further, "
                          f"resume it with a higher {' and a higher '.join(flags)}")


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
    setting that shapes its networks (FROZEN_ON_RESUME). A checkpoint outside a run folder has no config.json:
    check_checkpoint checks it by what it records."""
    if not config.resume or not (run_folder(config.resume) / "config.json").is_file():
        return
    recorded = recorded_settings(config.resume)
    if recorded["algo"] != algo:
        raise ConfigError(f"{config.resume} is a {recorded['algo']} run, not {algo}: resume it with "
                          f"`rqrl train {recorded['algo']} --resume {config.resume}`")
    _check_frozen_settings(config.resume, recorded, config, algo, "recorded",
                           "leave them out to take the recorded ones (`rqrl train --resume` does)")


def _check_frozen_settings(source: Any, recorded: dict[str, Any], config: Any, algo: str, whose: str,
                           fix: str) -> None:
    """ConfigError naming each network-shaping setting (FROZEN_ON_RESUME) ``config`` gives other than ``recorded``
    (``source``'s: a run's config.json, or a checkpoint's counters); a setting not recorded is not checked."""
    changed = [f"--{name.replace('_', '-')} {getattr(config, name)!r} ({whose}: {recorded[name]!r})"
               for name in FROZEN_ON_RESUME[algo] if name in recorded and recorded[name] != getattr(config, name)]
    if changed:
        raise ConfigError(f"cannot resume {source} with other network-shaping settings: {', '.join(changed)}; {fix}")
