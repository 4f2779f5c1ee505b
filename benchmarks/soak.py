"""Soak test: memory of Redis, the learner and the workers over a long run, and throughput over time.

Runs ``SubprocDistributedActors`` (a private redis-server and ``--workers`` local worker
processes) on CartPole-v1 with a Linear(4,64)-Tanh-Linear(64,2) policy, and a learner loop that
collects continuously and broadcasts its weights after every collect (as a learner does after
each update). Every ``--interval`` seconds it samples Redis ``INFO memory`` ``used_memory``, the
number of keys (``DBSIZE``, and how many of them are per-rollout ``pushed`` markers and weights
blobs), the resident memory (``VmRSS`` from /proc) of the learner, of each worker and of the
redis-server, and the env steps per second since the previous sample. Each sample also ends the
learner's stats epoch (``reduce()``), as a learner logging once per interval would; with
``--no-reduce`` the epoch runs all along.

It prints one table row per sample, then the growth of every memory column from the first
sample after warm-up (``--warmup-samples``; default: from the 2nd sample) to the last.

Run from the repository root::

    python benchmarks/soak.py --minutes 10 --interval 30
"""

from __future__ import annotations

import argparse
import collections
import functools
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import redis
import torch

import rqrl
from rqrl import RolloutEvents, SubprocDistributedActors
from rqrl.maze.stats import event_name

log = logging.getLogger("soak")

ENV_ID = "CartPole-v1"
MIB = 1024 * 1024

# module level, so worker processes can import it by name from the cloudpickled reference
make_env = functools.partial(gymnasium.make, ENV_ID)


def make_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a live process (VmRSS in /proc/PID/status), None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (children, grandchildren, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if stat[0] != "Z":
                parents[int(entry.name)] = int(stat[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@dataclass
class Sample:
    index: int
    elapsed: float
    steps: int
    steps_per_second: float | None
    collects: int
    policy_version: int
    used_memory: int
    keys: int
    key_kinds: dict[str, int]
    redis_rss: int | None
    learner_rss: int | None
    worker_rss: list[int | None]
    mean_return: float | None
    groups_rerun: int
    records_rejected: int
    sample_seconds: float = 0.0


def count_key_kinds(connection: redis.Redis) -> dict[str, int]:
    """Keys by kind: the third part of ``rqrl:{run}:{kind}:...``, else the first part (``rq``)."""
    kinds: collections.Counter[str] = collections.Counter()
    for key in connection.scan_iter(count=10_000):
        parts = key.decode(errors="replace").split(":")
        kinds[parts[2] if parts[0] == "rqrl" and len(parts) > 2 else parts[0]] += 1
    return dict(kinds)


def take_sample(index: int, elapsed: float, steps: int, previous: Sample | None, collects: int,
                actors: SubprocDistributedActors, worker_pids: list[int], redis_pid: int, reduce: bool,
                key_breakdown: bool) -> Sample:
    began = time.perf_counter()
    connection = actors.connection
    used_memory = int(connection.info("memory")["used_memory"])
    keys = int(connection.dbsize())
    kinds = count_key_kinds(connection) if key_breakdown else {}
    if previous is not None and elapsed > previous.elapsed:
        rate: float | None = (steps - previous.steps) / (elapsed - previous.elapsed)
    else:
        rate = None
    # this epoch's values only (get_stats_value would fall back to the last reduced epoch)
    current = actors.get_epoch_stats_aggregator().current()
    mean_return = current.get(event_name(RolloutEvents.episode_return), {}).get("mean")
    rerun_now = int(current.get(event_name(RolloutEvents.groups_rerun), {}).get("sum", 0))
    if reduce:  # epochs end at each sample: keep a running total
        groups_rerun = rerun_now + (previous.groups_rerun if previous is not None else 0)
    else:
        groups_rerun = rerun_now
    if reduce:
        actors.get_epoch_stats_aggregator().reduce()
    sample = Sample(
        index=index, elapsed=elapsed, steps=steps, steps_per_second=rate, collects=collects,
        policy_version=actors.policy_version, used_memory=used_memory, keys=keys, key_kinds=kinds,
        redis_rss=rss_bytes(redis_pid), learner_rss=rss_bytes(os.getpid()),
        worker_rss=[rss_bytes(pid) for pid in worker_pids], mean_return=mean_return, groups_rerun=groups_rerun,
        records_rejected=actors.records_rejected,
    )
    sample.sample_seconds = time.perf_counter() - began
    return sample


def _mib(value: int | None) -> str:
    return "gone" if value is None else f"{value / MIB:.1f}"


def _count(kinds: dict[str, int], kind: str) -> str:
    return f"{kinds.get(kind, 0):,}" if kinds else "n/a"


def log_sample(sample: Sample, total_samples: int) -> None:
    rate = "n/a" if sample.steps_per_second is None else f"{sample.steps_per_second:,.0f}"
    log.info("sample %d/%d t=%.0f s: %s steps/s, redis used_memory %s MiB, %d keys, RSS redis %s / learner %s / "
             "workers %s MiB (sampled in %.2f s)", sample.index, total_samples, sample.elapsed, rate,
             _mib(sample.used_memory), sample.keys, _mib(sample.redis_rss), _mib(sample.learner_rss),
             " ".join(_mib(value) for value in sample.worker_rss), sample.sample_seconds)


def print_report(args: argparse.Namespace, samples: list[Sample], leftovers: list[str]) -> None:
    n_workers = len(samples[0].worker_rss)
    print()
    print(f"## Soak: {ENV_ID}, SubprocDistributedActors, {args.workers} local workers, {args.actors} actors x "
          f"{args.rollout_steps}-step rollouts, batches of {args.batch_size}, broadcast after every collect; "
          f"{args.minutes:g} min, a sample every {args.interval:g} s")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, {platform.python_implementation()} {platform.python_version()}, "
          f"torch {torch.__version__}, gymnasium {gymnasium.__version__}, rqrl {rqrl.__version__}, start method "
          f"{args.start_method}, stats epoch {'never reduced' if args.no_reduce else 'reduced at every sample'}")
    print()
    worker_headers = " | ".join(f"worker {index} RSS MiB" for index in range(n_workers))
    print(f"| sample | t s | steps/s | policy version | redis used_memory MiB | keys | pushed markers | weights keys "
          f"| redis RSS MiB | learner RSS MiB | {worker_headers} | mean return |")
    print("|" + "--:|" * (11 + n_workers))
    for s in samples:
        rate = "n/a" if s.steps_per_second is None else f"{s.steps_per_second:,.0f}"
        kinds = s.key_kinds
        workers = " | ".join(_mib(value) for value in s.worker_rss)
        mean_return = "n/a" if s.mean_return is None else f"{s.mean_return:.1f}"
        print(f"| {s.index} | {s.elapsed:.0f} | {rate} | {s.policy_version:,} | {s.used_memory / MIB:.1f} | "
              f"{s.keys:,} | {_count(kinds, 'pushed')} | {_count(kinds, 'weights')} | "
              f"{_mib(s.redis_rss)} | {_mib(s.learner_rss)} | {workers} | {mean_return} |")
    print()
    last = samples[-1]
    rates = [s.steps_per_second for s in samples if s.steps_per_second is not None]
    if rates:
        print(f"Throughput: {min(rates):,.0f} to {max(rates):,.0f} steps/s per interval, "
              f"{last.steps / last.elapsed:,.0f} steps/s over the run ({last.steps:,} steps, {last.collects:,} "
              f"collects and broadcasts); groups re-run: {last.groups_rerun}; records rejected: "
              f"{last.records_rejected}.")
    base_index = min(args.warmup_samples, len(samples) - 1)
    base = samples[base_index]
    minutes = (last.elapsed - base.elapsed) / 60
    columns: list[tuple[str, int | None, int | None, bool]] = [
        ("redis used_memory", base.used_memory, last.used_memory, True),
        ("keys", base.keys, last.keys, False),
        ("redis RSS", base.redis_rss, last.redis_rss, True),
        ("learner RSS", base.learner_rss, last.learner_rss, True),
        *((f"worker {index} RSS", base.worker_rss[index], last.worker_rss[index], True) for index in range(n_workers)),
    ]
    parts = []
    for name, first, final, is_bytes in columns:
        if first is None or final is None:
            parts.append(f"{name} n/a (process gone)")
            continue
        growth = final - first
        if is_bytes:
            per_minute = f", {growth / MIB / minutes:+,.1f} MiB/min" if minutes > 0 else ""
            parts.append(f"{name} {growth / MIB:+,.1f} MiB ({first / MIB:.1f} -> {final / MIB:.1f}{per_minute})")
        else:
            per_minute = f", {growth / minutes:+,.0f}/min" if minutes > 0 else ""
            parts.append(f"{name} {growth:+,} ({first:,} -> {final:,}{per_minute})")
    print()
    print(f"Growth from sample {base.index} (t={base.elapsed:.0f} s) to sample {last.index} (t={last.elapsed:.0f} s): "
          + "; ".join(parts) + ".")
    print()
    print(f"Processes left after stop(): {', '.join(leftovers) if leftovers else 'none'}.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--actors", type=int, default=8, help="n_actors")
    parser.add_argument("--rollout-steps", type=int, default=32, help="n_rollout_steps")
    parser.add_argument("--batch-size", type=int, default=8, help="batch_size")
    parser.add_argument("--queue-factor", type=float, default=2.0, help="queue_out_of_sync_factor")
    parser.add_argument("--start-method", default="forkserver",
                        help="multiprocessing start method of the workers (forkserver: their RSS is their own)")
    parser.add_argument("--warmup-samples", type=int, default=1,
                        help="samples before the growth baseline (1: growth from the 2nd sample)")
    parser.add_argument("--no-reduce", action="store_true",
                        help="never end the learner's stats epoch (a learner that never calls reduce())")
    parser.add_argument("--no-key-breakdown", dest="key_breakdown", action="store_false",
                        help="skip the SCAN that counts pushed markers and weights keys at each sample")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.interval <= 0 or args.workers < 1 or args.actors < 1 or args.batch_size < 1 \
            or args.rollout_steps < 1 or args.warmup_samples < 0:
        parser.error("expected --minutes, --interval > 0, --warmup-samples >= 0 and the counts >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    seconds = args.minutes * 60
    total_samples = int(seconds // args.interval) + 1
    policy = make_policy()
    actors = SubprocDistributedActors(
        make_env, policy, args.rollout_steps, args.actors, args.batch_size, args.queue_factor, args.start_method,
        list(range(args.actors)), [1_000 + actor for actor in range(args.actors)], n_workers=args.workers,
    )
    samples: list[Sample] = []
    watched: dict[str, int] = {}
    try:
        with actors:
            actors.broadcast_updated_policy(policy.state_dict())
            worker_pids = [process.pid for process in actors.local_workers.processes]
            redis_pid = actors.local_workers.server.process.pid
            watched = {f"worker {index} (pid {pid})": pid for index, pid in enumerate(worker_pids)}
            watched[f"redis-server (pid {redis_pid})"] = redis_pid
            log.info("started: redis-server pid %d, worker pids %s; the first batch includes worker start-up",
                     redis_pid, worker_pids)
            actors.collect_outputs("cpu")
            actors.broadcast_updated_policy(policy.state_dict())
            started = time.monotonic()
            steps = collects = 0
            samples.append(take_sample(1, 0.0, 0, None, 0, actors, worker_pids, redis_pid, not args.no_reduce,
                                       args.key_breakdown))
            log_sample(samples[-1], total_samples)
            next_sample = started + args.interval
            while len(samples) < total_samples:
                out = actors.collect_outputs("cpu")
                steps += int(out.record.rewards.numel())
                collects += 1
                actors.broadcast_updated_policy(policy.state_dict())
                now = time.monotonic()
                if now >= next_sample:
                    next_sample += args.interval
                    samples.append(take_sample(len(samples) + 1, now - started, steps, samples[-1], collects, actors,
                                               worker_pids, redis_pid, not args.no_reduce, args.key_breakdown))
                    log_sample(samples[-1], total_samples)
                    dead = [name for name, pid in watched.items() if not alive(pid)]
                    if dead:
                        log.warning("    gone: %s", ", ".join(dead))
    except KeyboardInterrupt:
        log.warning("interrupted: reporting the %d sample(s) taken", len(samples))
    # stop() has run: the workers, redis-server and anything else they started must be gone
    leftovers = [name for name, pid in watched.items() if alive(pid)]
    for pid in descendants(os.getpid()):
        command = command_line(pid)
        if "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command:
            continue  # multiprocessing's own helpers: they exit with this process
        if pid not in watched.values():
            leftovers.append(f"pid {pid} ({command[:80]})")
    if samples:
        print_report(args, samples, leftovers)
    if leftovers:
        log.error("processes left running: %s", leftovers)
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
