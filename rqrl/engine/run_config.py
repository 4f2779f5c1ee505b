"""The per-run settings the learner writes to Redis once and every worker reads."""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import SupportsIndex

from rqrl.engine.keys import check_run_name
from rqrl.engine.timings import ProtocolTimings, protocol_timings
from rqrl.errors import ConfigError


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def check_seconds(name: str, value: object) -> None:
    """ConfigError unless ``value`` is a finite number of seconds, 0 or more (a bool is not one)."""
    _check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0,
           f"expected {name} >= 0 seconds, got {value!r}")


def _as_int(value: object) -> object:
    """Python ints from numpy integers (seed lists often come from np.arange); others unchanged."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        return value
    return operator.index(value)


def check_seeds(name: str, seeds: Iterable[SupportsIndex] | None, n_actors: int, default_offset: int) -> list[int]:
    """Seeds per actor: the given ints (one per actor; numpy ints too) or ``default_offset + actor_id``."""
    if seeds is None:
        return [default_offset + actor_id for actor_id in range(n_actors)]
    given = [_as_int(seed) for seed in seeds]
    _check(
        len(given) == n_actors,
        f"expected {name} to hold one seed per actor ({n_actors}), got {len(given)}; "
        f"pass e.g. {name}=list(range({n_actors}))",
    )
    checked: list[int] = []
    for seed in given:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"expected {name} to hold non-negative ints, got {seed!r}")
        checked.append(seed)
    return checked


def split_actors(n_actors: int, actors_per_job: int) -> list[list[int]]:
    """Consecutive actor ids in groups of ``actors_per_job``; each group is one RQ job stream."""
    _check(actors_per_job >= 1, f"expected actors_per_job >= 1, got {actors_per_job}")
    return [list(range(start, min(start + actors_per_job, n_actors))) for start in range(0, n_actors, actors_per_job)]


SAMPLER_KIND = "garage-sampler"
"""``RunConfig.extra["kind"]`` of a garage sampler's run (its jobs refuse a run of another kind)."""
SEED_KIND = "seed-trainer"
"""``RunConfig.extra["kind"]`` of a SEED trainer's run; IMPALA's actor groups write no kind."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a worker needs to run rollouts of one run."""

    run_name: str
    run_id: str
    queue_name: str
    n_rollout_steps: int
    n_actors: int
    batch_size: int
    queue_bound: int
    actor_env_seeds: list[int]
    actor_agent_seeds: list[int]
    actor_groups: list[list[int]]
    min_job_seconds: float = 1.0
    max_job_seconds: float = 60.0
    weights_ttl_seconds: int = 10
    hang_seconds: float = 60.0
    weights_refresh_seconds: float = 0.0
    """A worker checks for new weights at most this often (RunOptions.weights_refresh_seconds)."""
    extra: dict[str, str] = field(default_factory=dict)
    timings: ProtocolTimings = field(default_factory=protocol_timings)
    """The learner's protocol windows; its jobs beat and publish on these (rqrl.engine.timings)."""

    def __post_init__(self) -> None:
        check_run_name(self.run_name)
        _check(self.n_rollout_steps >= 1, f"expected n_rollout_steps >= 1, got {self.n_rollout_steps}")
        _check(self.n_actors >= 1, f"expected n_actors >= 1, got {self.n_actors}")
        _check(self.batch_size >= 1, f"expected batch_size >= 1, got {self.batch_size}")
        # a bound below batch_size is Maze's queue_out_of_sync_factor < 1: the learner collects as rollouts arrive
        _check(self.queue_bound >= 1, f"expected queue_bound >= 1, got {self.queue_bound}")
        _check(len(self.actor_env_seeds) == self.n_actors, "expected one env seed per actor")
        _check(len(self.actor_agent_seeds) == self.n_actors, "expected one agent seed per actor")
        flat = sorted(actor for group in self.actor_groups for actor in group)
        _check(flat == list(range(self.n_actors)), f"actor groups {self.actor_groups} must cover each actor once")
        _check(0 < self.min_job_seconds <= self.max_job_seconds, "expected 0 < min_job_seconds <= max_job_seconds")
        check_seconds("weights_refresh_seconds", self.weights_refresh_seconds)
        _check(isinstance(self.timings, ProtocolTimings),
               f"expected timings to be a ProtocolTimings, got {type(self.timings).__name__}")

    @property
    def lease_seconds(self) -> float:
        """How long a job's lease on its group outlives its last refresh (ProtocolTimings.lease)."""
        return self.timings.lease

    @property
    def group_size(self) -> int:
        """Actors in the largest actor group: the rollouts one queue entry holds at most."""
        return max(len(group) for group in self.actor_groups)

    def entries_bound(self, records_per_entry: int) -> int:
        """The queue's bound in entries of ``records_per_entry`` rollouts (workers push a group's rollouts as
        entries of at most that many, see ``rqrl.maze.group_records``): ``queue_bound`` rollouts rounded down to whole
        entries, at least one entry."""
        return max(1, self.queue_bound // max(1, min(records_per_entry, self.group_size)))

    @property
    def queue_entries(self) -> int:
        """The queue's bound in entries when each holds a whole group (rollouts that fit ENTRY_BYTES)."""
        return self.entries_bound(self.group_size)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> RunConfig:
        values = json.loads(text)
        if isinstance(values, dict):
            values.pop("lease_seconds", None)  # written by versions before the lease joined the timings
        if isinstance(values, dict) and isinstance(values.get("timings"), dict):
            values["timings"] = ProtocolTimings.from_dict(values["timings"])
        return cls(**values)


def queue_bound(batch_size: int, queue_out_of_sync_factor: float) -> int:
    """Maze's ``max_queue_size``: ``int(batch_size * queue_out_of_sync_factor)`` rollouts, at least one. A
    factor below 1 gives a queue smaller than a batch: collect_outputs takes rollouts as they arrive."""
    _check(
        isinstance(queue_out_of_sync_factor, (int, float)) and not isinstance(queue_out_of_sync_factor, bool)
        and math.isfinite(queue_out_of_sync_factor) and queue_out_of_sync_factor > 0,
        f"expected queue_out_of_sync_factor > 0, got {queue_out_of_sync_factor!r}",
    )
    bound = int(batch_size * queue_out_of_sync_factor)
    _check(bound >= 1, f"batch_size {batch_size} * queue_out_of_sync_factor {queue_out_of_sync_factor} gives a "
                       f"queue of {bound} rollouts; expected a factor >= 1 / batch_size ({1 / batch_size:.4g})")
    return bound
