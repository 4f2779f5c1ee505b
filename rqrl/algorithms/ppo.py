"""PPO (clipped surrogate, GAE) on rqrl's garage sampler, in one file.

Each iteration asks ``RQSampler.obtain_samples`` for at least ``num_samples`` steps of whole episodes,
all sampled by the current weights (the sampler guarantees it: no stale step), computes GAE
advantages per episode -- bootstrapping from the value of ``last_observations`` where an episode hit
TIMEOUT (truncated or cut by ``max_episode_length``), not where it was TERMINAL -- and runs
``epochs`` passes of minibatch updates of the clipped surrogate, a value regression and an entropy
bonus. The run folder is IMPALA's (weights, checkpoint for ``--resume``, metrics.csv, TensorBoard,
learning_curve.png, summary.json), so ``rqrl evaluate`` reads it too.

References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (eq. 7 and 9); Schulman
et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation" (eq. 16).

>>> config = PpoConfig(env_id="CartPole-v1", total_env_steps=200_000, workers=1)
>>> result = train(config)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import time
from collections import deque
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rqrl.algorithms.atari import (
    MAX_EPISODE_STEPS,
    REPEAT_ACTION_PROBABILITY_HELP,
    TERMINAL_ON_LIFE_LOSS_HELP,
    check_atari_options,
    is_atari,
)
from rqrl.algorithms.checkpoint import (
    TrainingState,
    load_checkpoint,
    load_into,
    save_checkpoint,
    save_weights,
)
from rqrl.algorithms.common import (
    ResumableLearner,
    Tracking,
    TrainResult,
    check_checkpoint,
    check_resume,
    check_workers,
    close_quietly,
    env_factory,
    env_spaces,
    held_while,
    improves,
    make_train_env,
    name_run_folder,
    stopped_reason,
    write_config,
)
from rqrl.algorithms.evaluation import PeriodicEvaluation, check_evaluation
from rqrl.algorithms.impala import ActorCritic
from rqrl.algorithms.metrics import MetricsWriter, plot_learning_curve, write_summary
from rqrl.algorithms.run_folder import RunFolder
from rqrl.algorithms.sample_ahead import SampleAhead
from rqrl.algorithms.tracking import check_wandb, tracker
from rqrl.engine.devices import check_device
from rqrl.engine.process import Terminated
from rqrl.engine.progress import Progress
from rqrl.errors import CheckpointError, ConfigError, RunStoppedError
from rqrl.garage.episodes import EpisodeBatch, StepType
from rqrl.garage.sampler import RQSampler
from rqrl.garage.worker import NewEnvUpdate

log = logging.getLogger(__name__)


@dataclass
class PpoConfig(Tracking):
    """Settings of one PPO run; each field is also a ``rqrl train ppo`` flag."""

    env_id: str = field(default="CartPole-v1", metadata={"help": "Gymnasium env id (vector or image observations, "
                                                                  "Discrete actions; ALE/... for Atari)."})
    terminal_on_life_loss: bool = field(default=False, metadata={"help": TERMINAL_ON_LIFE_LOSS_HELP})
    repeat_action_probability: float | None = field(default=None, metadata={"help": REPEAT_ACTION_PROBABILITY_HELP})
    total_env_steps: int = field(default=1_000_000, metadata={"help": "Step budget: stop after this many env steps."})
    target_return: float | None = field(default=None, metadata={
        "help": "Stop when the mean return of the last 100 episodes reaches this (default: the env's threshold)."})
    n_workers: int = field(default=8, metadata={"help": "Logical sampler workers (each its own env)."})
    num_samples: int = field(default=2048, metadata={"help": "Env steps per iteration (whole episodes, at least)."})
    max_episode_length: int | None = field(default=None, metadata={
        "help": "Longest episode (default: the env's time limit; Atari: 27,000, v5's 108,000 frames; else 1000)."})
    workers: int | None = field(default=None, metadata={
        "help": "Local worker processes (default: one per core with an embedded Redis, 0 with --redis-url)."})
    redis_url: str | None = field(default=None, metadata={"help": "Redis URL (default: an embedded private Redis)."})
    worker_redis_url: str | None = field(default=None, metadata={
        "help": "Redis URL of the local workers, if their ACL user is not the learner's (default: --redis-url)."})
    learning_rate: float = field(default=3e-4, metadata={"help": "Adam learning rate."})
    discount: float = field(default=0.99, metadata={"help": "Discount factor gamma."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda."})
    clip_ratio: float = field(default=0.2, metadata={"help": "PPO's clip of the probability ratio (epsilon)."})
    epochs: int = field(default=10, metadata={"help": "Passes over each iteration's samples."})
    sample_ahead: bool = field(default=True, metadata={
        "help": "Sample the next iteration while training on this one (its batch is then one update old; the "
                "clipped surrogate is taken against the log-probs it was sampled with); off: strictly on-policy, "
                "the workers idle while the learner trains."})
    extra_episodes: bool = field(default=True, metadata={
        "help": "Train on the whole episodes that arrived past num_samples too (garage returns its overshoot) "
                "instead of dropping them: 27-42% more data per iteration on CartPole, at no sampling "
                "cost; off: the shortest round-robin prefix, the same episodes for a seed on any number of workers."})
    minibatch_size: int = field(default=256, metadata={"help": "Steps per gradient step."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus."})
    value_coef: float = field(default=0.5, metadata={"help": "Weight of the value loss."})
    max_grad_norm: float = field(default=0.5, metadata={"help": "Gradient norm clip."})
    hidden_size: int = field(default=64, metadata={"help": "Width of the two hidden layers of each MLP (image "
                                                           "observations: the Nature CNN's, 512)."})
    seed: int = field(default=0, metadata={"help": "Seed of the model and of the sampler's logical workers."})
    learner_device: str = field(default="cpu", metadata={"help": "Device of the learner: cpu, cuda, cuda:1..."})
    learner_threads: int = field(default=1, metadata={"help": "Torch CPU threads of the learner."})
    run_dir: str = field(default="runs", metadata={"help": "Parent folder of run folders."})
    run_name: str | None = field(default=None, metadata={"help": "Run folder and Redis namespace (default: random)."})
    resume: str | None = field(default=None, metadata={"help": "Run folder or checkpoint file to continue from."})
    checkpoint_seconds: float = field(default=60.0, metadata={"help": "Write a checkpoint at least this often."})
    metrics_seconds: float = field(default=1.0, metadata={
        "help": "Seconds between two rows of metrics.csv and TensorBoard points: the updates between are averaged "
                "(losses, lags), or their last value kept (counters, returns); 0: a row per update."})
    progress: bool = field(default=True, metadata={
        "help": "Show progress: a live bar on a terminal, else a plain line every progress_seconds."})
    progress_seconds: float = field(default=10.0, metadata={
        "help": "Seconds between two progress lines when stderr is not a terminal."})

    def __post_init__(self) -> None:
        check_workers(self.workers)
        check_atari_options(self.env_id, self.terminal_on_life_loss, self.repeat_action_probability)
        check_wandb(self.wandb)
        check_evaluation(self.eval_every, self.eval_episodes)
        for name in ("total_env_steps", "n_workers", "num_samples", "epochs", "minibatch_size", "hidden_size",
                     "learner_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"expected {name} to be an int >= 1, got {value!r}")
        if not self.metrics_seconds >= 0:
            raise ConfigError(f"expected metrics_seconds >= 0, got {self.metrics_seconds}")
        for name in ("learning_rate", "clip_ratio", "max_grad_norm", "progress_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"expected {name} > 0, got {getattr(self, name)}")
        for name in ("discount", "gae_lambda"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"expected 0 < {name} <= 1, got {getattr(self, name)}")
        if self.max_episode_length is not None and self.max_episode_length < 1:
            raise ConfigError(f"expected max_episode_length >= 1, got {self.max_episode_length}")


def gae(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray, ends: np.ndarray, discount: float,
        lam: float) -> np.ndarray:
    """GAE advantages over concatenated episodes: ``next_values[t]`` is the value of the state after step t
    (0 after a TERMINAL step, V(last observation) after a TIMEOUT); ``ends[t]`` stops the trace at an episode's
    last step."""
    deltas = rewards + discount * next_values - values
    advantages = np.zeros_like(values)
    carry = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        carry = deltas[t] + discount * lam * (0.0 if ends[t] else carry)
        advantages[t] = carry
    return advantages


VALUE_ROWS = 1024
"""Observations per forward pass when values are computed for a whole iteration's steps (images are large)."""


def state_values(model: ActorCritic, observations: np.ndarray, device: torch.device) -> np.ndarray:
    """The values of ``observations`` (float64), VALUE_ROWS at a time, without gradients."""
    chunks = [observations[start:start + VALUE_ROWS] for start in range(0, len(observations), VALUE_ROWS)]
    with torch.no_grad():
        values = [model.values(torch.as_tensor(chunk, device=device)).cpu().numpy() for chunk in chunks]
    return np.concatenate(values).astype(np.float64) if values else np.zeros(0)


def advantages_and_returns(model: ActorCritic, batch: EpisodeBatch, config: PpoConfig,
                           device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """GAE advantages and value targets of every step of ``batch``."""
    values = state_values(model, np.asarray(batch.observations), device)
    last_values = state_values(model, np.asarray(batch.last_observations), device)
    ends = np.cumsum(batch.lengths) - 1
    is_end = np.zeros(len(values), bool)
    is_end[ends] = True
    next_values = np.append(values[1:], 0.0)
    timeout = batch.step_types[ends] == StepType.TIMEOUT
    next_values[ends] = np.where(timeout, last_values, 0.0)  # bootstrap on TIMEOUT, not on TERMINAL
    advantages = gae(batch.rewards.astype(np.float64), values, next_values, is_end, config.discount,
                     config.gae_lambda)
    return advantages, advantages + values


@dataclass
class LossTerms:
    policy: float
    value: float
    entropy: float
    clip_fraction: float


def ppo_update(model: ActorCritic, optimizer: torch.optim.Optimizer, batch: EpisodeBatch, config: PpoConfig,
               device: torch.device, generator: torch.Generator) -> LossTerms:
    """``epochs`` passes of minibatch steps on the clipped surrogate, value loss and entropy bonus."""
    advantages, returns = advantages_and_returns(model, batch, config, device)
    obs = torch.as_tensor(batch.observations, device=device)
    actions = torch.as_tensor(batch.actions, device=device).long()
    old_log_probs = torch.as_tensor(batch.agent_infos["log_prob"], device=device).float()
    advantages_t = torch.as_tensor(advantages, device=device).float()
    returns_t = torch.as_tensor(returns, device=device).float()
    n = len(actions)
    sums = np.zeros(4)
    steps = 0
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n, config.minibatch_size):
            index = order[start:start + config.minibatch_size]
            adv = advantages_t[index]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(index) > 1 else adv
            logits, values = model.logits_and_values(obs[index])
            log_probs_all = torch.log_softmax(logits, dim=-1)
            log_probs = log_probs_all.gather(-1, actions[index].unsqueeze(-1)).squeeze(-1)
            ratio = torch.exp(log_probs - old_log_probs[index])
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - config.clip_ratio, 1 + config.clip_ratio) * adv)
            policy_loss = -surrogate.mean()
            value_loss = 0.5 * (values - returns_t[index]).pow(2).mean()
            entropy = -(log_probs_all.exp() * log_probs_all).sum(-1).mean()
            loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            clipped = ((ratio - 1).abs() > config.clip_ratio).float().mean()
            sums += [float(policy_loss.detach()), float(value_loss.detach()), float(entropy.detach()), float(clipped)]
            steps += 1
    return LossTerms(*(sums / max(steps, 1)).tolist())


def episode_returns(batch: EpisodeBatch) -> list[float]:
    """Undiscounted return of each episode of ``batch``."""
    return [float(rewards.sum()) for rewards in np.split(batch.rewards, np.cumsum(batch.lengths)[:-1])]


class PpoLearner(ResumableLearner):
    """Model, optimizer, counters, recent returns and the run folder of one PPO run."""

    def __init__(self, config: PpoConfig):
        check_device("--learner-device", config.learner_device)
        check_resume(config, "ppo")
        self.config = config = dataclasses.replace(config)  # its own copy: the caller's config stays as given
        obs_shape, n_actions, threshold = env_spaces(config.env_id)
        self.target_return = config.target_return if config.target_return is not None else threshold
        torch.manual_seed(config.seed)
        torch.set_num_threads(config.learner_threads)
        self.device = torch.device(config.learner_device)
        self.model = ActorCritic(obs_shape, n_actions, config.hidden_size).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.env_steps = self.updates = self.episodes = 0
        self.elapsed_before = 0.0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.best_mean_return: float | None = None
        self.run_dir = name_run_folder(config, "ppo")
        self.folder = RunFolder(self.run_dir, config.resume)  # held before the checkpoint is read: one learner reads
        if config.resume:
            held_while(self.folder, functools.partial(self._resume, config.resume))

    def open_run_folder(self) -> None:
        """The run folder and its config.json, once the run has started: a launch that fails leaves none."""
        self.folder.open()
        write_config(self.run_dir, self.config, "ppo")

    def _load(self, checkpoint_path: Path) -> None:
        """Model, optimizer and counters from the checkpoint file; ConfigError if it is another run's kind."""
        state = load_checkpoint(checkpoint_path, str(self.device))
        check_checkpoint(checkpoint_path, state.counters, self.config, "ppo")
        fix = "resume with the settings it was trained with (--hidden-size, --env-id)"
        load_into(self.model, state.model, checkpoint_path, fix)
        load_into(self.optimizer, state.optimizer, checkpoint_path, fix)
        counters = state.counters
        self.env_steps, self.updates = counters["env_steps"], counters["updates"]
        self.episodes, self.elapsed_before = counters["episodes"], counters["seconds"]
        self.recent_returns.extend(counters.get("recent_returns", []))

    def cpu_state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value.detach().to("cpu") for key, value in self.model.state_dict().items()}

    def checkpoint(self, seconds: float) -> None:
        counters = {"env_id": self.config.env_id, "hidden_size": self.config.hidden_size, "algo": "ppo",
                    "env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
                    "seconds": seconds, "recent_returns": list(self.recent_returns),
                    "best_mean_return": self.best_mean_return}
        save_checkpoint(self.run_dir / "checkpoint.safetensors",
                        TrainingState(self.model.state_dict(), self.optimizer.state_dict(), counters))

    def save_weights(self, name: str) -> None:
        save_weights(self.run_dir / f"{name}.safetensors", self.model.state_dict(),
                     {"env_id": self.config.env_id, "hidden_size": self.config.hidden_size, "algo": "ppo",
                      "env_steps": self.env_steps, "updates": self.updates, "mean_return": self.mean_return})


def max_episode_length(config: PpoConfig) -> int:
    """The configured limit, else the env's time limit (Atari's: MAX_EPISODE_STEPS), else 1000."""
    if config.max_episode_length is not None:
        return config.max_episode_length
    if is_atari(config.env_id):
        return MAX_EPISODE_STEPS
    env = make_train_env(config.env_id)  # make, not spec: it imports the module of a "module:Env-v0" id
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
    finally:
        env.close()
    return int(limit) if limit else 1000


def make_sampler(config: PpoConfig, model: ActorCritic, *, secret: str | bytes | None = None,
                 redis_server: str | None = None) -> RQSampler:
    """The default sampler: embedded Redis unless ``redis_url`` is given; each logical worker builds its env."""
    return RQSampler(copy.deepcopy(model).to("cpu"), NewEnvUpdate(env_factory(config)),
                     max_episode_length=max_episode_length(config), n_workers=config.n_workers, seed=config.seed,
                     redis_url=config.redis_url, worker_redis_url=config.worker_redis_url, run_name=config.run_name,
                     n_local_workers=config.workers, start_method="forkserver", secret=secret,
                     redis_server=redis_server, progress=False, return_extras=config.extra_episodes)


METRIC_FIELDS = ["seconds", "updates", "steps_per_second", "mean_return", "episodes", "policy_loss", "value_loss",
                 "entropy", "clip_fraction", "dropped_episodes", "eval_return", "eval_return_std", "eval_seconds"]
METRIC_REDUCTIONS = dict.fromkeys(("policy_loss", "value_loss", "entropy", "clip_fraction"), "mean")
"""How the figures of the iterations a row covers (metrics_seconds) are reduced; the others are the last's."""


def train(config: PpoConfig, sampler: Any = None, *, secret: str | bytes | None = None,
          redis_server: str | None = None) -> TrainResult:
    """Train until solved, the step budget ends, or Ctrl-C/SIGTERM; always leaves a checkpoint behind. ``sampler`` is
    any object with garage's ``obtain_samples`` (default: ``make_sampler``)."""
    learner = PpoLearner(config)
    with closing(learner.folder):
        return _train(learner, learner.config, sampler, secret, redis_server)


def _train(learner: PpoLearner, config: PpoConfig, sampler: Any, secret: str | bytes | None,
           redis_server: str | None) -> TrainResult:
    sampler = sampler if sampler is not None else make_sampler(config, learner.model, secret=secret,
                                                               redis_server=redis_server)
    metrics: MetricsWriter | None = None  # made once the sampler has started
    progress = Progress(f"PPO {config.env_id}", total=config.total_env_steps, initial=learner.env_steps,
                        enabled=config.progress, interval=config.progress_seconds)
    started = time.monotonic()
    evaluation = PeriodicEvaluation(config.env_id, config.eval_every, config.eval_episodes, config.seed,
                                    repeat_action_probability=config.repeat_action_probability)
    stopped_by: str | None = None
    writable = True  # False once a save failed: no end state is written over the files that stay
    try:
        with sampler:
            getattr(sampler, "start_worker", lambda: None)()  # garage's: start now, so the Redis URL is known
            progress.announce_redis(str(config.run_name), getattr(sampler, "redis_url", None))
            learner.open_run_folder()
            metrics = MetricsWriter(learner.run_dir, METRIC_FIELDS,
                                    resume_step=learner.env_steps if config.resume else None,
                                    every_seconds=config.metrics_seconds, reductions=METRIC_REDUCTIONS,
                                    tracker=tracker(config, learner.run_dir, "ppo"))
            ahead = SampleAhead(sampler, config.num_samples) if config.sample_ahead else None
            try:
                _iterate(learner, sampler, ahead, metrics, evaluation, progress, started)
            finally:
                if ahead is not None:
                    ahead.close()
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM where the CLI turned it into Terminated
        stopped_by = "SIGTERM" if isinstance(error, Terminated) else "SIGINT"
        log.warning(learner.folder.stopping(f"interrupted ({stopped_by})"))
    except RunStoppedError as error:
        stopped_by = stopped_reason(error)
        log.warning(learner.folder.stopping(str(error)))
    except CheckpointError:  # a save failed (a full or read-only disk): the files written before stay as they are
        writable = False
        raise
    finally:
        progress.close()
        evaluation.close()
        seconds = learner.elapsed_before + time.monotonic() - started
        if metrics is not None and not writable:
            close_quietly(metrics)
        elif metrics is not None:  # else the run never started: no folder, no untrained weights
            _close_run_folder(learner, metrics, seconds)
    result = TrainResult(run_dir=learner.run_dir, solved=learner.solved, interrupted=stopped_by is not None,
                         env_steps=learner.env_steps, updates=learner.updates, seconds=seconds,
                         mean_return=learner.mean_return, best_mean_return=learner.best_mean_return,
                         episodes=learner.episodes, stopped_by=stopped_by)
    if metrics is not None:
        write_summary(learner.run_dir, result.summary())
    return result


def _iterate(learner: PpoLearner, sampler: Any, ahead: SampleAhead | None, metrics: MetricsWriter,
             evaluation: PeriodicEvaluation, progress: Progress, started: float) -> None:
    """Iterations until solved or the step budget ends: sample, update, record."""
    config = learner.config
    last_checkpoint = time.monotonic()
    while learner.env_steps < config.total_env_steps and not learner.solved:
        weights = learner.cpu_state_dict()
        batch = ahead.take(learner.updates, weights) if ahead else sampler.obtain_samples(
            learner.updates, config.num_samples, weights)
        learner.env_steps += int(batch.lengths.sum())
        learner.episodes += len(batch.lengths)
        learner.recent_returns.extend(episode_returns(batch))
        terms = ppo_update(learner.model, learner.optimizer, batch, config, learner.device, learner.generator)
        learner.updates += 1
        evaluated = evaluation.maybe_run(learner.model) or {}
        seconds = learner.elapsed_before + time.monotonic() - started
        metrics.write(learner.env_steps, {**evaluated,
            "seconds": seconds, "updates": learner.updates,
            "steps_per_second": learner.env_steps / max(seconds, 1e-9), "mean_return": learner.mean_return,
            "episodes": learner.episodes, "policy_loss": terms.policy, "value_loss": terms.value,
            "entropy": terms.entropy, "clip_fraction": terms.clip_fraction,
            "dropped_episodes": getattr(sampler, "dropped_episodes", 0)})
        if len(learner.recent_returns) >= 10 and improves(learner.mean_return, learner.best_mean_return):
            learner.best_mean_return = learner.mean_return
            learner.save_weights("best")
        if time.monotonic() - last_checkpoint > config.checkpoint_seconds:
            learner.checkpoint(seconds)
            metrics.flush()
            last_checkpoint = time.monotonic()
        progress.update(learner.env_steps, mean_return=learner.mean_return)


def _close_run_folder(learner: PpoLearner, metrics: MetricsWriter, seconds: float) -> None:
    """The run's end state on disk: checkpoint, final weights, metrics and the learning curve."""
    learner.checkpoint(seconds)
    learner.save_weights("final")
    metrics.close()
    try:
        plot_learning_curve(learner.run_dir / "metrics.csv", learner.run_dir / "learning_curve.png",
                            target=learner.target_return, title=f"PPO on {learner.config.env_id}")
    except Exception:  # a missing plot must not lose the run's other outputs
        log.exception("could not plot the learning curve")
