"""Where a worker's time goes: the parts of its rollout loop, published as shares of its time with its steps/s
(``rqrl.engine.jobs``) and read by ``rqrl status`` and the benchmarks. No heavy imports: the CLI reads it."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["WORKER_TIME_PARTS", "WorkerTimes"]


@dataclass
class WorkerTimes:
    """Seconds a worker's rollouts spent in each part of its loop, published as shares of its time with its steps/s
    (``rqrl.cli.status.read_worker_times``): what a worker slower than its envs waits on."""

    weights: float = 0.0
    """Fetching and loading the policy's weights (and waiting for the first)."""
    step: float = 0.0
    """Stepping the envs and the policy."""
    encode: float = 0.0
    """Encoding the rollouts: packing frames, compressing, tagging."""
    push: float = 0.0
    """Sending the entries and reading the replies, but for ``room``."""
    room: float = 0.0
    """Waiting for room in a full queue: the learner sets the pace."""

    def shares(self, seconds: float) -> dict[str, float]:
        """Each part's share of ``seconds`` (of all the parts' seconds, where they are more: a rollout that began
        before the window counts whole in it), rounded for publishing."""
        counted = max(seconds, sum(getattr(self, part) for part in WORKER_TIME_PARTS))
        return {part: round(getattr(self, part) / counted, 4) for part in WORKER_TIME_PARTS}

    def add(self, other: WorkerTimes) -> None:
        """Count ``other``'s seconds in too."""
        for part in WORKER_TIME_PARTS:
            setattr(self, part, getattr(self, part) + getattr(other, part))


WORKER_TIME_PARTS = tuple(field.name for field in fields(WorkerTimes))
