"""IMPALA with V-trace on rqrl's distributed actors, in one file.

Uses only the public ``DistributedActors`` API (``broadcast_updated_policy``, ``collect_outputs``),
so it runs on ``RedisDistributedActors``, ``SubprocDistributedActors`` or the in-process
``SerialDistributedActors``, and reads as a reference for writing one's own learner.

Reference: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures" (V-trace: section 4, equations 1-2 and the policy gradient of 4.2).

>>> config = ImpalaConfig(env_id="CartPole-v1", total_env_steps=20_000, workers=1)
>>> result = train(config)  # doctest: +SKIP
>>> result.solved, result.run_dir  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rqrl.algorithms.atari import REPEAT_ACTION_PROBABILITY_HELP, TERMINAL_ON_LIFE_LOSS_HELP, check_atari_options
from rqrl.algorithms.checkpoint import (
    TrainingState,
    load_checkpoint,
    load_into,
    load_weights,
    save_checkpoint,
    save_weights,
    weights_file,
)
from rqrl.algorithms.cnn import torso_for
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
    name_run_folder,
    stopped_reason,
    write_config,
)
from rqrl.algorithms.evaluation import PeriodicEvaluation, check_evaluation
from rqrl.algorithms.metrics import Bottleneck, MetricsWriter, plot_learning_curve, write_summary
from rqrl.algorithms.run_folder import RunFolder
from rqrl.algorithms.tracking import check_wandb, tracker
from rqrl.engine.devices import check_device
from rqrl.engine.observations import TensorObs, map_tree
from rqrl.engine.process import Terminated
from rqrl.engine.progress import Progress
from rqrl.engine.run_config import check_seconds
from rqrl.errors import CheckpointError, ConfigError, RunStoppedError
from rqrl.maze.actors import DistributedActors, RedisDistributedActors
from rqrl.maze.records import BatchedRecord

log = logging.getLogger(__name__)


@dataclass
class ImpalaConfig(Tracking):
    """Settings of one training run; each field is also a ``rqrl train`` flag."""

    env_id: str = field(default="CartPole-v1", metadata={"help": "Gymnasium env id (vector or image observations, "
                                                                  "Discrete actions; ALE/... for Atari)."})
    terminal_on_life_loss: bool = field(default=False, metadata={"help": TERMINAL_ON_LIFE_LOSS_HELP})
    repeat_action_probability: float | None = field(default=None, metadata={"help": REPEAT_ACTION_PROBABILITY_HELP})
    total_env_steps: int = field(default=2_000_000, metadata={"help": "Step budget: stop after this many env steps."})
    target_return: float | None = field(default=None, metadata={
        "help": "Stop when the mean return of the last 100 episodes reaches this (default: the env's threshold)."})
    n_actors: int = field(default=16, metadata={"help": "Number of actors (envs)."})
    n_rollout_steps: int = field(default=32, metadata={"help": "Steps per rollout (the V-trace horizon)."})
    batch_size: int = field(default=16, metadata={"help": "Rollouts per learner update."})
    queue_out_of_sync_factor: float = field(default=2.0, metadata={
        "help": "Out-of-sync queue bound, in batches (bounds the policy lag)."})
    workers: int | None = field(default=None, metadata={
        "help": "Local worker processes (default: one per core but the learner's, at least 1; with --redis-url 0: "
                "only external `rqrl worker`s)."})
    redis_url: str | None = field(default=None, metadata={"help": "Redis URL (default: an embedded private Redis)."})
    worker_redis_url: str | None = field(default=None, metadata={
        "help": "Redis URL of the local workers, if their ACL user is not the learner's (default: --redis-url)."})
    actors_per_job: int | None = field(default=None, metadata={
        "help": "Actors one job steps together with one batched policy call (default: n_actors / local workers; "
                "with external workers only, n_actors / the workers registered at the start, after "
                "--wait-for-workers, 1 if none). Larger is faster per worker, smaller spreads over more workers."})
    wait_for_workers: float = field(default=60.0, metadata={
        "help": "With external workers only and no --actors-per-job: seconds the start waits for the first `rqrl "
                "worker` to register, then until no more came for 3 s, and splits the actors over them (workers "
                "started with the learner, as compose starts them, come up over seconds); 0: no wait."})
    pop_ahead: bool = field(default=True, metadata={
        "help": "Pop and decode the next batch on a thread while the learner trains on this one (it pays with a "
                "GPU learner; two batches then wait unacknowledged, and the policy lag may be one batch more)."})
    weights_refresh_seconds: float = field(default=0.0, metadata={
        "help": "A worker checks for new weights at most this often (0: before every rollout): with many workers and "
                "an image policy (a Nature CNN is 6.7 MB) this bounds what the broadcasts send out of Redis, for "
                "rollouts up to this much older."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate."})
    discount: float = field(default=0.99, metadata={"help": "Discount factor gamma."})
    rho_bar: float = field(default=1.0, metadata={"help": "V-trace clip of the importance ratio in the TD errors."})
    c_bar: float = field(default=1.0, metadata={"help": "V-trace clip of the importance ratio in the traces."})
    pg_rho_bar: float = field(default=1.0, metadata={"help": "Clip of the importance ratio in the policy gradient."})
    entropy_coef: float = field(default=0.01, metadata={"help": "Weight of the entropy bonus."})
    value_coef: float = field(default=0.5, metadata={"help": "Weight of the value loss."})
    reward_scale: float = field(default=1.0, metadata={
        "help": "Factor on the rewards the learner trains on: value targets and value_loss are in these units, the "
                "returns reported are not (0.01 suits LunarLander's rewards of +-100)."})
    normalize_advantages: bool = field(default=False, metadata={
        "help": "Give the policy gradient's advantages zero mean and unit variance in each batch, whatever the "
                "rewards' scale and the value's bias."})
    max_grad_norm: float = field(default=10.0, metadata={"help": "Gradient norm clip."})
    hidden_size: int = field(default=64, metadata={"help": "Width of the two hidden layers of each MLP (image "
                                                           "observations: the Nature CNN's, 512)."})
    max_policy_lag: int | None = field(default=None, metadata={
        "help": "Drop rollouts made by weights more than this many updates old (default: keep all)."})
    seed: int = field(default=0, metadata={"help": "Seed of the model, env and agent seeds."})
    learner_device: str = field(default="cpu", metadata={"help": "Device of the learner: cpu, cuda, cuda:1..."})
    learner_threads: int = field(default=1, metadata={
        "help": "Torch CPU threads of the learner (1 leaves the other cores to local workers)."})
    run_dir: str = field(default="runs", metadata={"help": "Parent folder of run folders."})
    run_name: str | None = field(default=None, metadata={"help": "Run folder and Redis namespace (default: random)."})
    resume: str | None = field(default=None, metadata={
        "help": "Run folder or checkpoint file to continue from, with the run's recorded settings (config.json); "
                "flags given override them, but not the env or the network's sizes."})
    checkpoint_seconds: float = field(default=60.0, metadata={"help": "Write a checkpoint at least this often."})
    progress: bool = field(default=True, metadata={
        "help": "Show progress: a live bar on a terminal, else a plain line every --progress-seconds (a file, a "
                "pipe, a container log); --no-progress shows neither, the final summary always prints."})
    metrics_seconds: float = field(default=1.0, metadata={
        "help": "Seconds between two rows of metrics.csv and TensorBoard points: the updates between are averaged "
                "(losses, lags), or their last value kept (counters, returns); 0: a row per update."})
    learner_timeout: float = field(default=300.0, metadata={
        "help": "Seconds after this learner's last heartbeat (it dies or hangs) at which the run's jobs stop and "
                "free their workers; --resume re-runs them."})
    progress_seconds: float = field(default=10.0, metadata={
        "help": "Seconds between two progress lines when stderr is not a terminal."})

    def __post_init__(self) -> None:
        check_workers(self.workers)
        check_atari_options(self.env_id, self.terminal_on_life_loss, self.repeat_action_probability)
        check_wandb(self.wandb)
        check_evaluation(self.eval_every, self.eval_episodes)
        positive = ("total_env_steps", "n_actors", "n_rollout_steps", "batch_size", "learning_rate", "hidden_size",
                    "learner_threads", "progress_seconds",
                    "learner_timeout")
        for name in (*positive, "rho_bar", "c_bar", "pg_rho_bar", "max_grad_norm", "queue_out_of_sync_factor",
                     "reward_scale"):
            if not getattr(self, name) > 0:  # also refuses NaN
                raise ConfigError(f"expected {name} > 0, got {getattr(self, name)}")
        for name in ("total_env_steps", "n_actors", "n_rollout_steps", "batch_size", "hidden_size"):
            if not isinstance(getattr(self, name), int):
                raise ConfigError(f"expected {name} to be an int, got {getattr(self, name)!r}")
        if not 0 < self.discount <= 1:
            raise ConfigError(f"expected 0 < discount <= 1, got {self.discount}")
        if self.max_policy_lag is not None and self.max_policy_lag < 0:
            raise ConfigError(f"expected max_policy_lag >= 0, got {self.max_policy_lag}")
        if not self.metrics_seconds >= 0:
            raise ConfigError(f"expected metrics_seconds >= 0, got {self.metrics_seconds}")
        check_seconds("weights_refresh_seconds", self.weights_refresh_seconds)


class ActorCritic(nn.Module):
    """The policy's logits (``forward``) and the state's value (``values``): two separate tanh MLPs for vector
    observations, or two linear heads on one shared Nature CNN (rqrl.algorithms.cnn) for images (an ``obs_shape``
    ``(C, H, W)``). Actors use the module as a plain categorical policy."""

    def __init__(self, obs_shape: int | Sequence[int], n_actions: int, hidden_size: int = 64):
        super().__init__()
        self.torso, in_size = torso_for(obs_shape)

        def head(out: int, gain: float) -> nn.Sequential:
            last = nn.Linear(hidden_size if self.torso is None else in_size, out)
            layers: list[nn.Module] = [last]
            if self.torso is None:  # an MLP of its own
                layers = [nn.Linear(in_size, hidden_size), nn.Tanh(), nn.Linear(hidden_size, hidden_size), nn.Tanh(),
                          last]
            for layer in layers:
                if isinstance(layer, nn.Linear):
                    nn.init.orthogonal_(layer.weight, math.sqrt(2))
                    nn.init.zeros_(layer.bias)
            nn.init.orthogonal_(last.weight, gain)
            return nn.Sequential(*layers)

        self.policy = head(n_actions, 0.01)
        self.value = head(1, 1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """What the heads read: the CNN's features of images, the observations themselves (as float) otherwise."""
        return obs.float() if self.torso is None else self.torso(obs)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy(self.features(obs))

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value(self.features(obs)).squeeze(-1)

    def logits_and_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` and ``values`` together, through the CNN once."""
        features = self.features(obs)
        return self.policy(features), self.value(features).squeeze(-1)


def vtrace(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    bootstrap_discounts: torch.Tensor,
    trace_discounts: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets ``vs`` and policy-gradient advantages, all ``[T, B]`` time-major.

    ``next_values[t]`` is the value of the state after step t (``next_obs`` at the rollout's end,
    the final observation where an episode was truncated); ``bootstrap_discounts`` is gamma
    except 0 where the episode terminated; ``trace_discounts`` is gamma except 0 wherever an
    episode ended (terminated or truncated), so traces never cross into the next episode.
    """
    with torch.no_grad():
        rhos = torch.exp(target_log_probs - behaviour_log_probs)
        clipped_rhos = rhos.clamp(max=rho_bar)
        cs = rhos.clamp(max=c_bar)
        deltas = clipped_rhos * (rewards + bootstrap_discounts * next_values - values)
        corrections = torch.zeros_like(values)
        carry = torch.zeros_like(values[0])
        for t in reversed(range(values.shape[0])):
            carry = deltas[t] + trace_discounts[t] * cs[t] * carry
            corrections[t] = carry
        vs = values + corrections
        # the target of the state after step t: vs[t+1] inside an episode, else its bootstrap value
        continues = trace_discounts > 0
        vs_next = next_values.clone()
        vs_next[:-1] = torch.where(continues[:-1], vs[1:], next_values[:-1])
        advantages = rhos.clamp(max=pg_rho_bar) * (rewards + bootstrap_discounts * vs_next - values)
    return vs, advantages


def vector_obs(obs: TensorObs) -> torch.Tensor:
    """A batch's observations as the one tensor the networks take (vectors, or images); refuses dict observations."""
    if not isinstance(obs, torch.Tensor):
        raise ConfigError(f"IMPALA here takes vector observations, got a dict observation with keys {sorted(obs)}; "
                          f"flatten it, e.g. with gymnasium.wrappers.FlattenObservation in the env factory")
    return obs


def next_state_values(model: ActorCritic, record: BatchedRecord, values: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, B]`` values of the state after each step: obs[t+1], next_obs at the end, final_obs at truncations.
    ``values``: those of ``record.obs`` where the caller has them, so that only next_obs and the final observations
    go through the model again."""
    with torch.no_grad():
        if values is None:
            values = model.values(torch.cat([vector_obs(record.obs)[1:], vector_obs(record.next_obs).unsqueeze(0)]))
        else:
            values = torch.cat([values.detach()[1:], model.values(vector_obs(record.next_obs)).unsqueeze(0)])
        if len(record.final_obs_index):
            steps, columns = record.final_obs_index[:, 0], record.final_obs_index[:, 1]
            values[steps, columns] = model.values(vector_obs(record.final_obs))
    return values


@dataclass
class LossTerms:
    total: torch.Tensor
    policy: float
    value: float
    entropy: float
    mean_rho: float
    grad_norm: float = math.nan
    """The gradient's norm before clipping (Learner.update sets it)."""


def impala_loss(model: ActorCritic, record: BatchedRecord, config: ImpalaConfig) -> LossTerms:
    """The IMPALA loss on one batch: V-trace policy gradient + value regression - entropy bonus."""
    logits, values = model.logits_and_values(vector_obs(record.obs))
    log_probs_all = torch.log_softmax(logits, dim=-1)
    target_log_probs = log_probs_all.gather(-1, record.actions.long().unsqueeze(-1)).squeeze(-1)
    terminated = record.terminated.float()
    episode_ended = (record.terminated | record.truncated).float()
    vs, advantages = vtrace(
        record.log_probs, target_log_probs.detach(), config.reward_scale * record.rewards, values.detach(),
        next_state_values(model, record, values),
        bootstrap_discounts=config.discount * (1.0 - terminated),
        trace_discounts=config.discount * (1.0 - episode_ended),
        rho_bar=config.rho_bar, c_bar=config.c_bar, pg_rho_bar=config.pg_rho_bar,
    )
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
    policy_loss = -(target_log_probs * advantages).mean()
    value_loss = 0.5 * (vs - values).pow(2).mean()
    entropy = -(log_probs_all.exp() * log_probs_all).sum(-1).mean()
    total = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    mean_rho = torch.exp(target_log_probs.detach() - record.log_probs).mean()
    return LossTerms(total, float(policy_loss.detach()), float(value_loss.detach()), float(entropy.detach()),
                     float(mean_rho))


def drop_stale(record: BatchedRecord, learner_version: int, max_policy_lag: int | None) -> BatchedRecord | None:
    """The batch without rollouts whose policy lag exceeds ``max_policy_lag`` (None if none is left)."""
    if max_policy_lag is None:
        return record
    keep = (learner_version - record.policy_version) <= max_policy_lag
    if bool(keep.all()):
        return record
    if not bool(keep.any()):
        return None
    columns = torch.nonzero(keep).squeeze(-1)
    remap = torch.full((record.batch_size,), -1, dtype=torch.long, device=keep.device)
    remap[columns] = torch.arange(len(columns), device=keep.device)
    final_keep = keep[record.final_obs_index[:, 1]] if len(record.final_obs_index) else keep[:0]
    final_index = record.final_obs_index[final_keep].clone()
    if len(final_index):
        final_index[:, 1] = remap[final_index[:, 1]]
    return BatchedRecord(
        obs=map_tree(lambda tensor: tensor[:, columns], record.obs),
        actions=record.actions[:, columns], rewards=record.rewards[:, columns],
        terminated=record.terminated[:, columns], truncated=record.truncated[:, columns],
        log_probs=record.log_probs[:, columns],
        logits=record.logits[:, columns] if record.logits is not None else None,
        next_obs=map_tree(lambda tensor: tensor[columns], record.next_obs),
        final_obs=map_tree(lambda tensor: tensor[final_keep], record.final_obs), final_obs_index=final_index,
        policy_version=record.policy_version[columns], actor_id=record.actor_id[columns],
        rollout_id=record.rollout_id[columns], worker=tuple(record.worker[int(c)] for c in columns),
        episode_returns=record.episode_returns, episode_lengths=record.episode_lengths,
        continues_previous=record.continues_previous[columns] if record.continues_previous is not None else None,
    )


def make_actors(config: ImpalaConfig, model: ActorCritic, *, secret: str | bytes | None = None,
                redis_server: str | None = None) -> DistributedActors:
    """The default actors: rqrl's Redis engine, embedded Redis unless ``redis_url`` is given; ``secret``
    (the workers' RQRL_SECRET) is needed with an external Redis, ``redis_server`` is the embedded one's binary."""
    seeds = np.random.SeedSequence(config.seed).generate_state(2 * config.n_actors).tolist()
    workers = config.workers
    if workers is None and not (config.redis_url or os.environ.get("REDIS_URL")):
        workers = max(1, (os.cpu_count() or 1) - 1)  # measured: a core of its own for the learner pays off
    actor_policy = copy.deepcopy(model).to("cpu")  # workers need no GPU: ship the architecture on the CPU
    return RedisDistributedActors(
        env_factory(config), actor_policy, config.n_rollout_steps, config.n_actors,
        config.batch_size, config.queue_out_of_sync_factor,
        actor_env_seeds=seeds[: config.n_actors], actor_agent_seeds=seeds[config.n_actors:],
        redis_url=config.redis_url, worker_redis_url=config.worker_redis_url, run_name=config.run_name,
        n_local_workers=workers,
        actors_per_job=config.actors_per_job,
        start_method="forkserver", resume=config.resume is not None, secret=secret, redis_server=redis_server,
        learner_timeout=config.learner_timeout, wait_for_workers=config.wait_for_workers,
        pop_ahead=config.pop_ahead, weights_refresh_seconds=config.weights_refresh_seconds,
    )


class Learner(ResumableLearner):
    """The training loop's state: model, optimizer, counters, recent returns, run folder."""

    def __init__(self, config: ImpalaConfig):
        check_device("--learner-device", config.learner_device)
        check_resume(config, "impala")
        self.config = config = dataclasses.replace(config)  # its own copy: the caller's config stays as given
        obs_shape, n_actions, threshold = env_spaces(config.env_id)
        self.target_return = config.target_return if config.target_return is not None else threshold
        if self.target_return is None:
            log.warning("%s has no reward threshold and no --target-return: training runs to its step budget",
                        config.env_id)
        torch.manual_seed(config.seed)
        torch.set_num_threads(config.learner_threads)
        self.device = torch.device(config.learner_device)
        self.model = ActorCritic(obs_shape, n_actions, config.hidden_size).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate, eps=1e-5)
        self.env_steps = self.updates = self.episodes = 0
        self.elapsed_before = 0.0
        self.recent_returns: deque[float] = deque(maxlen=100)
        self.best_mean_return: float | None = None
        self.run_dir = name_run_folder(config, "impala")
        self.folder = RunFolder(self.run_dir, config.resume)  # held before the checkpoint is read: one learner reads
        if config.resume:
            held_while(self.folder, functools.partial(self._resume, config.resume))

    def open_run_folder(self) -> None:
        """The run folder and its config.json, once the run has started: a launch that fails leaves none."""
        self.folder.open()
        write_config(self.run_dir, self.config, "impala")

    def _load(self, checkpoint_path: Path) -> None:
        """Model, optimizer and counters from the checkpoint file; ConfigError if it is another run's kind."""
        state = load_checkpoint(checkpoint_path, str(self.device))
        check_checkpoint(checkpoint_path, state.counters, self.config, "impala")
        fix = "resume with the settings it was trained with (--hidden-size, --env-id)"
        load_into(self.model, state.model, checkpoint_path, fix)
        load_into(self.optimizer, state.optimizer, checkpoint_path, fix)
        counters = state.counters
        self.env_steps, self.updates = counters["env_steps"], counters["updates"]
        self.episodes, self.elapsed_before = counters["episodes"], counters["seconds"]
        self.recent_returns.extend(counters.get("recent_returns", []))

    def update(self, record: BatchedRecord) -> LossTerms:
        terms = impala_loss(self.model, record, self.config)
        self.optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        terms.grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
        self.optimizer.step()
        self.updates += 1
        return terms

    def checkpoint(self, seconds: float) -> None:
        counters = {"algo": "impala", "env_id": self.config.env_id, "hidden_size": self.config.hidden_size,
                    "env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
                    "seconds": seconds, "recent_returns": list(self.recent_returns),
                    "best_mean_return": self.best_mean_return}
        save_checkpoint(self.run_dir / "checkpoint.safetensors",
                        TrainingState(self.model.state_dict(), self.optimizer.state_dict(), counters))

    def save_weights(self, name: str) -> None:
        save_weights(self.run_dir / f"{name}.safetensors", self.model.state_dict(),
                     {"env_id": self.config.env_id, "hidden_size": self.config.hidden_size,
                      "env_steps": self.env_steps, "updates": self.updates, "mean_return": self.mean_return})


METRIC_FIELDS = ["seconds", "updates", "steps_per_second", "mean_return", "episodes", "policy_lag_mean",
                 "policy_lag_max", "queue_size", "policy_loss", "value_loss", "entropy", "mean_rho", "dropped",
                 "steps_per_second_10s", "policy_lag_min", "workers_alive", "records_rejected", "dequeue_seconds",
                 "update_seconds", "eval_return", "eval_return_std", "eval_seconds", "grad_norm"]
"""metrics.csv's columns and TensorBoard's scalars: steps_per_second is the average since the start,
steps_per_second_10s over the last 10 s; the lags are those of the rollouts trained on; dequeue_seconds is
collect_outputs' wait, update_seconds the gradient step and broadcast; grad_norm the gradient's norm before
--max-grad-norm clips it; the eval_ figures are those of an evaluation
(--eval-every), in the rows after one. A row covers the updates since the last
(metrics_seconds): METRIC_REDUCTIONS says how each figure is reduced over them, the others are the last update's."""
METRIC_REDUCTIONS = {
    **dict.fromkeys(("policy_loss", "value_loss", "entropy", "mean_rho", "policy_lag_mean", "queue_size",
                     "dequeue_seconds", "update_seconds", "grad_norm"), "mean"),
    "policy_lag_max": "max", "policy_lag_min": "min", "dropped": "sum"}


def train(config: ImpalaConfig, actors: DistributedActors | None = None, *, secret: str | bytes | None = None,
          redis_server: str | None = None) -> TrainResult:
    """Train until solved, the step budget ends, or Ctrl-C; always leaves a checkpoint behind. ``secret``
    and ``redis_server`` go to the default actors (see make_actors)."""
    learner = Learner(config)
    with closing(learner.folder):
        return _train(learner, learner.config, actors, secret, redis_server)


def _train(learner: Learner, config: ImpalaConfig, actors: DistributedActors | None, secret: str | bytes | None,
           redis_server: str | None) -> TrainResult:
    actors = actors if actors is not None else make_actors(config, learner.model, secret=secret,
                                                           redis_server=redis_server)
    loop = _TrainingLoop(learner, actors)
    stopped_by: str | None = None
    try:
        with actors:
            loop.run()
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM where the CLI turned it into Terminated
        stopped_by = "SIGTERM" if isinstance(error, Terminated) else "SIGINT"
        log.warning(learner.folder.stopping(f"interrupted ({stopped_by})"))
    except RunStoppedError as error:
        stopped_by = stopped_reason(error)
        log.warning(learner.folder.stopping(str(error)))
    except CheckpointError:  # a save failed (a full or read-only disk): the files written before stay as they are
        loop.writable = False
        raise
    finally:
        seconds = loop.close()
    result = TrainResult(run_dir=learner.run_dir, solved=learner.solved, interrupted=stopped_by is not None,
                         env_steps=learner.env_steps, updates=learner.updates, seconds=seconds,
                         mean_return=learner.mean_return, best_mean_return=learner.best_mean_return,
                         episodes=learner.episodes, stopped_by=stopped_by, bottleneck=loop.bottleneck.verdict(),
                         bottleneck_detail=loop.bottleneck.explain())
    if loop.metrics is not None:
        write_summary(learner.run_dir, result.summary())
    return result


class _TrainingLoop:
    """IMPALA's loop: collect a batch, update, broadcast, and write what happened (metrics, progress, best
    weights, checkpoints, the bottleneck's timings)."""

    def __init__(self, learner: Learner, actors: DistributedActors):
        config = self.config = learner.config
        self.learner, self.actors = learner, actors
        self.metrics: MetricsWriter | None = None
        """Made once the run has started (run())."""
        self.writable = True
        """False once a save failed: close() then writes no end state over the files that stay."""
        self.progress = Progress(f"IMPALA {config.env_id}", total=config.total_env_steps, initial=learner.env_steps,
                                 enabled=config.progress, interval=config.progress_seconds)
        self.started = self.last_checkpoint = self.step_started = time.monotonic()
        self.bottleneck = Bottleneck()
        self.evaluation = PeriodicEvaluation(
            config.env_id, config.eval_every, config.eval_episodes, config.seed,
            repeat_action_probability=config.repeat_action_probability)

    @property
    def seconds(self) -> float:
        """Training time of the run, earlier sessions of a resumed run included."""
        return self.learner.elapsed_before + time.monotonic() - self.started

    def run(self) -> None:
        learner, actors = self.learner, self.actors
        actors.broadcast_updated_policy(learner.model.state_dict())
        learner.open_run_folder()
        self.metrics = MetricsWriter(learner.run_dir, METRIC_FIELDS,
                                     resume_step=learner.env_steps if self.config.resume else None,
                                     every_seconds=self.config.metrics_seconds, reductions=METRIC_REDUCTIONS,
                                     tracker=tracker(self.config, learner.run_dir, "impala"))
        self.progress.announce_redis(str(self.config.run_name), getattr(actors, "redis_url", None))
        self.step_started = time.monotonic()
        while learner.env_steps < self.config.total_env_steps and not learner.solved:
            record, queue_size, _, dequeue_seconds = actors.collect_outputs(str(learner.device))
            self.step(record, queue_size, dequeue_seconds)

    def step(self, record: BatchedRecord, queue_size: int, dequeue_seconds: float) -> None:
        """Count a collected batch, train on what is fresh enough, and write it down."""
        learner, actors = self.learner, self.actors
        learner_version = actors.policy_version
        lags = (learner_version - record.policy_version).float()
        learner.env_steps += record.n_steps * record.batch_size
        learner.episodes += len(record.episode_returns)
        learner.recent_returns.extend(record.episode_returns.tolist())
        workers = _workers_alive(actors)
        self.progress.update(learner.env_steps, mean_return=learner.mean_return, lag=float(lags.mean()),
                             lag_max=float(lags.max()), queue=queue_size, queue_bound=_queue_bound(actors),
                             workers=workers)
        fresh = drop_stale(record, learner_version, self.config.max_policy_lag)
        if fresh is None:
            return
        update_started = time.perf_counter()
        terms = learner.update(fresh)
        actors.broadcast_updated_policy(learner.model.state_dict())
        update_seconds = time.perf_counter() - update_started
        trained_lag = (learner_version - fresh.policy_version).float()
        evaluated = self.evaluation.maybe_run(learner.model) or {}
        assert self.metrics is not None, "run() made it"
        self.metrics.write(learner.env_steps, {**evaluated,
            "seconds": self.seconds, "updates": learner.updates,
            "steps_per_second": learner.env_steps / max(self.seconds, 1e-9), "mean_return": learner.mean_return,
            "episodes": learner.episodes, "policy_lag_mean": float(trained_lag.mean()),
            "policy_lag_max": float(trained_lag.max()), "queue_size": queue_size,
            "policy_loss": terms.policy, "value_loss": terms.value, "entropy": terms.entropy,
            "mean_rho": terms.mean_rho, "dropped": record.batch_size - fresh.batch_size,
            "steps_per_second_10s": self.progress.throughput.rate(), "policy_lag_min": float(trained_lag.min()),
            "workers_alive": workers, "records_rejected": _records_rejected(actors),
            "dequeue_seconds": dequeue_seconds, "update_seconds": update_seconds, "grad_norm": terms.grad_norm,
        })
        self.save()
        self.time_step(queue_size, dequeue_seconds)

    def save(self) -> None:
        """The best weights when the mean return improved; a checkpoint every checkpoint_seconds."""
        learner = self.learner
        if len(learner.recent_returns) >= 10 and improves(learner.mean_return, learner.best_mean_return):
            learner.best_mean_return = learner.mean_return
            learner.save_weights("best")
        if time.monotonic() - self.last_checkpoint > self.config.checkpoint_seconds and self.metrics is not None:
            learner.checkpoint(self.seconds)
            self.metrics.flush()
            self.last_checkpoint = time.monotonic()
        if learner.updates % 100 == 0:  # epochs of 100 updates keep the actors' statistics bounded
            self.actors.get_epoch_stats_aggregator().reduce()

    def time_step(self, queue_size: int, dequeue_seconds: float) -> None:
        """Feed the bottleneck: how long the learner waited for this batch, and whether the queue was full."""
        now, bound = time.monotonic(), _queue_bound(self.actors)
        # waiting: the collect's idle time where the actors measure it, not its popping and decoding
        waited = dequeue_seconds if self.actors.last_wait_seconds is None else self.actors.last_wait_seconds
        self.bottleneck.add(waited, now - self.step_started, bound is not None and queue_size >= bound)
        self.step_started = now

    def close(self) -> float:
        """The run's end state on disk (checkpoint, final weights, metrics, plot); returns its training time."""
        self.progress.close()
        self.evaluation.close()
        seconds = self.seconds
        if self.metrics is None:  # the run never started: no folder, no untrained weights for evaluate or --resume
            return seconds
        if not self.writable:
            close_quietly(self.metrics)
            return seconds
        self.learner.checkpoint(seconds)
        self.learner.save_weights("final")
        self.metrics.close()
        _plot(self.learner)
        return seconds


def _plot(learner: Learner) -> None:
    try:
        plot_learning_curve(learner.run_dir / "metrics.csv", learner.run_dir / "learning_curve.png",
                            target=learner.target_return, title=f"IMPALA on {learner.config.env_id}")
    except Exception:  # a missing plot must not lose the run's other outputs
        log.exception("could not plot the learning curve")


def _workers_alive(actors: DistributedActors) -> int | None:
    """Live workers of Redis actors (re-read at most once a second), else None."""
    return actors.workers_alive() if isinstance(actors, RedisDistributedActors) else None


def _records_rejected(actors: DistributedActors) -> int | None:
    return actors.records_rejected if isinstance(actors, RedisDistributedActors) else None


def _queue_bound(actors: DistributedActors) -> int | None:
    return actors.queue_capacity if isinstance(actors, RedisDistributedActors) else None


def load_policy(path: str | Path, device: str = "cpu") -> tuple[ActorCritic, dict[str, Any]]:
    """An ActorCritic with the weights of a run folder (best, else final) or of a weights file."""
    path = weights_file(path)
    state_dict, metadata = load_weights(path, device)
    if "counters" in metadata:  # a training checkpoint: model tensors under "model.", run facts in counters
        state_dict = load_checkpoint(path, device).model
        metadata = metadata["counters"]
    if "env_id" not in metadata or "hidden_size" not in metadata:
        raise ConfigError(f"{path} names no env_id and hidden_size: it is not an rqrl IMPALA weights file")
    obs_shape, n_actions, _ = env_spaces(metadata["env_id"])
    model = ActorCritic(obs_shape, n_actions, int(metadata["hidden_size"])).to(device)
    model.load_state_dict(state_dict)
    return model.eval(), metadata
