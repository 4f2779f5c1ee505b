"""What stepping a preprocessed Atari env costs: ``make_atari_env`` as rqrl builds it (the base env observes its
128-byte RAM, which the preprocessing discards) against the same env observing its RGB screen (gymnasium's default,
copied out at every one of the 4 frames an agent step repeats), side by side in one run; both give the same
observations (tests/unit/test_atari.py checks it).

Each round steps each env for ``--steps`` agent steps with the same random actions, alternating which goes first.

Run from the repository root (needs the ``atari`` extra)::

    python benchmarks/atari_step.py --env ALE/Pong-v5 ALE/Breakout-v5
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from rqrl.algorithms.atari import make_atari_env

SIDES = {"RGB screen (before)": {"obs_type": "rgb"}, "RAM (now)": {}}


def step_seconds(env_id: str, options: dict[str, str], steps: int, seed: int) -> float:
    """Seconds per agent step of ``steps`` random steps, resets included."""
    env = make_atari_env(env_id, **options)
    try:
        env.reset(seed=seed)
        actions = np.random.default_rng(seed).integers(env.action_space.n, size=steps).tolist()
        started = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
        return (time.perf_counter() - started) / steps
    finally:
        env.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", nargs="+", default=["ALE/Pong-v5"], help="ALE env ids")
    parser.add_argument("--steps", type=int, default=3000, help="agent steps per env per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (sides alternate which goes first)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        parser.error("expected --steps and --rounds >= 1")
    print(f"## An agent step of make_atari_env's env (4 frames, 84x84 grayscale, a stack of 4), {args.steps:,} random "
          f"steps x {args.rounds} rounds, Python {platform.python_version()}")
    print()
    print("| env | base env observes | us per agent step (median) | rounds | / RGB screen |")
    print("|:--|:--|--:|:--|--:|")
    for env_id in args.env:
        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        for round_index in range(args.rounds):
            order = list(SIDES) if round_index % 2 == 0 else list(reversed(SIDES))
            for side in order:
                seconds[side].append(step_seconds(env_id, SIDES[side], args.steps, seed=round_index))
        baseline = statistics.median(seconds["RGB screen (before)"])
        for side, values in seconds.items():
            middle = statistics.median(values)
            print(f"| {env_id} | {side} | {middle * 1e6:.0f} | {', '.join(f'{v * 1e6:.0f}' for v in values)} | "
                  f"{middle / baseline:.2f} |")


if __name__ == "__main__":
    main()
