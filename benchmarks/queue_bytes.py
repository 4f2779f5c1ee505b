"""Redis's CPU per megabyte moved through the out-of-sync queue, against the entry's size and the way it moves.

Each row pushes and pops entries of one size through a private redis-server and reads the server's own CPU
counters (``INFO cpu``) before and after, so the figure is what Redis spends, not the client:

* *queue*: ``TrajectoryQueue.try_push`` and ``pop`` as rqrl runs them (a MULTI of RPUSH and a check script
  that keeps the entry or LTRIMs it back; a MULTI of an acknowledge script, LMOVE and an after-pop script);
* *through Lua*: a script that takes the payload as an argument and RPUSHes it, and one that LPOPs and
  RPUSHes it onto the unacknowledged list and returns it (how the queue moved payloads before 2026-11-25);
* *plain*: RPUSH, LMOVE and LTRIM, no script at all (the floor).

Run from the repository root::

    python benchmarks/queue_bytes.py --sizes-mb 0.25 1 4 14 59 --megabytes 400
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import redis

from rqrl.engine.keys import RunKeys
from rqrl.engine.server import EmbeddedRedis
from rqrl.engine.trajectories import PendingRollout, TrajectoryQueue

_PUSH_THROUGH_LUA = "redis.call('RPUSH', KEYS[1], ARGV[1]) return 1"
_POP_THROUGH_LUA = """
local popped = redis.call('LPOP', KEYS[1], 1)
redis.call('RPUSH', KEYS[2], unpack(popped))
redis.call('LTRIM', KEYS[2], 1, -1)
return popped
"""


def redis_cpu_seconds(connection: redis.Redis) -> float:
    info = connection.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def measure(connection: redis.Redis, move: Callable[[int], None], entries: int, size: int) -> tuple[float, float]:
    """(Redis CPU ms per MB, wall ms per MB) of ``entries`` pushes and pops of ``size`` bytes."""
    connection.flushdb()
    cpu, started = redis_cpu_seconds(connection), time.perf_counter()
    for index in range(entries):
        move(index)
    megabytes = entries * size / 2**20
    return (1000 * (redis_cpu_seconds(connection) - cpu) / megabytes,
            1000 * (time.perf_counter() - started) / megabytes)


def movers(connection: redis.Redis, payload: bytes) -> dict[str, Callable[[int], None]]:
    keys = RunKeys("queue-bytes")
    queue = TrajectoryQueue(connection, keys, bound=1000, max_value_bytes=2**29)
    push_lua, pop_lua = connection.register_script(_PUSH_THROUGH_LUA), connection.register_script(_POP_THROUGH_LUA)

    def through_queue(index: int) -> None:
        queue.try_push([PendingRollout(0, index, payload)])
        queue.pop(1, -1)

    def through_lua(index: int) -> None:
        push_lua(keys=[keys.trajectories], args=[payload])
        pop_lua(keys=[keys.trajectories, keys.unacknowledged])

    def plain(index: int) -> None:
        connection.rpush(keys.trajectories, payload)
        connection.lmove(keys.trajectories, keys.unacknowledged, "LEFT", "RIGHT")
        connection.ltrim(keys.unacknowledged, 1, -1)

    return {"queue": through_queue, "through Lua": through_lua, "plain": plain}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.25, 1, 4, 14, 59], help="entry sizes")
    parser.add_argument("--megabytes", type=float, default=400, help="megabytes moved per size and way")
    args = parser.parse_args(argv)
    if min(args.sizes_mb) <= 0 or args.megabytes <= 0:
        parser.error("expected --sizes-mb and --megabytes > 0")
    print("| entry MB | queue: Redis CPU ms/MB | through Lua: Redis CPU ms/MB | plain: Redis CPU ms/MB "
          "| queue: wall ms/MB | through Lua / queue |")
    print("|--:|--:|--:|--:|--:|--:|")
    with EmbeddedRedis() as server:
        connection = redis.Redis.from_url(server.url)
        for size_mb in args.sizes_mb:
            size = max(1, int(size_mb * 2**20))
            entries = max(2, int(args.megabytes / size_mb))
            payload = os.urandom(size)
            results = {}
            for name, move in movers(connection, payload).items():
                print(f"{size_mb:g} MB x {entries}: {name}", file=sys.stderr, flush=True)
                results[name] = measure(connection, move, entries, size)
            queue_cpu, queue_wall = results["queue"]
            ratio = f"{results['through Lua'][0] / queue_cpu:.2f}" if queue_cpu > 0 else "n/a"
            print(f"| {size_mb:g} | {queue_cpu:.2f} | {results['through Lua'][0]:.2f} | {results['plain'][0]:.2f} | "
                  f"{queue_wall:.2f} | {ratio} |")
        connection.close()


if __name__ == "__main__":
    main()
