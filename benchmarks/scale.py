"""Scaling with worker processes on one machine, and what each rollout costs Redis.

An env whose ``step`` sleeps ``--step-ms`` (2 ms by default; observations like CartPole's, episodes of
200 steps) is stepped by ``W`` local RQ workers of ``SubprocDistributedActors`` for W in ``--workers``
(1 2 4 8 16 by default), each worker stepping one actor group of ``--actors-per-worker`` envs. The
work is mostly waiting, so on a small machine the ideal is linear: ``W`` x the one-worker rate.
The table gives delivered env steps/s, the ratio to linear, and CPU use.

For each run the script also reads Redis's own counters (``INFO commandstats``, ``INFO stats``,
``INFO cpu``) before and after the window and reports, per 1,000 rollouts delivered: commands,
bytes into and out of Redis, and Redis CPU seconds. From those it projects how many rollouts/s one
Redis server (one core) carries, the number the written projection for 100+ workers rests on.

Run from the repository root::

    python benchmarks/scale.py --seconds 10 --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass

import gymnasium
import numpy as np
import redis
import torch

import rqrl
from rqrl.maze.actors import SubprocDistributedActors

log = logging.getLogger("scale")

EPISODE_STEPS = 200


class SleepEnv(gymnasium.Env):
    """A CartPole-sized env whose step costs wall time, not CPU: ``step_seconds`` of sleep."""

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        return self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        time.sleep(self.step_seconds)
        self._steps += 1
        obs = self.np_random.uniform(-0.05, 0.05, 4).astype(np.float32)
        return obs, 1.0, False, self._steps >= EPISODE_STEPS, {}


class SleepEnvFactory:
    """Picklable factory of :class:`SleepEnv` (the engine signs and ships it to the workers)."""

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds

    def __call__(self) -> gymnasium.Env:
        return SleepEnv(self.step_seconds)


def make_policy() -> torch.nn.Module:
    """The 4-64-64-2 tanh MLP of the other throughput benchmarks."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 2)).eval()


@dataclass(frozen=True)
class RedisCost:
    """Redis's own counters over a window: commands by name, bytes in and out, CPU seconds."""

    commands: dict[str, int]
    bytes_in: int
    bytes_out: int
    cpu_seconds: float

    @staticmethod
    def read(connection: redis.Redis) -> RedisCost:
        commandstats = connection.info("commandstats")
        stats = connection.info("stats")
        cpu = connection.info("cpu")
        # Redis 7 names subcommands "script|exists": a space keeps the markdown table intact
        commands = {name.removeprefix("cmdstat_").replace("|", " "): int(value["calls"])
                    for name, value in commandstats.items()}
        return RedisCost(commands, int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"]),
                         float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))

    def since(self, before: RedisCost) -> RedisCost:
        commands = {name: calls - before.commands.get(name, 0) for name, calls in self.commands.items()}
        return RedisCost({name: calls for name, calls in commands.items() if calls > 0},
                         self.bytes_in - before.bytes_in, self.bytes_out - before.bytes_out,
                         self.cpu_seconds - before.cpu_seconds)


@dataclass(frozen=True)
class Measurement:
    workers: int
    steps: int
    rollouts: int
    seconds: float
    redis: RedisCost
    learner_cpu_seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds

    def per_thousand_rollouts(self, value: float) -> float:
        return 1000.0 * value / self.rollouts if self.rollouts else float("nan")


def measure(workers: int, args: argparse.Namespace) -> Measurement:
    """Delivered steps and Redis's cost over ``args.seconds`` with ``workers`` local workers."""
    n_actors = workers * args.actors_per_worker
    policy = make_policy()
    actors = SubprocDistributedActors(
        SleepEnvFactory(args.step_ms / 1000.0), policy, args.rollout_steps, n_actors, workers,
        args.queue_factor, "fork", list(range(n_actors)), [1000 + actor for actor in range(n_actors)],
        n_workers=workers, actors_per_job=args.actors_per_worker,
    )
    with actors:
        actors.broadcast_updated_policy(policy.state_dict())
        actors.collect_outputs("cpu")  # includes start-up: not measured
        warm_until = time.perf_counter() + args.warmup
        while time.perf_counter() < warm_until:
            actors.collect_outputs("cpu")
        connection = actors.connection
        redis_before = RedisCost.read(connection)
        cpu_before = os.times()
        steps = rollouts = 0
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < args.seconds:
            out = actors.collect_outputs("cpu")
            steps += int(out.record.rewards.numel())
            rollouts += int(out.record.rewards.shape[1])
        elapsed = time.perf_counter() - started
        cpu_after = os.times()
        cost = RedisCost.read(connection).since(redis_before)
    learner_cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return Measurement(workers, steps, rollouts, elapsed, cost, learner_cpu)


def print_tables(args: argparse.Namespace, rounds: list[dict[int, Measurement]]) -> None:
    counts = sorted(rounds[0])
    base = min(counts)
    print()
    print(f"## Scaling: env step sleeps {args.step_ms:g} ms, {args.actors_per_worker} envs per worker, "
          f"{args.rollout_steps}-step rollouts, {args.seconds:g} s window, {len(rounds)} round(s)")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, {platform.python_implementation()} {platform.python_version()}, "
          f"torch {torch.__version__}, rqrl {rqrl.__version__}")
    print()
    print(f"| workers | steps/s | x linear (vs {base} worker(s)) | rollouts/s | learner CPU | redis CPU |")
    print("|--:|--:|--:|--:|--:|--:|")
    for workers in counts:
        rates = [measured[workers].steps_per_second for measured in rounds]
        linear = [measured[workers].steps_per_second / (measured[base].steps_per_second * workers / base)
                  for measured in rounds]
        middle = statistics.median
        print(f"| {workers} | {middle(rates):,.0f} | {middle(linear):.2f} | "
              f"{middle(m[workers].rollouts / m[workers].seconds for m in rounds):,.1f} | "
              f"{middle(m[workers].learner_cpu_seconds / m[workers].seconds for m in rounds):.2f} | "
              f"{middle(m[workers].redis.cpu_seconds / m[workers].seconds for m in rounds):.3f} |")
    print()
    print("x linear: steps/s over (one-worker steps/s x workers), the median of per-round ratios. CPU columns "
          "are cores (CPU s per wall s).")
    print()
    print("## Redis cost per 1,000 rollouts delivered (medians over rounds)")
    print()
    print("| workers | commands | bytes in (MB) | bytes out (MB) | Redis CPU s | rollouts/s one Redis core carries "
          "| top commands (calls per 1,000 rollouts) |")
    print("|--:|--:|--:|--:|--:|--:|:--|")
    for workers in counts:
        def per_k(value, workers: int = workers) -> float:  # noqa: ANN001 - a function of one Measurement
            return statistics.median(m[workers].per_thousand_rollouts(value(m[workers])) for m in rounds)

        commands = per_k(lambda m: sum(m.redis.commands.values()))
        cpu = per_k(lambda m: m.redis.cpu_seconds)
        last = rounds[-1][workers]
        top = sorted(last.redis.commands.items(), key=lambda item: -item[1])[:6]
        top_text = ", ".join(f"{name} {last.per_thousand_rollouts(calls):,.0f}" for name, calls in top)
        print(f"| {workers} | {commands:,.0f} | {per_k(lambda m: m.redis.bytes_in) / 1e6:.2f} | "
              f"{per_k(lambda m: m.redis.bytes_out) / 1e6:.2f} | {cpu:.3f} | "
              f"{(1000.0 / cpu if cpu > 0 else float('nan')):,.0f} | {top_text} |")
    print()
    print(f"A rollout here is {args.rollout_steps} steps of a 4-float observation. 'rollouts/s one Redis core "
          "carries' = 1,000 / (Redis CPU s per 1,000 rollouts): the ceiling of one Redis server, before the "
          "network.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="worker counts")
    parser.add_argument("--actors-per-worker", type=int, default=4, help="envs each worker steps together")
    parser.add_argument("--step-ms", type=float, default=2.0, help="sleep per env step, milliseconds")
    parser.add_argument("--rollout-steps", type=int, default=128, help="n_rollout_steps")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per worker count")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds after the first batch")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all worker counts")
    parser.add_argument("--queue-factor", type=float, default=2.0, help="queue_out_of_sync_factor")
    args = parser.parse_args(argv)
    if min(args.workers) < 1 or args.actors_per_worker < 1 or args.rollout_steps < 1 or args.rounds < 1:
        parser.error("expected --workers, --actors-per-worker, --rollout-steps and --rounds >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.step_ms < 0:
        parser.error("expected --seconds > 0, --warmup >= 0 and --step-ms >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    rounds: list[dict[int, Measurement]] = []
    for round_index in range(args.rounds):
        measured: dict[int, Measurement] = {}
        order = args.workers if round_index % 2 == 0 else list(reversed(args.workers))
        for workers in order:
            log.info("round %d/%d: %d worker(s), %g s", round_index + 1, args.rounds, workers, args.seconds)
            measured[workers] = result = measure(workers, args)
            log.info("    %.0f steps/s, %d rollouts", result.steps_per_second, result.rollouts)
        rounds.append(measured)
    print_tables(args, rounds)


if __name__ == "__main__":
    main()
