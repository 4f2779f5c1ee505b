"""Epoch statistics of a run, read the way Maze reads them (``get_stats_value(event, level, name)``).

Events are the static methods of ``RolloutEvents`` (or their names as strings); each holds a
list of values per epoch, reduced to ``mean``/``min``/``max``/``count`` (or ``sum``/``last``).
An epoch runs from one ``reduce()`` of the aggregator to the next.

For Maze learners: ``get_stats_value(BaseEnvEvents.reward, EPOCH, name)`` reads Maze's names of the
episode statistics, and ``create_event_topic(interface)`` records a learner's own events (see
``EventTopic``); what has no counterpart raises ConfigError naming what exists.
"""

from __future__ import annotations

import enum
import inspect
import numbers
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np

from rqrl.errors import ConfigError, MissingStatsError

Event: TypeAlias = Callable[[], None] | str
"""A statistic's event: a static method of ``RolloutEvents`` or its name."""


class LogStatsLevel(enum.Enum):
    """Maze's levels; only EPOCH statistics are propagated from the actors."""

    STEP = "step"
    EPISODE = "episode"
    EPOCH = "epoch"


class RolloutEvents:
    """Event identifiers for get_stats_value; each docstring says what the values are."""

    @staticmethod
    def episode_return() -> None:
        """Undiscounted return of each episode that ended in the epoch."""

    @staticmethod
    def episode_length() -> None:
        """Length in steps of each episode that ended in the epoch."""

    @staticmethod
    def env_steps_per_second() -> None:
        """Env steps delivered to the learner per wall-clock second, per collect_outputs call."""

    @staticmethod
    def env_steps() -> None:
        """Env steps delivered to the learner (sum over the epoch with name='sum')."""

    @staticmethod
    def policy_lag() -> None:
        """Learner's weights version minus the version that produced each rollout."""

    @staticmethod
    def queue_size() -> None:
        """Out-of-sync queue length before each dequeue."""

    @staticmethod
    def dequeue_time() -> None:
        """Seconds collect_outputs spent waiting for and decoding each batch."""

    @staticmethod
    def records_rejected() -> None:
        """Queue entries rejected as foreign, corrupted or malformed (one value 1 per entry)."""

    @staticmethod
    def groups_rerun() -> None:
        """Actor groups re-enqueued because their job's worker died or hung (one value 1 each)."""

    @staticmethod
    def episodes_cut() -> None:
        """Episodes a fault cut without a ``truncated`` mark: the actor's next rollout does not continue
        its previous one, which ended mid-episode (one value 1 each; see BatchedRecord.continues_previous)."""

    @staticmethod
    def rollouts_lost() -> None:
        """Rollout ids the learner never got: an actor's next rollout skipped them (Redis lost them and
        they could not be re-run); that rollout says ``continues_previous=False``. Counts per skip."""

    @staticmethod
    def runs_restored() -> None:
        """Times the learner stored the run again after Redis lost its keys (one value 1 each)."""

    @staticmethod
    def workers_alive() -> None:
        """RQ workers listening on the run's queue, sampled at each collect_outputs."""


class BaseEnvEvents:
    """Maze's ``BaseEnvEvents`` for ``get_stats_value``: ``reward`` reads the epoch's episodes by Maze's names."""

    @staticmethod
    def reward() -> None:
        """Maze's epoch statistics of episode rewards: ``mean``/``min``/``max`` of the episode returns,
        ``episode_count`` and ``mean_step_count`` (mean episode length)."""


_MAZE_REWARD_STATS = {
    "mean": ("episode_return", "mean"),
    "min": ("episode_return", "min"),
    "max": ("episode_return", "max"),
    "episode_count": ("episode_return", "count"),
    "mean_step_count": ("episode_length", "mean"),
}
"""Maze's ``BaseEnvEvents.reward`` statistics -> (rqrl event, statistic)."""

_REDUCERS: dict[str, Callable[[np.ndarray], float]] = {
    "mean": lambda values: float(np.mean(values)),
    "min": lambda values: float(np.min(values)),
    "max": lambda values: float(np.max(values)),
    "sum": lambda values: float(np.sum(values)),
    "count": lambda values: float(len(values)),
    "last": lambda values: float(values[-1]),
}


def event_name(event: Event) -> str:
    return event if isinstance(event, str) else event.__name__


class EpochStatsAggregator:
    """Collects values per event during an epoch; ``reduce()`` ends the epoch."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)
        self.last_stats: dict[str, dict[str, float]] = {}

    def add(self, event: Event, values: float | Sequence[float] | np.ndarray) -> None:
        """Add one value, or the values of a sequence or array (of any shape), to ``event``'s epoch list."""
        self._values[event_name(event)].extend(np.asarray(values, dtype=np.float64).ravel().tolist())

    def current(self) -> dict[str, dict[str, float]]:
        """Reduced statistics of the running epoch: ``{event: {reducer: value}}``."""
        return {
            name: {reducer: function(np.asarray(values)) for reducer, function in _REDUCERS.items()}
            for name, values in self._values.items()
            if values
        }

    def reduce(self) -> dict[str, dict[str, float]]:
        """End the epoch: return its statistics, keep them as ``last_stats`` and start afresh."""
        self.last_stats = self.current()
        self._values.clear()
        return self.last_stats

    def clear(self) -> None:
        """Drop the running epoch's values without reducing them (Maze's ``clear_inputs``)."""
        self._values.clear()

    def get_stats_value(
        self, event: Event, level: LogStatsLevel = LogStatsLevel.EPOCH, name: str | None = None
    ) -> float | dict[str, float]:
        """One statistic (all of one event if ``name`` is None) of the running epoch, or of the last
        reduced epoch if the running one has no values for ``event`` yet (as Maze reads them)."""
        if getattr(level, "name", None) != LogStatsLevel.EPOCH.name:  # Maze's own LogStatsLevel.EPOCH too
            raise ConfigError(
                f"expected level=LogStatsLevel.EPOCH, got {level}; step and episode stats are not propagated"
            )
        key = event_name(event)
        if key == "reward" and key not in self._values and key not in self.last_stats:
            key, name = _maze_reward_stat(name)
        stats = self.current().get(key) or self.last_stats.get(key)
        if stats is None and name is not None:
            stats = self._topic_argument(key, name)
            name = "mean" if stats is not None else name
        if stats is None:
            grouped = sorted(k for k in set(self._values) | set(self.last_stats)
                             if k.startswith((f"{key}[", f"{key}.")) and self._values.get(k) != [])
            if grouped:
                raise MissingStatsError(f"{key!r} is recorded per group or argument: read one of {grouped}")
            with_values = sorted({k for k, values in self._values.items() if values} | set(self.last_stats))
            raise MissingStatsError(f"no values for {key!r} yet; events with values: {with_values}")
        if name is None:
            return stats
        if name not in stats:
            raise ConfigError(f"unknown statistic {name!r} for {key!r}; choose one of {sorted(_REDUCERS)}")
        return stats[name]

    def _topic_argument(self, key: str, argument: str) -> dict[str, float] | None:
        """Stats of one argument of an event-topic call (``estimated_queue_sizes`` + ``before``), if recorded."""
        full = f"{key}.{argument}"
        return self.current().get(full) or self.last_stats.get(full)

    def create_event_topic(self, interface: type) -> EventTopic:
        """Maze's ``LogStatsAggregator.create_event_topic``: an object whose methods record the learner's own
        events (``topic.estimated_queue_sizes(before=3, after=1)``) in this aggregator; see EventTopic."""
        return EventTopic(self, interface)


def _maze_reward_stat(name: str | None) -> tuple[str, str | None]:
    """The rqrl (event, statistic) of Maze's ``BaseEnvEvents.reward`` statistic ``name``."""
    if name is None:
        return "episode_return", None
    if name not in _MAZE_REWARD_STATS:
        raise ConfigError(f"Maze's reward statistic {name!r} has no rqrl counterpart; choose one of "
                          f"{sorted(_MAZE_REWARD_STATS)} (std, medians and cumulative totals are not kept: "
                          f"see docs/maze-migration.md)")
    return _MAZE_REWARD_STATS[name]


class EventTopic:
    """A Maze event topic over an EpochStatsAggregator: one recorder per public method of ``interface``.

    A call's arguments are bound to the method's signature (``self`` left out). With an argument named
    ``value``, that is the value and the other arguments group it: ``policy_loss(step_key=0, value=0.5)``
    is recorded as event ``"policy_loss[step_key=0]"`` (``"policy_loss"`` without other arguments).
    Without one, every argument is a value of its own: ``estimated_queue_sizes(before=3, after=1)`` records
    ``"estimated_queue_sizes.before"`` and ``".after"``, and ``get_stats_value(event, name="before")``
    reads their epoch mean (Maze's IMPALA events reduce with ``np.nanmean``). Maze's decorators are not
    read. A value that is no real number, or arguments that do not fit, raise ConfigError; an event the
    interface lacks, AttributeError naming those it has.
    """

    def __init__(self, aggregator: EpochStatsAggregator, interface: type):
        if not isinstance(interface, type):
            raise ConfigError(f"create_event_topic expects an event interface class, got {interface!r:.80}")
        self._aggregator = aggregator
        self._interface = interface
        self._signatures: dict[str, inspect.Signature] = {}
        for name, member in inspect.getmembers(interface, callable):
            if name.startswith("_"):
                continue
            signature = inspect.signature(member)
            parameters = list(signature.parameters.values())
            if parameters and parameters[0].name == "self":  # a plain method (Maze's interfaces): drop self
                signature = signature.replace(parameters=parameters[1:])
            self._signatures[name] = signature

    def __getattr__(self, name: str) -> Callable[..., None]:
        signatures = self.__dict__.get("_signatures", {})
        if name not in signatures:
            interface = self.__dict__.get("_interface", type(self))
            raise AttributeError(f"event interface {interface.__name__} has no event {name!r}; its events: "
                                 f"{sorted(signatures)}")
        return lambda *args, **kwargs: self._record(name, signatures[name], args, kwargs)

    def _record(self, event: str, signature: inspect.Signature, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise ConfigError(f"{self._interface.__name__}.{event}{signature} does not take these arguments: "
                              f"{error}") from error
        arguments = dict(bound.arguments)
        if "value" in arguments:
            value = arguments.pop("value")
            groups = ",".join(f"{key}={group}" for key, group in arguments.items())
            self._add(f"{event}[{groups}]" if groups else event, event, "value", value)
        else:
            for argument, value in arguments.items():
                self._add(f"{event}.{argument}", event, argument, value)

    def _add(self, key: str, event: str, argument: str, value: object) -> None:
        values = np.asarray(value) if isinstance(value, numbers.Real | np.ndarray) else None
        if isinstance(value, bool) or values is None or values.dtype.kind not in "iuf":
            raise ConfigError(f"{self._interface.__name__}.{event}: expected a number for {argument!r}, got "
                              f"{value!r:.80}")
        self._aggregator.add(key, values)


class StatsReader:
    """Maze's two stats accessors over ``self.epoch_stats``, shared by the actors and the vector env."""

    epoch_stats: EpochStatsAggregator

    def get_epoch_stats_aggregator(self) -> EpochStatsAggregator:
        """The aggregator of this epoch's statistics (``reduce()`` it to end the epoch)."""
        return self.epoch_stats

    def get_stats_value(
        self, event: Event, level: LogStatsLevel = LogStatsLevel.EPOCH, name: str | None = None
    ) -> float | dict[str, float]:
        """One statistic of the running epoch, e.g. ``(RolloutEvents.episode_return, EPOCH, "mean")``."""
        return self.epoch_stats.get_stats_value(event, level, name)


class DeliveredRollout(Protocol):
    """What record_batch reads of a rollout (a RolloutRecord has it; stats does not import records)."""

    @property
    def episode_returns(self) -> np.ndarray: ...

    @property
    def episode_lengths(self) -> np.ndarray: ...

    @property
    def policy_version(self) -> int: ...

    @property
    def n_steps(self) -> int: ...


def record_batch(
    stats: EpochStatsAggregator,
    records: Sequence[DeliveredRollout],
    policy_version: int,
    elapsed_seconds: float,
    queue_size: int,
    dequeue_time: float,
    workers_alive: int | None = None,
) -> None:
    """Add one collect_outputs batch to the epoch: its episodes, policy lag, env steps and their rate
    over ``elapsed_seconds`` (since the previous batch), queue size, dequeue time and, if given, the
    workers alive; every DistributedActors records the same events this way."""
    steps = sum(record.n_steps for record in records)
    if records:  # one add per event, not per record: this runs on the learner's hot path
        stats.add(RolloutEvents.episode_return, np.concatenate([record.episode_returns for record in records]))
        stats.add(RolloutEvents.episode_length, np.concatenate([record.episode_lengths for record in records]))
    stats.add(RolloutEvents.policy_lag, [policy_version - record.policy_version for record in records])
    stats.add(RolloutEvents.env_steps, steps)
    stats.add(RolloutEvents.env_steps_per_second, steps / max(elapsed_seconds, 1e-9))
    stats.add(RolloutEvents.queue_size, queue_size)
    stats.add(RolloutEvents.dequeue_time, dequeue_time)
    if workers_alive is not None:
        stats.add(RolloutEvents.workers_alive, workers_alive)
