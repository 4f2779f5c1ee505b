"""The protocol's clocks in one place: how often workers beat, how long silence means death, how long waits last.

Every process reads them here, so a learner, its workers and the status and health commands agree. They scale
together with ``RQRL_TIME_SCALE`` (default 1): the test suite sets 0.1 in the learner and in every worker it
starts, and so runs the real protocol ten times faster. A run records the timings its learner started with
(``RunConfig.timings``) and its jobs follow those; an idle worker, which serves no run yet, follows its own
environment. Set the same scale everywhere, or none: a worker beating more slowly than a learner expects looks dead.

>>> ProtocolTimings().liveness
20.0
>>> ProtocolTimings.scaled(0.1).heartbeat
0.5
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rqrl.errors import ConfigError

TIME_SCALE_VARIABLE = "RQRL_TIME_SCALE"


@dataclass(frozen=True)
class ProtocolTimings:
    """Seconds of each protocol window (the defaults are the production values)."""

    heartbeat: float = 5.0
    """How often a worker sends RQ's heartbeat, busy or idle."""
    liveness: float = 20.0
    """No heartbeat for this long: the worker is gone (four missed beats)."""
    lease: float = field(default=5.0, metadata={"floor": 1.0})
    """A job's hold on its actor group lapses this long after its last refresh; then the group may be re-run."""
    sideline_first: float = 1.0
    """A sidelined worker's first wait before it dequeues again; each further job in a row it cannot run doubles it."""
    sideline_max: float = 30.0
    """The longest a sidelined worker (one that failed a run's fitness check) waits before it dequeues again."""
    seed_alive: float = field(default=3.0, metadata={"floor": 1.0})
    """A SEED job's alive key lapses this long after its job stops refreshing it."""
    seed_beat: float = 1.0
    """How often a SEED job refreshes its alive key."""
    seed_job_start: float = 60.0
    """A SEED job that left the queue but never beat within this long is taken for lost and enqueued again."""
    seed_queued_warning: float = 15.0
    """A SEED job still queued after this long waits for a worker that may never come: the trainer says so, once."""
    stop_wait: float = 15.0
    """How long stopping a run waits for its jobs and local workers to end before it kills the workers."""
    shutdown_push: float = 5.0
    """How long a job whose worker is shutting down still waits for room in a full queue for its rollout in hand:
    then it hands its group back with that rollout undelivered, for its continuation to step again. A learner that
    keeps up makes room within a batch; one that is gone or hung never does, and must not hold the worker's exit."""
    env_close: float = 5.0
    """How long SubprocVectorEnv.close() waits for its env processes before it kills them."""
    shutdown_grace: float = 45.0
    """How long a learner's clean-up after Ctrl-C or SIGTERM may take before a watchdog ends the process."""

    @classmethod
    def scaled(cls, factor: float) -> ProtocolTimings:
        """The production timings times ``factor`` (0.1: ten times faster). The windows a busy process must
        refresh in time (a lease, a SEED job's alive key) stay at least a second, so that a loaded machine's
        scheduling delays are not taken for deaths."""
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError(f"the time scale must be a positive number, got {factor!r}")
        return cls(**{spec.name: max(float(spec.default) * factor, spec.metadata.get("floor", 0.0))  # type: ignore[arg-type]
                      for spec in fields(cls)})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ProtocolTimings:
        """Timings from a run record; windows a record does not name keep this version's defaults."""
        known = {spec.name for spec in fields(cls)}
        chosen = {name: float(value) for name, value in values.items() if name in known}
        bad = {name: value for name, value in chosen.items() if not (math.isfinite(value) and value > 0)}
        if bad:
            raise ConfigError(f"protocol timings must be positive seconds, got {bad}")
        return cls(**chosen)


def time_scale() -> float:
    """The factor ``RQRL_TIME_SCALE`` sets (1 when unset); ConfigError for anything but a positive number."""
    raw = os.environ.get(TIME_SCALE_VARIABLE, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{TIME_SCALE_VARIABLE}={raw!r} is not a positive number: unset it, or set a factor such "
                          f"as 0.1 for ten times faster protocol timings")
    return value


def protocol_timings() -> ProtocolTimings:
    """This process's timings: the production ones scaled by ``RQRL_TIME_SCALE``."""
    scale = time_scale()
    return ProtocolTimings() if scale == 1.0 else ProtocolTimings.scaled(scale)
