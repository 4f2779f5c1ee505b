"""What every peer script shares: its arguments, the benchmark policy, numpy sampling and the JSON result line.

Each ``<peer>_throughput.py`` runs in that peer's own venv (see install.sh), so this module imports nothing from
rqrl: only the standard library, numpy and torch, which every venv has.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

ENV_ID = "CartPole-v1"


def make_policy() -> torch.nn.Module:
    """The benchmark policy: a 4-64-64-2 tanh MLP giving logits, same initial weights everywhere (as in
    benchmarks/actors_throughput.py)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 2)).eval()


def numpy_act(policy: torch.nn.Module, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """One batched forward and numpy sampling from the softmax: the reference's policy step."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        actions = (probs.cumsum(axis=1) < rng.random((len(probs), 1))).sum(axis=1)
        return np.minimum(actions, probs.shape[1] - 1)

    return act


@dataclass(frozen=True)
class Result:
    """One configuration's measurement, printed as one JSON line that run.py parses."""

    system: str
    workers: int
    envs_per_worker: int
    steps: int
    seconds: float
    steps_per_second: float
    path: str


def parse_args(description: str, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--envs-per-worker", type=int, nargs="+", default=[8, 32], help="E: envs per worker")
    parser.add_argument("--rollout-steps", type=int, default=128, help="rollout length, where the peer has one")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per configuration")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds stepped before the window opens")
    parser.add_argument("--check", action="store_true",
                        help="import the peer, print its versions and exit (install.sh's check)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.workers < 1 or min(args.envs_per_worker) < 1 or args.rollout_steps < 1 or args.seconds <= 0:
        parser.error("expected --workers, --envs-per-worker, --rollout-steps >= 1 and --seconds > 0")
    return args


def versions(**packages: str) -> str:
    """'python 3.11.7, torch 2.13.0+cpu, ...': what install.sh records and run.py shows."""
    parts = {"python": platform.python_version(), "torch": torch.__version__, **packages}
    return ", ".join(f"{name} {version}" for name, version in parts.items())


def emit(result: Result) -> None:
    print(json.dumps(asdict(result)), flush=True)


def timed_window(step: Callable[[], int], seconds: float, warmup: float) -> tuple[int, float]:
    """Call ``step`` (which returns env steps done) through ``warmup`` seconds, then count steps for at least
    ``seconds``; returns (steps, elapsed seconds)."""
    warm_until = time.perf_counter() + warmup
    while time.perf_counter() < warm_until:
        step()
    steps = 0
    started = time.perf_counter()
    while True:
        steps += step()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return steps, elapsed


def main(system: str, path: str, package_versions: Callable[[], str],
         measure: Callable[[argparse.Namespace, int], tuple[int, float]], description: str,
         argv: list[str] | None = None,
         extra: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """Parse arguments; with --check print versions, else measure and emit one line per E."""
    args = parse_args(description, argv, extra)
    if args.check:
        print(package_versions())
        return
    torch.set_num_threads(1)
    for envs in args.envs_per_worker:
        steps, seconds = measure(args, envs)
        emit(Result(system, args.workers, envs, steps, seconds, steps / seconds, path))
    sys.stdout.flush()
