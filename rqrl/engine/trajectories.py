"""The bounded out-of-sync queue: a Redis list of encoded entries, never longer than its bound.

An entry is one rollout or, as workers push them, one actor group's rollouts of one rollout id
(``rqrl.maze.group_records``); each belongs to a *stream* (an actor, or an actor group) whose rollout ids
it continues. Producers push through one Lua script that checks the bound and each stream's highest
pushed rollout id atomically, so the bound always holds and an entry pushed twice (a retried command, a
re-run job) is delivered once. A stream's entries are pushed in increasing id order (one job stream
per actor group), so the high-water mark is all the memory this takes: one hash field per stream,
plus the token of the job that pushed it, which tells a retried push of one's own entry (MINE)
from a re-run's recomputation of an entry another job delivered (DUPLICATE).
Producers wait while the list is full; the learner pops batches.

Pops move rollouts atomically onto a second list, the unacknowledged list, where they stay until
the learner acknowledges them (when it asks for its next batch). A learner that dies mid-batch
leaves its rollouts there, and the learner that resumes the run takes them first: delivery to
the learner process is at-least-once, never lossy.
"""

from __future__ import annotations

import enum
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from rqrl.engine.keys import RunKeys
from rqrl.engine.learner_token import held_by_another, taken_over_error
from rqrl.engine.screen import MAX_ENTRY_BYTES, SCREEN_SCRIPT
from rqrl.engine.sent_commands import SentCommands
from rqrl.errors import ConfigError, LeaseLostError, RqrlError, RunStoppedError

log = logging.getLogger(__name__)

# Runs in a MULTI right after the RPUSH of one entry, so the payload never passes through Lua (which would
# copy it into a Lua string and back: 2.5x Redis's CPU per byte for large entries, measured). It keeps the
# entry or takes it back off the tail with LTRIM (which returns nothing, so nothing is copied either way).
# KEYS[1] = queue, KEYS[2] = hash stream id -> highest rollout id pushed, KEYS[3] = hash stream id ->
# token of the pusher of that rollout, KEYS[4] = the doorbell (rung when something was pushed), KEYS[5] =
# the pusher's lease (when ARGV[3] is not ''); ARGV[1] = bound, ARGV[2] = the pusher's token ('' for
# none), ARGV[3] = the lease holder the pusher must be ('': no fence), ARGV[4] = stream id, ARGV[5] =
# rollout id. Returns 1 pushed, 0 full, 2 duplicate, 3 mine (this pusher pushed it already: a retried
# command), 4 not the lease holder.
_PUSH_BOUNDED = """
local bound, token, stream, rollout = tonumber(ARGV[1]), ARGV[2], ARGV[4], tonumber(ARGV[5])
local result
if ARGV[3] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[3] then
  result = 4
else
  local highest = tonumber(redis.call('HGET', KEYS[2], stream) or '-1') or -1
  if rollout <= highest then
    if token ~= '' and rollout == highest and redis.call('HGET', KEYS[3], stream) == token then
      result = 3
    else
      result = 2
    end
  elseif redis.call('LLEN', KEYS[1]) - 1 >= bound then
    result = 0
  else
    redis.call('HSET', KEYS[2], stream, rollout)
    if token ~= '' then
      redis.call('HSET', KEYS[3], stream, token)
    end
    if redis.call('LLEN', KEYS[4]) == 0 then
      redis.call('RPUSH', KEYS[4], '1')
    end
    return 1
  end
end
redis.call('LTRIM', KEYS[1], 0, -2)
return result
"""

# KEYS[1] = hash stream id -> highest rollout id pushed; ARGV[1] = stream id, ARGV[2] = rollout id. Lowers
# the stream's marker to just below the rollout if it is at or above it; returns the old marker or -1.
_LOWER_MARKER = """
local marker = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1') or -1
local rollout = tonumber(ARGV[2])
if marker < rollout then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', rollout - 1))
return string.format('%d', marker)
"""

# Scripts inside a MULTI go as EVAL with their text, not EVALSHA: an EVALSHA the server does not know (after a
# restart or SCRIPT FLUSH) fails alone inside EXEC while the RPUSH beside it stays, and redis-py's Script
# objects avoid that by asking SCRIPT EXISTS before every pipeline, a round trip per push and per pop.
# A pop is one MULTI: _ACKNOWLEDGE, then one LMOVE of the queue onto the unacknowledged list per entry
# wanted, then _AFTER_POP. LMOVE moves entries without copying them (a Lua LPOP would copy each payload
# into Lua and back out: 2.4x Redis's CPU per byte for large entries, measured).
# _ACKNOWLEDGE: KEYS[1] = unacknowledged list, KEYS[2] = acknowledged counter (absolute index of that list's
# head). ARGV[1] = absolute index below which the learner is done (-1: everything listed so far, for
# consumers that never look back). Absolute indices make a retried call harmless: acknowledging twice drops
# nothing more, and a pop whose reply was lost leaves its entries on the list where the next call's indices
# reveal them. Returns {list head, index the entries popped next get}. An acknowledged counter that is no
# plain integer >= 0 of at most 15 digits (no rqrl process writes another; tonumber would take 'inf' or
# '1e300', which Redis turns into -2^63) makes the list's indices unknown: the list is deleted, the counter
# set to 'lost' for _AFTER_POP, and {-1} tells the caller to realign.
_ACKNOWLEDGE = """
local raw = redis.call('GET', KEYS[2]) or '0'
if not string.match(raw, '^%d+$') or #raw > 15 then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], 'lost')
  return {-1}
end
local head = tonumber(raw)
local done = tonumber(ARGV[1])
if done < 0 then
  done = head + redis.call('LLEN', KEYS[1])
end
if done > head then
  redis.call('LTRIM', KEYS[1], done - head, -1)
  redis.call('SET', KEYS[2], string.format('%d', done))
  head = done
end
return {head, head + redis.call('LLEN', KEYS[1])}
"""

# _AFTER_POP: KEYS[1] = queue, KEYS[2] = unacknowledged list, KEYS[3] = acknowledged counter, KEYS[4] = the
# doorbell (cleared when the pop left the queue empty). Returns the queue's length. After a 'lost' counter
# it puts what the LMOVEs took back at the queue's head, in order, and deletes both keys: nothing is popped.
_AFTER_POP = """
if redis.call('GET', KEYS[3]) == 'lost' then
  while redis.call('LLEN', KEYS[2]) > 0 do
    redis.call('LMOVE', KEYS[2], KEYS[1], 'RIGHT', 'LEFT')
  end
  redis.call('DEL', KEYS[2], KEYS[3])
end
local length = redis.call('LLEN', KEYS[1])
if length == 0 then
  redis.call('DEL', KEYS[4])
end
return length
"""


# proto-max-bulk-len per server connection (a worker asks once, not once per job)
_value_limits: weakref.WeakKeyDictionary[redis.ConnectionPool, int] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class PendingRollout:
    """An encoded entry waiting to be pushed: one rollout, or an actor group's rollouts of one rollout id.
    ``stream_id`` names whose rollout ids it continues (an actor's, or a group's): the queue keeps one marker
    per stream."""

    stream_id: int | str
    rollout_id: int
    payload: bytes


@dataclass(frozen=True)
class PushReport:
    """What push did: seconds spent waiting for space, and the rollouts refused as already pushed."""

    waited_seconds: float
    duplicates: tuple[PendingRollout, ...]
    room_left: int | None = None
    """Entries the queue had room for after the last of these pushes, as its last length read says (None: not
    read, as for a push sent ahead that went in)."""


@dataclass(frozen=True)
class Popped:
    """What one pop returned: entries with their absolute indices on the unacknowledged list."""

    entries: list[bytes]
    first_index: int
    size_before: int
    size_after: int
    head: int
    oversized: int = 0
    """Entries over ``max_entry_bytes`` dropped in Redis, unread (-1: this Redis user may not measure entries)."""


class QueuePush(enum.IntEnum):
    """What the out-of-sync queue's push script answers (and LOST_REPLY: no reply came, push again to learn it)."""

    FULL = 0
    PUSHED = 1
    DUPLICATE = 2
    MINE = 3
    NOT_HOLDER = 4
    LOST_REPLY = -1


class SentPush:
    """A push sent on a connection of its own whose reply is read later (``TrajectoryQueue.finish``), or never
    (``abandon``: the connection is closed, and what Redis did is left to the idempotent re-push)."""

    def __init__(self, rollout: PendingRollout, token: str, lease: tuple[str, str] | None, sent: SentCommands):
        self.rollout, self.token, self.lease = rollout, token, lease
        self._sent = sent

    def reply(self) -> QueuePush:
        """The push script's result (a QueuePush), or LOST_REPLY when no reply came or the transaction aborted
        while queuing; the connection always goes back to its pool. An error the commands met inside the
        transaction (a key of the wrong type, say) is raised, as ``try_push`` raises it."""
        replies = self._sent.read(4)  # MULTI's OK, QUEUED for RPUSH and EVAL, then EXEC's replies
        if replies is None or any(isinstance(reply, Exception) for reply in replies) or not isinstance(
                replies[3], list):
            log.debug("the reply to a sent push was lost (%s); pushing it again", replies)
            return QueuePush.LOST_REPLY
        for reply in replies[3]:
            if isinstance(reply, Exception):
                raise reply
        return QueuePush(int(replies[3][1]))

    def abandon(self) -> None:
        """Close the connection without reading the reply (a job that ends before it needs the outcome)."""
        self._sent.abandon()


ACKNOWLEDGE_ALL = -1
REDIS_MAX_VALUE_BYTES = 512 * 2**20  # Redis's default proto-max-bulk-len: the largest value one command carries
MARKER_GRACE_ROLLOUTS = 2


def _lease_lost(lease: tuple[str, str]) -> LeaseLostError:
    """The error of a push the script refused because ``lease`` = (lease key, holder) no longer holds."""
    return LeaseLostError(f"{lease[0]} no longer names {lease[1]} (another job took the group over, or Redis "
                          f"restarted and lost it): not pushing")


class QueueIndicesLost(RqrlError):
    """The run's acknowledged counter held no index: the unacknowledged list was reset, as after a Redis
    restart; the learner realigns its indices (``Inbox.restart_indices``) and pops again."""


class TrajectoryQueue:
    """One run's out-of-sync queue."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, bound: int, marker_grace_seconds: float | None = None,
                 max_value_bytes: int | None = None, max_entry_bytes: int = MAX_ENTRY_BYTES,
                 learner_token: str | None = None):
        """``marker_grace_seconds`` (for a job's pushes; None: off): an actor whose pushes keep being refused
        as duplicates for that long, over at least MARKER_GRACE_ROLLOUTS rollouts, has a marker that
        cannot be right: ``push`` lowers it and pushes, with a warning (see ``_impossible_markers``).
        ``max_entry_bytes``: the largest entry pushed, and popped (larger ones are dropped in Redis, unread).
        ``learner_token``: the popping learner's (``rqrl.engine.learner_token``); a pop finds out in its own round
        trip that another learner took the run over."""
        self.connection = connection
        self.keys = keys
        self.learner_token = learner_token
        self.bound = bound
        self.marker_grace_seconds = marker_grace_seconds
        self.max_value_bytes = max_value_bytes  # None: asked of the server at the first push
        self.max_entry_bytes = max_entry_bytes
        self.markers_repaired = 0
        self._duplicate_since: dict[int | str, tuple[float, int]] = {}
        self._lower_marker = connection.register_script(_LOWER_MARKER)

    def _push_keys(self, lease: tuple[str, str] | None) -> tuple[list[str], str]:
        """The push script's keys, and the lease holder it must find ('' without a fence)."""
        keys = [self.keys.trajectories, self.keys.pushed_rollouts, self.keys.pushed_by, self.keys.doorbell]
        if lease is None:
            return keys, ""
        return [*keys, lease[0]], lease[1]

    def try_push(self, rollouts: Sequence[PendingRollout], token: str = "",
                 lease: tuple[str, str] | None = None) -> list[QueuePush]:
        """Push what fits, in order, in one atomic call; returns PUSHED, FULL, DUPLICATE or MINE (QueuePush) per
        entry (MINE: pushed already under the same non-empty ``token``), or NOT_HOLDER for all if
        ``lease`` = (lease key, holder) is given and the key does not hold that holder."""
        if not rollouts:
            return []
        keys, holder = self._push_keys(lease)
        with self.connection.pipeline(transaction=True) as pipe:
            for rollout in rollouts:  # each entry is pushed by a plain RPUSH, then kept or taken back
                pipe.rpush(self.keys.trajectories, rollout.payload)
                pipe.eval(_PUSH_BOUNDED, len(keys), *keys, self.bound, token, holder, rollout.stream_id,
                          rollout.rollout_id)
            replies = pipe.execute()
        return [QueuePush(int(result)) for result in replies[1::2]]

    def send(self, rollout: PendingRollout, token: str, lease: tuple[str, str] | None = None) -> SentPush | None:
        """Send the push of one entry without waiting for Redis's reply, so the worker steps its next rollout
        meanwhile (``finish`` reads the reply); None, having sent nothing, for an entry over the server's value
        limit or when the send fails (then ``push`` it)."""
        if len(rollout.payload) > self._value_limit():
            return None
        keys, holder = self._push_keys(lease)
        commands = [("MULTI",), ("RPUSH", self.keys.trajectories, rollout.payload),
                    ("EVAL", _PUSH_BOUNDED, len(keys), *keys, self.bound, token, holder, rollout.stream_id,
                     rollout.rollout_id), ("EXEC",)]
        sent = SentCommands.send(self.connection, commands)
        return None if sent is None else SentPush(rollout, token, lease, sent)

    def finish(self, sent: SentPush, is_stopped: Callable[[], bool],
               on_wait: Callable[[], None] = lambda: None) -> PushReport:
        """The outcome of a ``send``: its reply if it pushed the entry; otherwise (queue full, a duplicate, a lost
        reply) ``push`` again, which takes a resent entry this token pushed already as pushed."""
        result = sent.reply()
        if result in (QueuePush.PUSHED, QueuePush.MINE):
            self._impossible_markers([sent.rollout], [])  # the stream is fine: forget its duplicate streak
            return PushReport(0.0, ())
        if result == QueuePush.NOT_HOLDER:
            assert sent.lease is not None
            raise _lease_lost(sent.lease)
        return self.push([sent.rollout], is_stopped, on_wait, token=sent.token, lease=sent.lease,
                         found_full=result == QueuePush.FULL)

    def push(
        self,
        rollouts: Sequence[PendingRollout],
        is_stopped: Callable[[], bool],
        on_wait: Callable[[], None] = lambda: None,
        max_poll_seconds: float = 0.02,
        token: str = "",
        lease: tuple[str, str] | None = None,
        found_full: bool = False,
    ) -> PushReport:
        """Push all rollouts, waiting while the queue is full; ``token`` names the pusher (one per job
        run), so a retried command is not mistaken for a duplicate of another job's rollout; with
        ``lease`` = (lease key, holder) only while the pusher holds that lease. ``found_full``: a push just
        found the queue full, so wait for room before sending the payload again.

        Raises RunStoppedError if the run stops while waiting (the rollouts are dropped), and
        LeaseLostError if the pusher no longer holds ``lease`` (nothing more is pushed).
        """
        pending = list(rollouts)
        chunks = self._chunks(pending)
        duplicates: list[PendingRollout] = []
        poll, waited = 0.0005, 0.0
        last_check = time.monotonic()
        room, room_read = 0 if found_full else self._room(len(pending)), not found_full and len(pending) > 1
        while True:
            wait_started, slept = time.monotonic(), False
            while room <= 0:  # no payload is sent until there is room for it
                time.sleep(poll)
                slept = True
                poll = min(poll * 2, max_poll_seconds)
                if time.monotonic() - last_check > 0.2:
                    last_check = time.monotonic()
                    on_wait()
                    if is_stopped():
                        raise RunStoppedError(f"run {self.keys.run_name!r} stopped while waiting for queue space")
                room, room_read = self.bound - self.size(), True
            if slept:  # the seconds spent waiting for room, not pushing
                waited += time.monotonic() - wait_started
            sent, rest = pending[:room], pending[room:]
            results = self.try_push(sent, token, lease) if chunks == 1 else self._try_push_chunked(sent, token, lease)
            if QueuePush.NOT_HOLDER in results:
                assert lease is not None
                raise _lease_lost(lease)
            refused = [rollout for rollout, result in zip(sent, results, strict=True) if result == QueuePush.DUPLICATE]
            retry = self._impossible_markers(sent, refused)
            duplicates += [rollout for rollout in refused if rollout not in retry]
            full = [rollout for rollout, result in zip(sent, results, strict=True) if result == QueuePush.FULL]
            pending = full + retry + rest
            if not pending:
                break
            room, room_read = (len(pending), False) if retry else (self.bound - self.size(), True)
        return PushReport(waited, tuple(duplicates),
                          room - len(sent) if room_read else None)

    def _room(self, wanted: int) -> int:
        """The room the first attempt counts on: what the queue has (one LLEN, no payload), of which it sends what
        fits. Sending them all into a full queue would move every refused rollout's bytes to Redis for nothing."""
        if wanted <= 1:
            return wanted  # the push script says FULL for one rollout as cheaply as LLEN would
        return self.bound - self.size()

    def _value_limit(self) -> int:
        """The largest entry pushed: ``max_entry_bytes``, or what the server takes in one command when that is
        less (proto-max-bulk-len; 512 MB if not readable)."""
        return min(self.max_entry_bytes, self._server_value_limit())

    def _server_value_limit(self) -> int:
        if self.max_value_bytes is None:
            pool = self.connection.connection_pool  # asked once per server connection, not once per job
            limit = _value_limits.get(pool)
            if limit is None:
                try:
                    reply = self.connection.config_get("proto-max-bulk-len")
                    limit = int(next(iter(reply.values())) or "")
                except (redis.ResponseError, StopIteration, ValueError, TypeError):  # e.g. an ACL without CONFIG
                    limit = REDIS_MAX_VALUE_BYTES
                _value_limits[pool] = limit
            self.max_value_bytes = limit
        return self.max_value_bytes

    def _chunks(self, rollouts: Sequence[PendingRollout]) -> int:
        """How many push calls ``rollouts`` need; ConfigError for a rollout Redis would refuse (a broken pipe
        after retries, otherwise)."""
        limit = self._value_limit()
        for rollout in rollouts:
            if len(rollout.payload) > limit:
                raise ConfigError(
                    f"stream {rollout.stream_id}'s rollout {rollout.rollout_id} is {len(rollout.payload) / 2**20:.1f} "
                    f"MB encoded, over the {limit / 2**20:.0f} MB a queue entry may be (the learner's limit, or "
                    f"Redis's proto-max-bulk-len where smaller): use a shorter n_rollout_steps, fewer actors_per_job, "
                    f"or smaller observations"
                )
        total = sum(len(rollout.payload) for rollout in rollouts)
        return 1 if total <= limit else 2

    def _try_push_chunked(self, rollouts: Sequence[PendingRollout], token: str,
                          lease: tuple[str, str] | None) -> list[QueuePush]:
        """try_push in calls of at most the server's value limit each (one rollout per actor per call set)."""
        limit, size = self._value_limit(), 0
        results: list[QueuePush] = []
        chunk: list[PendingRollout] = []
        for rollout in rollouts:
            if chunk and size + len(rollout.payload) > limit:
                results += self.try_push(chunk, token, lease)
                chunk, size = [], 0
            chunk.append(rollout)
            size += len(rollout.payload)
        return results + self.try_push(chunk, token, lease)

    def _impossible_markers(self, pushed: Sequence[PendingRollout],
                            refused: Sequence[PendingRollout]) -> list[PendingRollout]:
        """The refused entries whose stream's marker cannot be right, after lowering it below them.

        A job re-run from its group's recorded progress meets duplicates only for the rollouts its dead
        predecessor pushed after its last progress write (at most a lease refresh interval of them), so
        duplicates for ``marker_grace_seconds`` over MARKER_GRACE_ROLLOUTS or more rollouts mean a marker
        no rqrl job wrote (junk far beyond the run), which would starve the stream silently."""
        if self.marker_grace_seconds is None:
            return []
        now = time.monotonic()
        refused_streams = {rollout.stream_id for rollout in refused}
        for rollout in pushed:
            if rollout.stream_id not in refused_streams:
                self._duplicate_since.pop(rollout.stream_id, None)
        retry = []
        for rollout in refused:
            since, first = self._duplicate_since.setdefault(rollout.stream_id, (now, rollout.rollout_id))
            if now - since < self.marker_grace_seconds or rollout.rollout_id - first < MARKER_GRACE_ROLLOUTS:
                continue
            old = int(self._lower_marker(keys=[self.keys.pushed_rollouts],
                                         args=[rollout.stream_id, rollout.rollout_id]))
            self._duplicate_since.pop(rollout.stream_id, None)
            if old >= 0:
                self.markers_repaired += 1
                log.warning("%s says stream %s pushed rollout %d, but its pushes were refused as duplicates for "
                            "%.0f s (rollouts %d..%d): no rqrl job wrote that marker; lowered it to %d (if this "
                            "recurs, something other than rqrl writes to this Redis)", self.keys.pushed_rollouts,
                            rollout.stream_id, old, now - since, first, rollout.rollout_id, rollout.rollout_id - 1)
            retry.append(rollout)
        return retry

    def size(self) -> int:
        return int(self.connection.llen(self.keys.trajectories))

    def pop_available(self, count: int) -> list[bytes]:
        """Pop up to ``count`` rollouts without blocking, for a consumer that never looks back:
        everything popped before is acknowledged."""
        return self.pop(count, ACKNOWLEDGE_ALL).entries if count > 0 else []

    def pop(self, count: int, done_below: int = 0) -> Popped:
        """Acknowledge every unacknowledged entry with an absolute index below ``done_below``, then
        pop up to ``count`` onto the unacknowledged list, in one atomic round trip. RunTakenOverError if another
        learner holds the run: what this pop moved stays unacknowledged, for that learner to read."""
        queue, unacknowledged, acknowledged = self.keys.trajectories, self.keys.unacknowledged, self.keys.acknowledged
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.get(self.keys.learner_token)
            pipe.eval(_ACKNOWLEDGE, 2, unacknowledged, acknowledged,
                      done_below if done_below == ACKNOWLEDGE_ALL else max(done_below, 0))
            pipe.eval(SCREEN_SCRIPT, 2, queue, self.keys.scratch, max(count, 0), self.max_entry_bytes)
            for _ in range(max(count, 0)):
                pipe.lmove(queue, unacknowledged, "LEFT", "RIGHT")
            pipe.eval(_AFTER_POP, 4, queue, unacknowledged, acknowledged, self.keys.doorbell)
            holder, *replies = pipe.execute()
        if held_by_another(holder, self.learner_token):
            raise taken_over_error(self.keys.run_name)
        indices, dropped, moved, size_after = replies[0], int(replies[1]), replies[2:-1], int(replies[-1])
        if len(indices) == 1:
            raise self._indices_lost()
        head, first = (int(value) for value in indices)
        entries = [entry for entry in moved if entry is not None]
        return Popped(entries, first, size_after + len(entries), size_after, head, dropped)

    def wait_until_not_empty(self, timeout_seconds: float) -> bool:
        """Block up to ``timeout_seconds`` until a rollout may wait; pops nothing.

        It blocks on the doorbell, a one-entry list that pushes ring and pops clear once the queue is
        empty, not on the queue itself: a BLMOVE of the queue onto itself would carry a whole rollout
        back just to say so. On a timeout the queue's length decides, so rollouts the doorbell does not
        know of (a Redis restart between the two keys, a foreign writer) cost at most one timeout."""
        # redis-py hints the timeout as int, but BLMOVE takes a double number of seconds (0.05 works)
        rung = self.connection.blmove(self.keys.doorbell, self.keys.doorbell,
                                      timeout_seconds,  # type: ignore[arg-type]
                                      "LEFT", "LEFT") is not None
        return rung or self.size() > 0

    def unacknowledged(self, start: int = 0, stop: int = -1) -> tuple[list[bytes], int]:
        """Unacknowledged rollouts from absolute index ``start`` (to ``stop``, inclusive, -1: all):
        ``(entries, absolute index of the first)``; what a dead learner had in hand."""
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.get(self.keys.acknowledged)
            pipe.lrange(self.keys.unacknowledged, 0, -1)
            raw_head, entries = pipe.execute()
        try:
            head = int(raw_head or 0)
        except ValueError:
            head = -1
        if head < 0:
            self.connection.delete(self.keys.unacknowledged, self.keys.acknowledged)
            raise self._indices_lost()
        first = max(start, head)
        last = head + len(entries) - 1 if stop < 0 else min(stop, head + len(entries) - 1)
        if last < first:
            return [], first
        return list(entries[first - head:last - head + 1]), first

    def _indices_lost(self) -> QueueIndicesLost:
        log.warning("%s held no index: reset it and %s (the learner realigns its indices, as after a Redis "
                    "restart; if this recurs, something other than rqrl writes to this Redis)",
                    self.keys.acknowledged, self.keys.unacknowledged)
        return QueueIndicesLost(f"{self.keys.acknowledged} held no index; it was reset: realign and pop again")
