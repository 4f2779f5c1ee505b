"""rqrl: distributed reinforcement-learning rollouts on Redis and RQ.

The public names load on first use (PEP 562), so ``import rqrl`` and the command line stay free of torch
and gymnasium until a name that needs them is asked for:

>>> import rqrl
>>> issubclass(rqrl.ConfigError, rqrl.RqrlError)
True
"""

from __future__ import annotations

import typing

from rqrl.engine import lazy as _lazy
from rqrl.errors import (
    ActorFailedError,
    CheckpointError,
    CollectTimeoutError,
    ConfigError,
    EnvError,
    EnvProcessDiedError,
    ForbiddenJobError,
    LeaseLostError,
    MissingExtraError,
    MissingStatsError,
    NoWorkersError,
    PolicyError,
    ProcessesDiedError,
    RecordError,
    RedisOutOfMemoryError,
    RedisRefusedError,
    RedisServerNotFoundError,
    RedisUnavailableError,
    RqrlError,
    RunFolderError,
    RunStoppedError,
    RunTakenOverError,
    ServerError,
    SignatureError,
    VectorEnvError,
    WorkersRefusedError,
    WorkerUnfitError,
)

if typing.TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from rqrl.engine.policy import ActorPolicy, Policy, PolicyStep, StatefulActorPolicy
    from rqrl.garage.episodes import EnvSpec, EpisodeBatch, StepType
    from rqrl.garage.local_sampler import LocalSampler
    from rqrl.garage.sampler import MultiprocessingSampler, RQSampler
    from rqrl.garage.worker import EnvUpdate, ExistingEnvUpdate, NewEnvUpdate, SetTaskUpdate, WorkerFactory
    from rqrl.maze.actors import DistributedActors, RedisDistributedActors, SubprocDistributedActors
    from rqrl.maze.records import BatchedRecord, CollectedOutputs, RolloutRecord
    from rqrl.maze.serial import SerialDistributedActors
    from rqrl.maze.stats import BaseEnvEvents, EpochStatsAggregator, EventTopic, LogStatsLevel, RolloutEvents
    from rqrl.maze.vector_env import SubprocVectorEnv

_LAZY_EXPORTS: dict[str, str] = {
    "DistributedActors": "rqrl.maze.actors",
    "RedisDistributedActors": "rqrl.maze.actors",
    "SubprocDistributedActors": "rqrl.maze.actors",
    "EnvSpec": "rqrl.garage.episodes",
    "EpisodeBatch": "rqrl.garage.episodes",
    "StepType": "rqrl.garage.episodes",
    "LocalSampler": "rqrl.garage.local_sampler",
    "ActorPolicy": "rqrl.engine.policy",
    "Policy": "rqrl.engine.policy",
    "PolicyStep": "rqrl.engine.policy",
    "StatefulActorPolicy": "rqrl.engine.policy",
    "BatchedRecord": "rqrl.maze.records",
    "CollectedOutputs": "rqrl.maze.records",
    "RolloutRecord": "rqrl.maze.records",
    "MultiprocessingSampler": "rqrl.garage.sampler",
    "RQSampler": "rqrl.garage.sampler",
    "EnvUpdate": "rqrl.garage.worker",
    "ExistingEnvUpdate": "rqrl.garage.worker",
    "NewEnvUpdate": "rqrl.garage.worker",
    "SetTaskUpdate": "rqrl.garage.worker",
    "WorkerFactory": "rqrl.garage.worker",
    "SerialDistributedActors": "rqrl.maze.serial",
    "BaseEnvEvents": "rqrl.maze.stats",
    "EpochStatsAggregator": "rqrl.maze.stats",
    "EventTopic": "rqrl.maze.stats",
    "LogStatsLevel": "rqrl.maze.stats",
    "RolloutEvents": "rqrl.maze.stats",
    "SubprocVectorEnv": "rqrl.maze.vector_env",
}
"""Public name -> the module that defines it, imported when the name is first asked for."""


__getattr__, __dir__ = _lazy.lazy_exports(__name__, globals(), _LAZY_EXPORTS)

__version__ = "0.1.0"

__all__ = [
    "ActorFailedError",
    "ActorPolicy",
    "BaseEnvEvents",
    "BatchedRecord",
    "CheckpointError",
    "CollectTimeoutError",
    "CollectedOutputs",
    "ConfigError",
    "DistributedActors",
    "EnvError",
    "EnvProcessDiedError",
    "EnvSpec",
    "EnvUpdate",
    "EpisodeBatch",
    "EpochStatsAggregator",
    "EventTopic",
    "ExistingEnvUpdate",
    "ForbiddenJobError",
    "LeaseLostError",
    "LocalSampler",
    "LogStatsLevel",
    "MissingExtraError",
    "MissingStatsError",
    "MultiprocessingSampler",
    "NewEnvUpdate",
    "NoWorkersError",
    "Policy",
    "PolicyError",
    "PolicyStep",
    "ProcessesDiedError",
    "RQSampler",
    "RecordError",
    "RedisDistributedActors",
    "RedisRefusedError",
    "RedisServerNotFoundError",
    "RedisOutOfMemoryError",
    "RedisUnavailableError",
    "RolloutEvents",
    "RolloutRecord",
    "RqrlError",
    "RunFolderError",
    "RunStoppedError",
    "RunTakenOverError",
    "SerialDistributedActors",
    "ServerError",
    "SetTaskUpdate",
    "SignatureError",
    "StatefulActorPolicy",
    "StepType",
    "SubprocDistributedActors",
    "SubprocVectorEnv",
    "VectorEnvError",
    "WorkerFactory",
    "WorkerUnfitError",
    "WorkersRefusedError",
    "__version__",
]
