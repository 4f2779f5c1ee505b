"""The bounded out-of-sync queue: a Redis list of encoded rollouts, never longer than its bound.

Producers push through one Lua script that checks the bound and each actor's highest pushed
rollout id atomically, so the bound always holds and a rollout pushed twice (a retried command, a
re-run job) is delivered once. An actor's rollouts are pushed in increasing id order (one job
stream per actor), so the high-water mark is all the memory this takes: one hash field per actor,
plus the token of the job that pushed it, which tells a retried push of one's own rollout (MINE)
from a re-run's recomputation of a rollout another job delivered (DUPLICATE).
Producers wait while the list is full; the learner pops batches.

Pops move rollouts atomically onto a second list, the unacknowledged list, where they stay until
the learner acknowledges them (when it asks for its next batch). A learner that dies mid-batch
leaves its rollouts there, and the learner that resumes the run takes them first: delivery to
the learner process is at-least-once, never lossy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from redis.typing import EncodableT

from rqrl.errors import RunStoppedError
from rqrl.keys import RunKeys

# KEYS[1] = queue, KEYS[2] = hash actor id -> highest rollout id pushed, KEYS[3] = hash actor id ->
# token of the pusher of that rollout; ARGV[1] = bound, ARGV[2] = the pusher's token ('' for none),
# then (actor id, rollout id, payload) per rollout. Returns per rollout: 1 pushed, 0 full,
# 2 duplicate, 3 mine (this pusher pushed it already: a retried command).
_PUSH_BOUNDED = """
local bound = tonumber(ARGV[1])
local token = ARGV[2]
local length = redis.call('LLEN', KEYS[1])
local results = {}
for i = 3, #ARGV, 3 do
  local actor, rollout = ARGV[i], tonumber(ARGV[i + 1])
  local highest = tonumber(redis.call('HGET', KEYS[2], actor) or '-1')
  if rollout <= highest then
    if token ~= '' and rollout == highest and redis.call('HGET', KEYS[3], actor) == token then
      results[#results + 1] = 3
    else
      results[#results + 1] = 2
    end
  elseif length >= bound then
    results[#results + 1] = 0
  else
    redis.call('HSET', KEYS[2], actor, rollout)
    if token ~= '' then
      redis.call('HSET', KEYS[3], actor, token)
    end
    redis.call('RPUSH', KEYS[1], ARGV[i + 2])
    length = length + 1
    results[#results + 1] = 1
  end
end
return results
"""

# KEYS[1] = queue, KEYS[2] = unacknowledged list, KEYS[3] = acknowledged counter (absolute index of
# that list's head). ARGV[1] = how many to pop, ARGV[2] = absolute index below which the learner is
# done (-1: everything listed so far, for consumers that never look back). Absolute indices make a
# retried call harmless: acknowledging twice drops nothing more, and a pop whose reply was lost
# leaves its entries on the list where the next call's indices reveal them.
# Returns {queue length before, popped entries, queue length after, list head, first popped index}.
_POP_UNACKNOWLEDGED = """
local head = tonumber(redis.call('GET', KEYS[3]) or '0')
local done = tonumber(ARGV[2])
if done < 0 then
  done = head + redis.call('LLEN', KEYS[2])
end
if done > head then
  redis.call('LTRIM', KEYS[2], done - head, -1)
  redis.call('SET', KEYS[3], string.format('%d', done))
  head = done
end
local first = head + redis.call('LLEN', KEYS[2])
local before = redis.call('LLEN', KEYS[1])
local count = tonumber(ARGV[1])
local popped = {}
if count > 0 and before > 0 then
  popped = redis.call('LPOP', KEYS[1], count)
  for i = 1, #popped, 1000 do
    redis.call('RPUSH', KEYS[2], unpack(popped, i, math.min(i + 999, #popped)))
  end
end
return {before, popped, before - #popped, head, first}
"""


@dataclass(frozen=True)
class PendingRollout:
    """An encoded rollout waiting to be pushed."""

    actor_id: int
    rollout_id: int
    payload: bytes


@dataclass(frozen=True)
class PushReport:
    """What push did: seconds spent waiting for space, and the rollouts refused as already pushed."""

    waited_seconds: float
    duplicates: tuple[PendingRollout, ...]


@dataclass(frozen=True)
class Popped:
    """What one pop returned: entries with their absolute indices on the unacknowledged list."""

    entries: list[bytes]
    first_index: int
    size_before: int
    size_after: int
    head: int


PUSHED, FULL, DUPLICATE, MINE = 1, 0, 2, 3
ACKNOWLEDGE_ALL = -1


class TrajectoryQueue:
    """One run's out-of-sync queue."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, bound: int):
        self.connection = connection
        self.keys = keys
        self.bound = bound
        self._push = connection.register_script(_PUSH_BOUNDED)
        self._pop = connection.register_script(_POP_UNACKNOWLEDGED)

    def try_push(self, rollouts: Sequence[PendingRollout], token: str = "") -> list[int]:
        """Push what fits, in order, in one atomic call; returns PUSHED, FULL, DUPLICATE or MINE per
        rollout (MINE: pushed already under the same non-empty ``token``)."""
        if not rollouts:
            return []
        arguments: list[EncodableT] = [self.bound, token]
        for rollout in rollouts:
            arguments += [rollout.actor_id, rollout.rollout_id, rollout.payload]
        results = self._push(keys=[self.keys.trajectories, self.keys.pushed_rollouts, self.keys.pushed_by],
                             args=arguments)
        return [int(result) for result in results]

    def push(
        self,
        rollouts: Sequence[PendingRollout],
        is_stopped: Callable[[], bool],
        on_wait: Callable[[], None] = lambda: None,
        max_poll_seconds: float = 0.02,
        token: str = "",
    ) -> PushReport:
        """Push all rollouts, waiting while the queue is full; ``token`` names the pusher (one per job
        run), so a retried command is not mistaken for a duplicate of another job's rollout.

        Raises RunStoppedError if the run stops while waiting (the rollouts are dropped).
        """
        pending = list(rollouts)
        duplicates: list[PendingRollout] = []
        poll, waited = 0.0005, False
        started = last_check = time.monotonic()
        while pending:
            results = self.try_push(pending, token)
            duplicates += [rollout for rollout, result in zip(pending, results, strict=True) if result == DUPLICATE]
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
        return PushReport(time.monotonic() - started if waited else 0.0, tuple(duplicates))

    def size(self) -> int:
        return int(self.connection.llen(self.keys.trajectories))

    def pop_available(self, count: int) -> list[bytes]:
        """Pop up to ``count`` rollouts without blocking, for a consumer that never looks back:
        everything popped before is acknowledged."""
        return self.pop(count, ACKNOWLEDGE_ALL).entries if count > 0 else []

    def pop(self, count: int, done_below: int = 0) -> Popped:
        """Acknowledge every unacknowledged rollout with an absolute index below ``done_below``, then
        pop up to ``count`` onto the unacknowledged list, in one atomic round trip."""
        size_before, entries, size_after, head, first = self._pop(
            keys=[self.keys.trajectories, self.keys.unacknowledged, self.keys.acknowledged],
            args=[max(count, 0), done_below if done_below == ACKNOWLEDGE_ALL else max(done_below, 0)])
        return Popped(list(entries or []), int(first), int(size_before), int(size_after), int(head))

    def wait_until_not_empty(self, timeout_seconds: float) -> bool:
        """Block up to ``timeout_seconds`` until a rollout waits; pops nothing (a LEFT-to-LEFT move of
        the list onto itself leaves it as it was, so a retried call is harmless)."""
        # redis-py hints the timeout as int, but BLMOVE takes a double number of seconds (0.05 works)
        return self.connection.blmove(self.keys.trajectories, self.keys.trajectories,
                                      timeout_seconds,  # type: ignore[arg-type]
                                      "LEFT", "LEFT") is not None

    def unacknowledged(self, start: int = 0, stop: int = -1) -> tuple[list[bytes], int]:
        """Unacknowledged rollouts from absolute index ``start`` (to ``stop``, inclusive, -1: all):
        ``(entries, absolute index of the first)``; what a dead learner had in hand."""
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.get(self.keys.acknowledged)
            pipe.lrange(self.keys.unacknowledged, 0, -1)
            head, entries = pipe.execute()
        head = int(head or 0)
        first = max(start, head)
        last = head + len(entries) - 1 if stop < 0 else min(stop, head + len(entries) - 1)
        if last < first:
            return [], first
        return list(entries[first - head:last - head + 1]), first
