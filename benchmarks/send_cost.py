"""The client's CPU to send a large value: redis-py's default packer (hiredis's, where installed) against rqrl's
clients (``rqrl.engine.connection.connect``: redis-py's Python packer, large values sent uncopied), side by side.

Each command is what a worker or learner sends: a rollout entry pushed in a MULTI (``RPUSH``, as a worker pushes one),
and a weights blob (``SET``, as a learner publishes one). CPU time of this process, best of ``--repeats`` runs of
``--count`` commands, on a private Redis, with malloc keeping freed buffers as rqrl's processes do
(``rqrl.engine.memory``; without it hiredis's copy also pays a page fault per 4 KB, 1.4 ms per MB).

Run from the repository root::

    python benchmarks/send_cost.py
"""

from __future__ import annotations

import argparse
import os
import time

import redis

from rqrl.engine.connection import connect
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.sent_commands import SentCommands
from rqrl.engine.server import EmbeddedRedis

SIZES_MB = (0.25, 1.0, 6.75)


def push(client: redis.Redis, value: bytes) -> None:
    """A worker's push of one entry, sent ahead and read back (the replies of MULTI, RPUSH, EXEC)."""
    sent = SentCommands.send(client, [("MULTI",), ("RPUSH", "queue", value), ("EXEC",)])
    assert sent is not None and sent.read(3) is not None
    client.ltrim("queue", 1, 0)


def publish(client: redis.Redis, value: bytes) -> None:
    client.set("weights", value)


def cpu_ms(command, client: redis.Redis, value: bytes, count: int, repeats: int) -> float:  # noqa: ANN001
    """The best of ``repeats`` runs: CPU milliseconds per command."""
    command(client, value)
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(count):
            command(client, value)
        best = min(best, (time.process_time() - started) / count)
    return 1000 * best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30, help="commands per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs (the best is kept)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeats < 1:
        parser.error("expected --count and --repeats >= 1")
    keep_freed_memory()  # as every rqrl learner and worker does: freed buffers come back without page faults
    rows = []
    with EmbeddedRedis() as server:
        default, rqrl_client = redis.Redis.from_url(server.url), connect(server.url)
        packer = type(default.connection_pool.make_connection()._command_packer).__name__
        for name, command in (("RPUSH in MULTI", push), ("SET", publish)):
            for megabytes in SIZES_MB:
                value = os.urandom(int(megabytes * 1e6))
                before = cpu_ms(command, default, value, args.count, args.repeats)
                after = cpu_ms(command, rqrl_client, value, args.count, args.repeats)
                rows.append((name, megabytes, before, after))
    print(f"\nclient CPU ms per command; redis-py's default packer here: {packer}\n")
    print("| command | value MB | redis-py default | rqrl (uncopied) | default / rqrl |")
    print("|:--|--:|--:|--:|--:|")
    for name, megabytes, before, after in rows:
        print(f"| {name} | {megabytes:g} | {before:.2f} | {after:.2f} | {before / after:.1f} |")


if __name__ == "__main__":
    main()
