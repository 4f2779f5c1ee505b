"""rqrl: distributed reinforcement-learning rollouts on Redis and RQ."""

from rqrl.actors import DistributedActors, RedisDistributedActors, SubprocDistributedActors
from rqrl.episodes import EnvSpec, EpisodeBatch, StepType
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
from rqrl.local_sampler import LocalSampler
from rqrl.policy import ActorPolicy, Policy, PolicyStep, StatefulActorPolicy
from rqrl.records import BatchedRecord, CollectedOutputs, RolloutRecord
from rqrl.sampler import MultiprocessingSampler, RQSampler
from rqrl.sampler_worker import EnvUpdate, ExistingEnvUpdate, NewEnvUpdate, SetTaskUpdate, WorkerFactory
from rqrl.serial import SerialDistributedActors
from rqrl.stats import BaseEnvEvents, EpochStatsAggregator, EventTopic, LogStatsLevel, RolloutEvents
from rqrl.vector_env import SubprocVectorEnv

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
