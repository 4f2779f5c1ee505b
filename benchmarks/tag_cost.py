"""What tagging costs: keyed BLAKE3 (what rqrl signs with) against HMAC-SHA256 (what it signed with before), side
by side in one run, on the blobs a run tags: one per queue entry or episode on the worker, checked again on the
learner, and one per weights broadcast.

Sizes are those that cross Redis (``benchmarks/frame_bytes.py`` and ``benchmarks/queue_bytes.py`` measure them):

- *CartPole entry*: 8 actors x 64 steps, about 50 bytes a step;
- *Atari entry, zstd*: 8 envs x 64 steps of Pong's unique frames after zstd, about 55 bytes a step;
- *random frames entry*: 8 envs x 64 steps of one incompressible 84x84 frame each (``benchmarks/image_obs.py``);
- *Nature CNN weights*: about 1.7M float32 parameters.

The payload's contents do not change a hash's speed, so they are random bytes. Rounds alternate the order.

Run from the repository root::

    python benchmarks/tag_cost.py
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import statistics
import time
from collections.abc import Callable

from rqrl.engine.codec import payload_tag

SHAPES = [  # (name, bytes, env steps it carries; 0: not per step)
    ("CartPole entry", 8 * 64 * 50, 8 * 64),
    ("Atari entry, zstd", 8 * 64 * 55, 8 * 64),
    ("random frames entry", 8 * 64 * 84 * 84, 8 * 64),
    ("Nature CNN weights", 1_686_180 * 4, 0),
]


def hmac_sha256(payload: bytes, key: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


TAGS: dict[str, Callable[[bytes, bytes], bytes]] = {"HMAC-SHA256": hmac_sha256, "keyed BLAKE3": payload_tag}


def seconds_per_tag(tag: Callable[[bytes, bytes], bytes], payload: bytes, key: bytes, seconds: float) -> float:
    """Mean seconds of one tag over about ``seconds`` of calls."""
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(8):
            tag(payload, key)
        calls += 8
    return elapsed / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the table gives their median")
    args = parser.parse_args(argv)
    key = os.urandom(32)
    results: dict[tuple[str, str], list[float]] = {}
    for round_index in range(args.rounds):
        for name, size, _ in SHAPES:
            payload = os.urandom(size)
            order = list(TAGS) if round_index % 2 == 0 else list(reversed(TAGS))
            for tag_name in order:
                results.setdefault((name, tag_name), []).append(
                    seconds_per_tag(TAGS[tag_name], payload, key, args.seconds))
    print(f"\nTag cost, median of {args.rounds} rounds (one tag on the worker and one check on the learner each):\n")
    print("| blob | bytes | HMAC-SHA256 µs | keyed BLAKE3 µs | BLAKE3 GB/s | HMAC / BLAKE3 | µs saved per env step |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, size, steps in SHAPES:
        old = statistics.median(results[(name, "HMAC-SHA256")])
        new = statistics.median(results[(name, "keyed BLAKE3")])
        per_step = f"{2 * (old - new) / steps * 1e6:.2f}" if steps else "-"
        print(f"| {name} | {size:,} | {old * 1e6:,.1f} | {new * 1e6:,.1f} | {size / new / 1e9:.2f} | {old / new:.1f}x "
              f"| {per_step} |")


if __name__ == "__main__":
    main()
