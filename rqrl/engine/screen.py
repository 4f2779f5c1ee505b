"""Pops that leave an oversized list entry in Redis, unread: a learner's defence against a Redis writer's junk.

A process that can write to Redis can push a 512 MB entry onto a list a learner pops: reading it would cost the
learner a gigabyte (the reply, then its copy) only to refuse it. ``SCREEN_SCRIPT`` runs in the same transaction
before the pop and drops, unread, head entries larger than the limit. MEMORY USAGE of the list (no payload leaves
Redis) lets every pop through when the whole list is smaller than one entry may be; else each entry the pop takes
is measured as a copy of its own (SORT ... STORE: no value enters Lua, nothing is replied) until the pop's count
fit; an oversized one is swapped for a tombstone that LREM takes out. It returns the entries dropped, or -1 when
this Redis user may not measure (an ACL without MEMORY USAGE, SORT or LSET): nothing screened.

The Maze queue screens its pops (``rqrl.engine.trajectories``), the SEED trainer its transition messages. garage's
episode lists are not screened: an episode's entry has no size bound below Redis's own (512 MB) that a long
episode of frames could not reach.
"""

from __future__ import annotations

import redis

MAX_ENTRY_BYTES = 64 * 2**20
"""The largest queue entry a learner reads (and a worker pushes): larger ones are dropped in Redis, unread."""

# KEYS[1] = the list, KEYS[2] = a scratch list; ARGV[1] = entries the pop takes, ARGV[2] = the largest entry (bytes)
SCREEN_SCRIPT = """
local ok, usage = pcall(redis.call, 'MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0')
if not ok then return -1 end
local limit = tonumber(ARGV[2])
if not usage or usage <= limit then return 0 end
local length, wanted = redis.call('LLEN', KEYS[1]), tonumber(ARGV[1])
local kept, dropped, index = 0, 0, 0
while kept < wanted and index < length do
  if not pcall(redis.call, 'SORT', KEYS[1], 'BY', 'nosort', 'LIMIT', index, 1, 'STORE', KEYS[2]) then return -1 end
  if redis.call('MEMORY', 'USAGE', KEYS[2], 'SAMPLES', '0') > limit then
    if not pcall(redis.call, 'LSET', KEYS[1], index, 'rqrl:oversized') then return -1 end
    dropped = dropped + 1
  else
    kept = kept + 1
  end
  index = index + 1
end
redis.call('DEL', KEYS[2])
if dropped > 0 then redis.call('LREM', KEYS[1], 0, 'rqrl:oversized') end
return dropped
"""


def screened_lpop(connection: redis.Redis, key: str, scratch: str, count: int,
                  max_entry_bytes: int = MAX_ENTRY_BYTES) -> tuple[list[bytes], int]:
    """Up to ``count`` entries from the head of list ``key``, with those over ``max_entry_bytes`` dropped in Redis,
    unread, in one transaction: ``(entries, dropped)`` (dropped -1: this Redis user may not measure entries).
    ``scratch`` is a key of the caller's namespace the screen copies one entry to (emptied before it ends). A Redis
    user that may not run scripts pops unscreened (dropped -1), so nothing is lost to a missing right."""
    try:
        with connection.pipeline(transaction=True) as pipe:
            pipe.eval(SCREEN_SCRIPT, 2, key, scratch, max(count, 0), max_entry_bytes)
            pipe.lpop(key, max(count, 0))
            dropped, popped = pipe.execute()
    except redis.exceptions.NoPermissionError as error:
        if "'eval'" not in str(error):
            raise
        dropped, popped = -1, connection.lpop(key, max(count, 0))
    return (list(popped) if isinstance(popped, list) else []), int(dropped)
