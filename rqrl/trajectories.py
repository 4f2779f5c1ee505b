"""The bounded out-of-sync queue: a Redis list of encoded rollouts, never longer than its bound.

Producers push through one Lua script that checks the bound and each actor's highest pushed
rollout id atomically, so the bound always holds and a rollout pushed twice (a retried command, a
re-run job) is delivered once. An actor's rollouts are pushed in increasing id order (one job
stream per actor), so the high-water mark is all the memory this takes: one hash field per actor.
Producers wait while the list is full; the learner pops batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from rqrl.errors import RunStoppedError
from rqrl.keys import RunKeys

# KEYS[1] = queue, KEYS[2] = hash actor id -> highest rollout id pushed; ARGV[1] = bound, then
# (actor id, rollout id, payload) per rollout. Returns per rollout: 1 pushed, 0 full, 2 duplicate.
_PUSH_BOUNDED = """
local bound = tonumber(ARGV[1])
local length = redis.call('LLEN', KEYS[1])
local results = {}
for i = 2, #ARGV, 3 do
  local actor, rollout = ARGV[i], tonumber(ARGV[i + 1])
  local highest = tonumber(redis.call('HGET', KEYS[2], actor) or '-1')
  if rollout <= highest then
    results[#results + 1] = 2
  elseif length >= bound then
    results[#results + 1] = 0
  else
    redis.call('HSET', KEYS[2], actor, rollout)
    redis.call('RPUSH', KEYS[1], ARGV[i + 2])
    length = length + 1
    results[#results + 1] = 1
  end
end
return results
"""

PUSHED, FULL, DUPLICATE = 1, 0, 2


@dataclass(frozen=True)
class PendingRollout:
    """An encoded rollout waiting to be pushed."""

    actor_id: int
    rollout_id: int
    payload: bytes


class TrajectoryQueue:
    """One run's out-of-sync queue."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, bound: int):
        self.connection = connection
        self.keys = keys
        self.bound = bound
        self._push = connection.register_script(_PUSH_BOUNDED)

    def try_push(self, rollouts: Sequence[PendingRollout]) -> list[int]:
        """Push what fits, in order, in one atomic call; returns PUSHED, FULL or DUPLICATE per rollout."""
        if not rollouts:
            return []
        arguments: list[object] = [self.bound]
        for rollout in rollouts:
            arguments += [rollout.actor_id, rollout.rollout_id, rollout.payload]
        results = self._push(keys=[self.keys.trajectories, self.keys.pushed_rollouts], args=arguments)
        return [int(result) for result in results]

    def push(
        self,
        rollouts: Sequence[PendingRollout],
        is_stopped: Callable[[], bool],
        on_wait: Callable[[], None] = lambda: None,
        max_poll_seconds: float = 0.02,
    ) -> float:
        """Push all rollouts, waiting while the queue is full; returns seconds spent waiting.

        Raises RunStoppedError if the run stops while waiting (the rollouts are dropped).
        """
        pending = list(rollouts)
        poll, waited = 0.0005, False
        started = last_check = time.monotonic()
        while pending:
            results = self.try_push(pending)
            pending = [rollout for rollout, result in zip(pending, results, strict=True) if result == FULL]
            if not pending:
                break
            time.sleep(poll)
            waited = True
            poll = min(poll * 2, max_poll_seconds)
            if time.monotonic() - last_check > 0.2:
                last_check = time.monotonic()
                on_wait()
                if is_stopped():
                    raise RunStoppedError(f"run {self.keys.run_name!r} stopped while waiting for queue space")
        return time.monotonic() - started if waited else 0.0

    def size(self) -> int:
        return int(self.connection.llen(self.keys.trajectories))

    def pop_available(self, count: int) -> list[bytes]:
        """Pop up to ``count`` rollouts without blocking."""
        if count <= 0:
            return []
        popped = self.connection.lpop(self.keys.trajectories, count)
        return list(popped or [])

    def pop_counted(self, count: int) -> tuple[list[bytes], int, int]:
        """Pop up to ``count`` rollouts in one round trip: ``(rollouts, size before, size after)``."""
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.llen(self.keys.trajectories)
            pipe.lpop(self.keys.trajectories, max(count, 1))
            pipe.llen(self.keys.trajectories)
            size_before, popped, size_after = pipe.execute()
        return list(popped or []), int(size_before), int(size_after)

    def wait_for_one(self, timeout_seconds: float) -> bytes | None:
        """Block up to ``timeout_seconds`` for one rollout."""
        reply = self.connection.blpop([self.keys.trajectories], timeout=timeout_seconds)
        return reply[1] if reply else None
