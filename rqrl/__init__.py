"""rqrl: distributed reinforcement-learning rollouts on Redis and RQ."""

from rqrl.actors import DistributedActors, RedisDistributedActors, SubprocDistributedActors
from rqrl.errors import (
    ActorFailedError,
    CheckpointError,
    CollectTimeoutError,
    ConfigError,
    EnvError,
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
)
from rqrl.policy import ActorPolicy, PolicyStep
from rqrl.records import BatchedRecord, CollectedOutputs, RolloutRecord
from rqrl.serial import SerialDistributedActors
from rqrl.stats import EpochStatsAggregator, LogStatsLevel, RolloutEvents

__version__ = "0.1.0"

__all__ = [
    "ActorFailedError",
    "ActorPolicy",
    "BatchedRecord",
    "CheckpointError",
    "CollectTimeoutError",
    "CollectedOutputs",
    "ConfigError",
    "DistributedActors",
    "EnvError",
    "EpochStatsAggregator",
    "ForbiddenJobError",
    "LeaseLostError",
    "LogStatsLevel",
    "MissingStatsError",
    "NoWorkersError",
    "PolicyError",
    "PolicyStep",
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
    "SignatureError",
    "SubprocDistributedActors",
    "__version__",
]
