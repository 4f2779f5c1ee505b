"""Rainbow-style DQN through the SEED trainer (``rqrl.seed``), in one file: what ``rqrl train dqn`` runs.

Writes the same run folder as the IMPALA learner: ``config.json``, ``metrics.csv`` (+ TensorBoard events),
``best.safetensors`` and ``final.safetensors`` (the online network's weights), ``checkpoint.safetensors`` (online
and target networks, optimizer state and counters, for ``resume``), ``learning_curve.png`` and ``summary.json``.
The replay buffer is not saved: a resumed run starts with an empty replay and trains again once it holds
``minimum_buffer_size`` transitions.

>>> config = DqnConfig(env_id="CartPole-v1", seconds=300)
>>> result = train(config)  # doctest: +SKIP
>>> result.solved, result.run_dir  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rqrl.algorithms.atari import REPEAT_ACTION_PROBABILITY_HELP, TERMINAL_ON_LIFE_LOSS_HELP, check_atari_options
from rqrl.algorithms.checkpoint import (
    TrainingState,
    load_checkpoint,
    load_weights,
    recorded_mean_return,
    save_checkpoint,
    save_weights,
    weights_file,
)
from rqrl.algorithms.cnn import torso_for
from rqrl.algorithms.common import (
    Tracking,
    TrainResult,
    check_checkpoint,
    check_resume,
    check_unfinished,
    checkpoint_to_resume,
    close_quietly,
    env_factory,
    env_spaces,
    held_while,
    improves,
    name_run_folder,
    write_config,
)
from rqrl.algorithms.evaluation import PeriodicEvaluation, check_evaluation
from rqrl.algorithms.metrics import MetricsWriter, plot_learning_curve, write_summary
from rqrl.algorithms.run_folder import RunFolder
from rqrl.algorithms.tracking import check_wandb, tracker
from rqrl.engine.devices import check_device
from rqrl.engine.process import Terminated
from rqrl.engine.progress import Progress
from rqrl.errors import CheckpointError, ConfigError
from rqrl.seed import Config, Trainer
from rqrl.seed.agent import Agent, AgentConfig, QModel

log = logging.getLogger(__name__)

METRIC_FIELDS = ["seconds", "train_steps", "steps_per_second", "mean_return", "episodes", "weights_version",
                 "replay_size", "replay_megabytes", "eval_return", "eval_return_std", "eval_seconds"]


@dataclass
class DqnConfig(Tracking):
    """Settings of one DQN run; each field's ``metadata["help"]`` is its one-line help."""

    env_id: str = field(default="CartPole-v1", metadata={"help": "Gymnasium env id (vector or image observations, "
                                                                  "Discrete actions; ALE/... for Atari)."})
    terminal_on_life_loss: bool = field(default=False, metadata={"help": TERMINAL_ON_LIFE_LOSS_HELP})
    repeat_action_probability: float | None = field(default=None, metadata={"help": REPEAT_ACTION_PROBABILITY_HELP})
    seconds: float = field(default=600.0, metadata={
        "help": "Time budget of the run, all its sessions together (as --total-env-steps): a resumed run trains for "
                "what is left of it."})
    total_env_steps: int = field(default=2_000_000, metadata={"help": "Step budget: stop after this many env steps."})
    target_return: float | None = field(default=None, metadata={
        "help": "Stop when the mean return of the last 100 episodes reaches this (default: the env's threshold)."})
    actor_processes: int = field(default=1, metadata={"help": "Actor processes."})
    actor_threads: int = field(default=4, metadata={"help": "Env threads per actor process."})
    inference_servers: int = field(default=1, metadata={"help": "Inference server processes."})
    inference_batchsize: int = field(default=4, metadata={"help": "Most observations per forward pass."})
    inference_delay: float = field(default=0.005, metadata={"help": "Most seconds a batch waits for more requests."})
    n_step: int = field(default=3, metadata={"help": "Rewards summed per transition."})
    epsilon: float = field(default=0.01, metadata={
        "help": "Probability of a random action at each actor step (the training returns that decide 'solved' "
                "are these actors')."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate."})
    discount: float = field(default=0.99, metadata={"help": "Discount factor gamma."})
    hidden_size: int = field(default=128, metadata={"help": "Width of the two hidden layers of the Q-network (image "
                                                            "observations: the Nature CNN's, 512)."})
    batch_size: int = field(default=64, metadata={"help": "Transitions per train step."})
    replay_capacity: int = field(default=50_000, metadata={
        "help": "Transitions the replay holds (Atari: ~7 KB each, every frame held once; 50,000 take ~350 MB, "
                "1M ~6.6 GB)."})
    minimum_buffer_size: int = field(default=1000, metadata={"help": "Transitions before training starts."})
    target_update_steps: int = field(default=100, metadata={"help": "Train steps between target-network copies."})
    max_train_frequency: float = field(default=-1, metadata={"help": "Most train steps per second; <= 0: no limit."})
    replay_ratio: float = field(default=4.0, metadata={
        "help": "Most transitions sampled for training per transition received; <= 0: no limit (the learner then "
                "trains as fast as its CPU allows, and replays each transition more the slower the actors are)."})
    distributional: bool = field(default=False, metadata={"help": "C51 distributional head."})
    dueling: bool = field(default=False, metadata={"help": "Dueling head."})
    v_min: float = field(default=0.0, metadata={"help": "Smallest return of the distributional support."})
    v_max: float = field(default=100.0, metadata={"help": "Largest return of the distributional support."})
    seed: int = field(default=0, metadata={"help": "Seed of the network, the replay and the actors."})
    learner_device: str = field(default="cpu", metadata={"help": "Device of the learner: cpu, cuda, ..."})
    inference_device: str = field(default="cpu", metadata={"help": "Device of the inference servers."})
    learner_threads: int = field(default=1, metadata={"help": "Torch CPU threads of the learner."})
    redis_url: str | None = field(default=None, metadata={"help": "Redis URL (default: an embedded private Redis)."})
    run_dir: str = field(default="runs", metadata={"help": "Parent folder of run folders."})
    run_name: str | None = field(default=None, metadata={"help": "Run folder and Redis namespace (default: random)."})
    resume: str | None = field(default=None, metadata={
        "help": "Run folder or checkpoint file to continue from (networks, optimizer, counters; the replay starts "
                "empty and refills to minimum_buffer_size)."})
    checkpoint_seconds: float = field(default=60.0, metadata={"help": "Write a checkpoint at least this often."})
    progress: bool = field(default=True, metadata={
        "help": "Show progress: a live bar on a terminal, else a plain line every progress_seconds."})
    progress_seconds: float = field(default=10.0, metadata={
        "help": "Seconds between two progress lines when stderr is not a terminal."})

    def __post_init__(self) -> None:
        check_atari_options(self.env_id, self.terminal_on_life_loss, self.repeat_action_probability)
        check_wandb(self.wandb)
        check_evaluation(self.eval_every, self.eval_episodes)
        for name in ("seconds", "total_env_steps", "hidden_size", "learning_rate", "learner_threads",
                     "checkpoint_seconds", "progress_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"expected {name} > 0, got {getattr(self, name)!r}")


class QNetwork(nn.Module):
    """A two-hidden-layer ReLU MLP for vector observations, or a linear layer on the Nature CNN (rqrl.algorithms.cnn)
    for images (an ``obs_shape`` ``(C, H, W)``), with the output shape the agent's head expects (see
    rqrl.seed.agent)."""

    def __init__(self, obs_shape: int | Sequence[int], n_actions: int, hidden_size: int, atoms: int | None,
                 dueling: bool):
        super().__init__()
        self.n_outputs, self.atoms, self.dueling = n_actions + int(dueling), atoms, dueling
        self.torso, in_size = torso_for(obs_shape)
        outputs = self.n_outputs * (atoms or 1)
        self.layers = (nn.Linear(in_size, outputs) if self.torso is not None else nn.Sequential(
            nn.Linear(in_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, hidden_size), nn.ReLU(),
            nn.Linear(hidden_size, outputs)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.layers(obs.flatten(1).float() if self.torso is None else self.torso(obs))
        if self.atoms is None:
            return out
        logits = out.view(len(obs), self.n_outputs, self.atoms)
        return logits if self.dueling else torch.softmax(logits, dim=-1)  # dueling: the head takes logits


def save_agent_checkpoint(path: str | Path, agent: Agent, counters: dict[str, Any]) -> None:
    """Write the agent's online and target networks, its optimizer state and ``counters`` (no replay)."""
    model = {**{f"online.{key}": value for key, value in agent.model_instance.state_dict().items()},
             **{f"target.{key}": value for key, value in agent.target.state_dict().items()}}
    save_checkpoint(path, TrainingState(model, agent.optimizer.state_dict(),
                                        {**counters, "agent_train_steps": agent.train_steps}))


def load_agent_checkpoint(path: str | Path, agent: Agent, config: DqnConfig | None = None) -> dict[str, Any]:
    """Load what save_agent_checkpoint wrote into ``agent`` (a run folder or the file); returns the counters.
    ``config``: the resumed run's, whose network-shaping settings the checkpoint's must match (check_checkpoint)."""
    path = Path(path)
    checkpoint_path = path / "checkpoint.safetensors" if path.is_dir() else path
    state = load_checkpoint(checkpoint_path, str(agent.device))
    if state.counters.get("algo") != "dqn":
        raise ConfigError(f"{checkpoint_path} is no DQN checkpoint (algo {state.counters.get('algo', 'impala')!r}); "
                          f"resume it with `rqrl train --resume`, which takes the run's own algorithm")
    if config is not None:
        check_checkpoint(checkpoint_path, state.counters, config, "dqn")
    try:
        for prefix, module in (("online.", agent.model_instance), ("target.", agent.target)):
            module.load_state_dict({key[len(prefix):]: value for key, value in state.model.items()
                                    if key.startswith(prefix)})
        agent.optimizer.load_state_dict(state.optimizer)
    except (RuntimeError, ValueError, KeyError) as error:
        raise ConfigError(f"{checkpoint_path} does not fit this network (env {state.counters.get('env_id')!r}): "
                          f"resume with the settings it was trained with (--hidden-size, --distributional, "
                          f"--dueling): {error}") from error
    agent.train_steps = int(state.counters["agent_train_steps"])
    return state.counters


def train(config: DqnConfig, *, secret: str | bytes | None = None, redis_server: str | None = None) -> TrainResult:
    """Train until solved, the time or step budget ends, or Ctrl-C/SIGTERM; always leaves a checkpoint behind."""
    check_device("--learner-device", config.learner_device)
    check_device("--inference-device", config.inference_device)
    check_resume(config, "dqn")
    run = _DqnRun(config)
    with closing(run.folder):
        return _train(run, run.config, secret, redis_server)


def _train(run: _DqnRun, config: DqnConfig, secret: str | bytes | None, redis_server: str | None) -> TrainResult:
    trainer = Trainer(run.agent, run.seed_config(secret, redis_server), env_factory(config), on_progress=run.tick)
    stopped_by: str | None = None
    try:
        trainer.start(run.seconds_left())
        if trainer.stopped_from_outside:
            stopped_by = "rqrl stop"
            log.warning(run.folder.stopping("stopped by rqrl stop"))
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM where the CLI turned it into Terminated
        stopped_by = "SIGTERM" if isinstance(error, Terminated) else "SIGINT"
        log.warning(run.folder.stopping(f"interrupted ({stopped_by})"))
    except CheckpointError:  # a save failed (a full or read-only disk): the files written before stay as they are
        run.writable = False
        raise
    finally:
        run.close(trainer)
    final = run.counters(trainer)
    result = TrainResult(run_dir=run.run_dir, solved=run.solved(trainer), interrupted=stopped_by is not None,
                         env_steps=final["env_steps"], updates=final["train_steps"], seconds=final["seconds"],
                         mean_return=run.mean_return(trainer), best_mean_return=run.best, episodes=final["episodes"],
                         stopped_by=stopped_by,
                         budget="step" if final["env_steps"] >= config.total_env_steps else "time")
    if run.metrics is not None:  # the run started
        write_summary(run.run_dir, result.summary())
    return result


class _DqnRun:
    """One DQN run's agent, run folder and bookkeeping; ``tick`` is the SEED trainer's progress callback (about
    once a second): a metrics row, the progress line, best weights, checkpoints, and the stop once solved."""

    def __init__(self, config: DqnConfig):
        self.config = config = dataclasses.replace(config)  # its own copy: the caller's config stays as given
        obs_shape, n_actions, threshold = env_spaces(config.env_id)
        self.target_return = config.target_return if config.target_return is not None else threshold
        torch.manual_seed(config.seed)
        torch.set_num_threads(config.learner_threads)
        self.run_dir = name_run_folder(config, "dqn")
        self.run_name = self.run_dir.name
        self.agent_config = AgentConfig(
            state_shape=obs_shape, state_dtype="uint8" if len(obs_shape) == 3 else "float32",
            action_space_size=n_actions, replay_capacity=config.replay_capacity,
            batch_size=config.batch_size, target_update_steps=config.target_update_steps,
            discount_factor=config.discount, use_distributional=config.distributional, v_min=config.v_min,
            v_max=config.v_max, dueling=config.dueling, huber_loss=True, network_device=config.learner_device,
            seed=config.seed)
        network = functools.partial(QNetwork, obs_shape, n_actions, config.hidden_size,
                                    self.agent_config.n_atoms if config.distributional else None, config.dueling)
        self.agent = Agent(self.agent_config, network, functools.partial(torch.optim.Adam, lr=config.learning_rate))
        self.before: dict[str, Any] = {"env_steps": 0, "train_steps": 0, "episodes": 0, "seconds": 0.0,
                                       "recent_returns": [], "best_mean_return": None, "weights_version": 0}
        self.best: float | None = None
        self.folder = RunFolder(self.run_dir, config.resume)  # held before the checkpoint is read: one learner reads
        held_while(self.folder, self._resume_and_prepare)

    def _resume_and_prepare(self) -> None:
        if self.config.resume:
            self._resume(self.config.resume)
        self._prepare()

    def _resume(self, resume: str) -> None:
        """Take the counters and networks of the run ``resume`` names, and the best return of the best.safetensors
        this run writes (newer than the checkpoint's); ConfigError if they do not fit or nothing is left to train."""
        config = self.config
        checkpoint_path = checkpoint_to_resume(resume)
        if checkpoint_path is not None:
            self.before.update(load_agent_checkpoint(checkpoint_path, self.agent, config))
        self.best = recorded_mean_return(self.run_dir / "best.safetensors")
        mean, solved = self._judged(self.before["recent_returns"][-100:])
        check_unfinished(resume, env_steps=int(self.before["env_steps"]), total_env_steps=config.total_env_steps,
                         solved=solved, mean_return=mean, target_return=self.target_return,
                         seconds=float(self.before["seconds"]), time_budget=config.seconds)
        if checkpoint_path is not None:  # said once the run goes on: a finished one is refused above
            log.warning("resumed from %s at %d env steps; the replay starts empty and refills to %d transitions",
                        checkpoint_path, self.before["env_steps"], config.minimum_buffer_size)

    def seconds_left(self) -> float:
        """What is left of the time budget (--seconds), which counts every session of the run, as the step
        budget does: a resumed run trains for the rest of it."""
        return self.config.seconds - float(self.before["seconds"])

    def _prepare(self) -> None:
        """The bookkeeping of a run whose folder is held and whose checkpoint (if any) is loaded."""
        config = self.config
        self.metrics: MetricsWriter | None = None
        """Made with the run folder at the first tick after the first transition: a launch that fails leaves none."""
        self.announced = False
        self.writable = True
        """False once a save failed: close() then writes no end state over the files that stay."""
        self.shown = Progress(f"DQN {config.env_id}", total=config.total_env_steps,
                              initial=int(self.before["env_steps"]), enabled=config.progress,
                              interval=config.progress_seconds)
        self.started = self.last_checkpoint = time.monotonic()
        self.evaluation = PeriodicEvaluation(
            config.env_id, config.eval_every, config.eval_episodes, config.seed,
            repeat_action_probability=config.repeat_action_probability)
        # the counters of the last metrics row (a resumed run: the checkpoint's, whose row is already in metrics.csv)
        self.last_row = (self.before["env_steps"], self.before["train_steps"]) if config.resume else None

    def seed_config(self, secret: str | bytes | None, redis_server: str | None) -> Config:
        """The SEED trainer's settings for this run."""
        config = self.config
        return Config(
            n_step=config.n_step, epsilon=config.epsilon, actor_processes=config.actor_processes,
            actor_threads=config.actor_threads, inference_servers=config.inference_servers,
            broadcast_period=0.5, inference_batchsize=config.inference_batchsize,
            inference_delay=config.inference_delay, inference_device=torch.device(config.inference_device),
            minimum_buffer_size=config.minimum_buffer_size, max_train_frequency=config.max_train_frequency,
            replay_ratio=config.replay_ratio, redis_url=config.redis_url, run_name=self.run_name, secret=secret,
            seed=config.seed, redis_server=redis_server)

    def env_steps(self, trainer: Trainer) -> int:
        return int(self.before["env_steps"]) + trainer.stats.transitions_received

    def recent_returns(self, trainer: Trainer) -> list[float]:
        return [*self.before["recent_returns"], *trainer.stats.recent_returns][-100:]

    def mean_return(self, trainer: Trainer) -> float | None:
        return self._judged(self.recent_returns(trainer))[0]

    def solved(self, trainer: Trainer) -> bool:
        return self._judged(self.recent_returns(trainer))[1]

    def _judged(self, returns: list[float]) -> tuple[float | None, bool]:
        """The mean of the last 100 episodes' ``returns``, and whether it solves the env (100 of them at or above
        the target return)."""
        mean = sum(returns) / len(returns) if returns else None
        return mean, (self.target_return is not None and mean is not None and len(returns) == 100
                      and mean >= self.target_return)

    def counters(self, trainer: Trainer) -> dict[str, Any]:
        """The run's totals, earlier sessions of a resumed run included (what its checkpoint keeps)."""
        stats, before = trainer.stats, self.before
        config = self.config
        return {"algo": "dqn", "env_id": config.env_id, "hidden_size": config.hidden_size,
                "distributional": config.distributional, "dueling": config.dueling, "v_min": config.v_min,
                "v_max": config.v_max, "env_steps": self.env_steps(trainer),
                "train_steps": int(before["train_steps"]) + stats.train_steps,
                "episodes": int(before["episodes"]) + stats.episodes,
                "seconds": float(before["seconds"]) + time.monotonic() - self.started,
                "weights_version": int(before["weights_version"]) + stats.weights_version,
                "recent_returns": self.recent_returns(trainer), "best_mean_return": self.best}

    def weights_metadata(self, trainer: Trainer) -> dict[str, object]:
        config = self.config
        return {"algo": "dqn", "env_id": config.env_id, "hidden_size": config.hidden_size,
                "distributional": config.distributional, "dueling": config.dueling,
                "n_atoms": self.agent_config.n_atoms, "v_min": config.v_min, "v_max": config.v_max,
                "env_steps": self.env_steps(trainer), "train_steps": self.counters(trainer)["train_steps"],
                "mean_return": self.mean_return(trainer)}

    def tick(self, trainer: Trainer) -> None:
        """The trainer's progress callback: write what changed, save, and stop once solved or out of steps. The
        run folder is made at the first transition: a launch that fails (processes that keep dying) leaves none."""
        if not self.announced:
            self.announced = True
            self.shown.announce_redis(self.run_name, trainer.redis_url)
        if self.metrics is None:
            if not trainer.stats.transitions_received:
                return
            self.open_run_folder()
        now = self.counters(trainer)
        self.write_row(trainer, now)
        self.shown.update(now["env_steps"], mean_return=self.mean_return(trainer))
        value = self.mean_return(trainer)
        if len(self.recent_returns(trainer)) >= 10 and improves(value, self.best):
            self.best = value
            save_weights(self.run_dir / "best.safetensors", self.agent.model_instance.network.state_dict(),
                         self.weights_metadata(trainer))
        if time.monotonic() - self.last_checkpoint > self.config.checkpoint_seconds:
            save_agent_checkpoint(self.run_dir / "checkpoint.safetensors", self.agent, self.counters(trainer))
            self.last_checkpoint = time.monotonic()
        if self.solved(trainer) or now["env_steps"] >= self.config.total_env_steps:
            trainer.stop()

    def open_run_folder(self) -> None:
        """The run folder, its config.json and metrics, once the trainer runs."""
        self.folder.open()
        recorded = dataclasses.replace(self.config, run_name=self.run_name)
        write_config(self.run_dir, recorded, "dqn")
        self.metrics = MetricsWriter(self.run_dir, METRIC_FIELDS,
                                     resume_step=self.before["env_steps"] if self.config.resume else None,
                                     tracker=tracker(recorded, self.run_dir, "dqn"))

    def write_row(self, trainer: Trainer, now: dict[str, Any]) -> None:
        """A metrics row per state, with an evaluation's figures when one is due (--eval-every): none for a tick
        that saw nothing new."""
        if self.last_row == (now["env_steps"], now["train_steps"]) or self.metrics is None:
            return
        self.last_row = (now["env_steps"], now["train_steps"])
        evaluated = self.evaluation.maybe_run(self.agent.model_instance) or {}
        seconds = time.monotonic() - self.started
        self.metrics.write(now["env_steps"], {**evaluated,
            "seconds": now["seconds"], "train_steps": now["train_steps"], "mean_return": self.mean_return(trainer),
            "steps_per_second": trainer.stats.transitions_received / max(seconds, 1e-9),
            "episodes": now["episodes"], "weights_version": now["weights_version"],
            "replay_size": self.agent.buffer_size(), "replay_megabytes": round(self.agent.replay.nbytes / 2**20, 1)})
        self.metrics.flush()  # once a second: metrics.csv can be followed while the run goes on

    def _close_after_a_failed_write(self) -> None:
        """Close the progress line, the evaluation (and its tracker) and the metrics files, writing nothing more."""
        self.shown.close()
        self.evaluation.close()
        if self.metrics is not None:
            close_quietly(self.metrics)

    def close(self, trainer: Trainer) -> None:
        """The run's end state on disk: the last row, final weights, checkpoint, metrics and plot (after a failed
        save, only the metrics: the files written before stay)."""
        if self.writable:
            try:
                self.tick(trainer)  # the last row (and the folder, if the first transition came after the last tick)
            except CheckpointError:  # a full disk under the last row: close the rest as after a failed save
                self.writable = False
                self._close_after_a_failed_write()
                raise
        if not self.writable:
            self._close_after_a_failed_write()
            return
        if self.metrics is None:  # the run never started: no folder, no untrained weights for evaluate or --resume
            self.shown.close()
            self.evaluation.close()
            return
        self.evaluation.close()
        self.shown.close()
        save_weights(self.run_dir / "final.safetensors", self.agent.model_instance.network.state_dict(),
                     self.weights_metadata(trainer))
        save_agent_checkpoint(self.run_dir / "checkpoint.safetensors", self.agent, self.counters(trainer))
        if self.metrics is not None:  # tick() made it
            self.metrics.close()
        try:
            plot_learning_curve(self.run_dir / "metrics.csv", self.run_dir / "learning_curve.png",
                                target=self.target_return, title=f"DQN (SEED) on {self.config.env_id}")
        except Exception:  # a missing plot must not lose the run's other outputs
            log.exception("could not plot the learning curve")


def load_q_model(path: str | Path, device: str = "cpu") -> tuple[QModel, dict[str, Any]]:
    """The Q-model of a DQN run folder or weights file: ``forward(obs)`` gives Q-values, so argmax is greedy."""
    state_dict, metadata = load_weights(weights_file(path), device)
    if metadata.get("algo") != "dqn":
        raise ConfigError(f"{path} holds no DQN weights (written by rqrl.algorithms.dqn)")
    model = q_model(metadata)
    model.network.load_state_dict(state_dict)
    return model.to(device).eval(), metadata


def q_model(facts: dict[str, Any]) -> QModel:
    """An untrained Q-model of the shape a DQN run's ``facts`` give (its weights file's metadata, or its
    checkpoint's counters over its config.json): env_id and hidden_size, the head's settings or their defaults."""
    obs_shape, n_actions, _ = env_spaces(facts["env_id"])
    defaults = DqnConfig()
    distributional = bool(facts.get("distributional", defaults.distributional))
    agent_config = AgentConfig(state_shape=obs_shape, action_space_size=n_actions,
                               n_atoms=int(facts.get("n_atoms", 51)), use_distributional=distributional,
                               dueling=bool(facts.get("dueling", defaults.dueling)),
                               v_min=float(facts.get("v_min", defaults.v_min)),
                               v_max=float(facts.get("v_max", defaults.v_max)))
    network = QNetwork(obs_shape, n_actions, int(facts["hidden_size"]),
                       agent_config.n_atoms if distributional else None, agent_config.dueling)
    return QModel(network, agent_config)
