"""rqrl: distributed reinforcement-learning rollouts on Redis and RQ.

The public names load on first use (PEP 562), so ``import rqrl`` and the command line stay free of torch
and gymnasium until a name that needs them is asked for:

>>> import rqrl
>>> issubclass(rqrl.ConfigError, rqrl.RqrlError)
True
"""

from __future__ import annotations

import importlib
import typing

from rqrl.errors import (
    ActorFailedError,
    CheckpointError,
    CollectTimeoutError,
    ConfigError,
    EnvError,
    EnvProcessDiedError,
    ForbiddenJobError,
    LeaseLostError,
    MissingStatsError,
    NoWorkersError,
    PolicyError,
    RecordError,
    RedisRefusedError,
    RedisServerNotFoundError,
    RedisUnavailableError,
    RqrlError,
    RunStoppedError,
    ServerError,
    SignatureError,
    VectorEnvError,
    WorkersRefusedError,
    WorkerUnfitError,
)

if typing.TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from rqrl.actors import DistributedActors, RedisDistributedActors, SubprocDistributedActors
    from rqrl.episodes import EnvSpec, EpisodeBatch, StepType
    from rqrl.local_sampler import LocalSampler
    from rqrl.policy import ActorPolicy, Policy, PolicyStep, StatefulActorPolicy
    from rqrl.records import BatchedRecord, CollectedOutputs, RolloutRecord
    from rqrl.sampler import MultiprocessingSampler, RQSampler
    from rqrl.sampler_worker import EnvUpdate, ExistingEnvUpdate, NewEnvUpdate, SetTaskUpdate, WorkerFactory
    from rqrl.serial import SerialDistributedActors
    from rqrl.stats import BaseEnvEvents, EpochStatsAggregator, EventTopic, LogStatsLevel, RolloutEvents
    from rqrl.vector_env import SubprocVectorEnv

_LAZY_EXPORTS: dict[str, str] = {
    "DistributedActors": "rqrl.actors",
    "RedisDistributedActors": "rqrl.actors",
    "SubprocDistributedActors": "rqrl.actors",
    "EnvSpec": "rqrl.episodes",
    "EpisodeBatch": "rqrl.episodes",
    "StepType": "rqrl.episodes",
    "LocalSampler": "rqrl.local_sampler",
    "ActorPolicy": "rqrl.policy",
    "Policy": "rqrl.policy",
    "PolicyStep": "rqrl.policy",
    "StatefulActorPolicy": "rqrl.policy",
    "BatchedRecord": "rqrl.records",
    "CollectedOutputs": "rqrl.records",
    "RolloutRecord": "rqrl.records",
    "MultiprocessingSampler": "rqrl.sampler",
    "RQSampler": "rqrl.sampler",
    "EnvUpdate": "rqrl.sampler_worker",
    "ExistingEnvUpdate": "rqrl.sampler_worker",
    "NewEnvUpdate": "rqrl.sampler_worker",
    "SetTaskUpdate": "rqrl.sampler_worker",
    "WorkerFactory": "rqrl.sampler_worker",
    "SerialDistributedActors": "rqrl.serial",
    "BaseEnvEvents": "rqrl.stats",
    "EpochStatsAggregator": "rqrl.stats",
    "EventTopic": "rqrl.stats",
    "LogStatsLevel": "rqrl.stats",
    "RolloutEvents": "rqrl.stats",
    "SubprocVectorEnv": "rqrl.vector_env",
}
"""Public name -> the module that defines it, imported when the name is first asked for."""


def __getattr__(name: str) -> typing.Any:
    """Import the module behind a lazy public name and keep the value, so it loads once."""
    module = _LAZY_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rqrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_EXPORTS))


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
    "MissingStatsError",
    "MultiprocessingSampler",
    "NewEnvUpdate",
    "NoWorkersError",
    "Policy",
    "PolicyError",
    "PolicyStep",
    "RQSampler",
    "RecordError",
    "RedisDistributedActors",
    "RedisRefusedError",
    "RedisServerNotFoundError",
    "RedisUnavailableError",
    "RolloutEvents",
    "RolloutRecord",
    "RqrlError",
    "RunStoppedError",
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
