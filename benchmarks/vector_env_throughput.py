"""Env steps per second of ``rqrl.maze.vector_env.SubprocVectorEnv`` next to gymnasium's ``AsyncVectorEnv``.

Both step the same env factories, the same number of envs, with the same pre-drawn random actions,
in processes started with the same method; gymnasium's with ``shared_memory=True`` (its fastest
setting) and its default autoreset mode. Envs: CartPole-v1 (tiny observations: the pipes and the
caller's per-step overhead dominate) and ``ImageEnv``, a toy with Atari-sized ``Box(0, 255, (84, 84, 4),
uint8)`` observations (copying observations dominates).

Rounds interleave the two (alternating which goes first) so machine noise hits both; the table
gives medians over rounds, the median of the per-round ratios, and steps per CPU-second (the
caller's and its env processes' CPU time, from /proc), which divides out load from other processes.

Run from the repository root::

    python benchmarks/vector_env_throughput.py --seconds 5 --rounds 5 --n-envs 2 4
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv

from rqrl.maze.vector_env import SubprocVectorEnv

IMAGE_SHAPE = (84, 84, 4)


class ImageEnv(gymnasium.Env):
    """Atari-sized uint8 observations from a small bank of frames; 200-step episodes; nearly free to step."""

    observation_space = spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
    action_space = spaces.Discrete(4)

    def __init__(self, episode_length: int = 200):
        self.episode_length = episode_length
        self.frames = np.random.default_rng(0).integers(0, 256, (8, *IMAGE_SHAPE), dtype=np.uint8)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.frames[0], {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self.frames[(self.t + int(action)) % len(self.frames)], 1.0, self.t >= self.episode_length, False, {}


def make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


def make_image_env() -> gymnasium.Env:
    return ImageEnv()


ENVS: dict[str, tuple[Callable[[], gymnasium.Env], int]] = {
    "CartPole-v1": (make_cartpole, 2),
    "image 84x84x4 uint8": (make_image_env, 4),
}


@dataclass(frozen=True)
class Measurement:
    steps: int
    seconds: float
    cpu_seconds: float | None

    @property
    def rate(self) -> float:
        return self.steps / self.seconds

    @property
    def rate_per_cpu(self) -> float | None:
        return self.steps / self.cpu_seconds if self.cpu_seconds else None


Rounds = list[tuple[Measurement, Measurement]]


def _cpu_seconds(pids: list[int]) -> float | None:
    """User+system CPU seconds of this process and of ``pids`` (Linux /proc; None elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in ["self", *pids]:
        try:
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def measure(step: Callable[[np.ndarray], object], pids: list[int], actions: np.ndarray, seconds: float) -> Measurement:
    """Step for ``seconds`` of wall time with the pre-drawn ``actions`` (cycled); count env steps."""
    n_envs, calls = actions.shape[1], 0
    cpu_before = _cpu_seconds(pids)
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        for action in actions:
            step(action)
        calls += len(actions)
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - started
    cpu_after = _cpu_seconds(pids)
    cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return Measurement(calls * n_envs, elapsed, cpu)


def compare(env_name: str, n_envs: int, args: argparse.Namespace) -> Rounds:
    """Per round, (rqrl, gymnasium) measurements on the same factories and actions."""
    factory, n_actions = ENVS[env_name]
    actions = np.random.default_rng(1).integers(0, n_actions, (64, n_envs))
    rounds: Rounds = []
    with SubprocVectorEnv([factory] * n_envs, start_method=args.start_method) as rqrl_envs:
        gym_envs = AsyncVectorEnv([factory] * n_envs, shared_memory=True, context=args.start_method)
        try:
            rqrl_envs.seed(list(range(n_envs)))
            rqrl_envs.reset()
            gym_envs.reset(seed=list(range(n_envs)))
            contenders = {
                "rqrl": (rqrl_envs.step, [process.pid for process in rqrl_envs.processes]),
                "gymnasium": (gym_envs.step, [process.pid for process in gym_envs.processes]),
            }
            for step, pids in contenders.values():  # warm up
                measure(step, pids, actions, min(args.seconds, 0.2))
            for index in range(args.rounds):
                order = ["rqrl", "gymnasium"] if index % 2 == 0 else ["gymnasium", "rqrl"]
                result = {name: measure(*contenders[name], actions, args.seconds) for name in order}
                rounds.append((result["rqrl"], result["gymnasium"]))
        finally:
            gym_envs.close()
    return rounds


def print_table(args: argparse.Namespace, results: dict[tuple[str, int], Rounds]) -> None:
    print()
    print(f"## SubprocVectorEnv vs. gymnasium AsyncVectorEnv(shared_memory=True), start method "
          f"{args.start_method}, {args.rounds} rounds x {args.seconds:g} s")
    print()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"machine: {os.cpu_count()} logical CPUs, load average {load and f'{load[0]:.1f}'}, "
          f"{platform.python_implementation()} {platform.python_version()}, gymnasium {gymnasium.__version__}")
    print()
    print("| env | n_envs | rqrl steps/s | gymnasium steps/s | ratio | rqrl steps/CPU-s | gymnasium steps/CPU-s "
          "| ratio per CPU-s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for (env_name, n_envs), rounds in results.items():
        ours = statistics.median(r.rate for r, _ in rounds)
        theirs = statistics.median(g.rate for _, g in rounds)
        ratio = statistics.median(r.rate / g.rate for r, g in rounds)
        per_cpu = [(r.rate_per_cpu, g.rate_per_cpu) for r, g in rounds if r.rate_per_cpu and g.rate_per_cpu]
        if per_cpu:
            cpu_columns = (f"{statistics.median(r for r, _ in per_cpu):,.0f} | "
                           f"{statistics.median(g for _, g in per_cpu):,.0f} | "
                           f"{statistics.median(r / g for r, g in per_cpu):.2f}")
        else:
            cpu_columns = "n/a | n/a | n/a"
        print(f"| {env_name} | {n_envs} | {ours:,.0f} | {theirs:,.0f} | {ratio:.2f} | {cpu_columns} |")
    print()
    print("Steps/s are medians over rounds; ratios are medians of per-round ratios (rqrl / gymnasium). "
          "Steps per CPU-second count the caller's and the env processes' CPU time.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="wall-clock seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per configuration")
    parser.add_argument("--n-envs", type=int, nargs="+", default=[2, 4], help="numbers of envs to compare")
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS), help="which envs to step")
    parser.add_argument("--start-method", default="forkserver", help="multiprocessing start method for both")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = {(env_name, n_envs): compare(env_name, n_envs, args) for env_name in args.envs for n_envs in args.n_envs}
    print_table(args, results)


if __name__ == "__main__":
    main()
