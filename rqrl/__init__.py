"""rqrl: distributed reinforcement-learning rollouts on Redis and RQ."""

from rqrl.actors import DistributedActors, RedisDistributedActors, SubprocDistributedActors
from rqrl.errors import (
    ActorFailedError,
    CollectTimeoutError,
    ConfigError,
    EnvError,
    ForbiddenJobError,
    MissingStatsError,
    NoWorkersError,
    PolicyError,
    RecordError,
    RedisServerNotFoundError,
    RedisUnavailableError,
    RqrlError,
    RunStoppedError,
    SignatureError,
)
from rqrl.policy import ActorPolicy, PolicyStep
from rqrl.records import BatchedRecord, CollectedOutputs, RolloutRecord
from rqrl.stats import EpochStatsAggregator, LogStatsLevel, RolloutEvents

__version__ = "0.1.0"

__all__ = [
    "ActorFailedError",
    "ActorPolicy",
    "BatchedRecord",
    "CollectTimeoutError",
    "CollectedOutputs",
    "ConfigError",
    "DistributedActors",
    "EnvError",
    "EpochStatsAggregator",
    "ForbiddenJobError",
    "LogStatsLevel",
    "MissingStatsError",
    "NoWorkersError",
    "PolicyError",
    "PolicyStep",
    "RecordError",
    "RedisDistributedActors",
    "RedisServerNotFoundError",
    "RedisUnavailableError",
    "RolloutEvents",
    "RolloutRecord",
    "RqrlError",
    "RunStoppedError",
    "SignatureError",
    "SubprocDistributedActors",
    "__version__",
]
