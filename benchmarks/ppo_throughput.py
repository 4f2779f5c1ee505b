"""PPO end to end against what its sampler delivers alone: env steps/s of each, side by side in one run.

Sides, for one shape (env, worker processes, logical workers, samples per iteration):

* *sampler* -- ``RQSampler.obtain_samples`` as PPO makes it (``rqrl.algorithms.ppo.make_sampler``), called
  back to back with fixed weights: what sampling alone delivers;
* *ppo, sample ahead* -- ``rqrl.algorithms.ppo.train`` as ``rqrl train ppo`` runs it: the next iteration is
  sampled while the learner trains on this one;
* *ppo, sample ahead, prefix only* -- the same with ``extra_episodes=False``: each call's episodes past the
  round-robin prefix are dropped, not trained on (the "episodes dropped per call" column shows what that costs);
* *ppo, in turn* -- ``sample_ahead=False``: sample, then train, then sample.

The sampler and the PPO sides keep the call's extra episodes (``extra_episodes``, PPO's default) unless named.

Steps/s of a PPO side are measured between its first and last update (``metrics.csv``), so start-up is left
out, as it is for the sampler (timed from its second call). Rounds alternate the order of the sides.

Run from the repository root::

    python benchmarks/ppo_throughput.py --iterations 8 --rounds 2
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rqrl.algorithms import ppo

log = logging.getLogger("ppo_throughput")


@dataclass(frozen=True)
class Rate:
    steps_per_second: float
    dropped_per_call: float


def config(args: argparse.Namespace, run_dir: str, sample_ahead: bool = True, extras: bool = True) -> ppo.PpoConfig:
    return ppo.PpoConfig(env_id=args.env, n_workers=args.n_workers, num_samples=args.num_samples,
                         workers=args.processes, total_env_steps=args.num_samples * args.iterations,
                         target_return=1e9, run_dir=run_dir, progress=False, metrics_seconds=0,
                         checkpoint_seconds=1e9, sample_ahead=sample_ahead, epochs=args.epochs,
                         minibatch_size=args.minibatch_size, extra_episodes=extras)


def measure_sampler(args: argparse.Namespace, run_dir: str) -> Rate:
    learner = ppo.PpoLearner(config(args, run_dir))
    weights = learner.cpu_state_dict()
    with ppo.make_sampler(learner.config, learner.model) as sampler:
        sampler.obtain_samples(0, args.num_samples, weights)
        dropped_before, steps, started = sampler.dropped_episodes, 0, time.perf_counter()
        for itr in range(1, args.iterations):
            steps += int(sampler.obtain_samples(itr, args.num_samples, weights).lengths.sum())
        elapsed = time.perf_counter() - started
        dropped = sampler.dropped_episodes - dropped_before
    return Rate(steps / elapsed, dropped / max(1, args.iterations - 1))


def measure_ppo(args: argparse.Namespace, run_dir: str, sample_ahead: bool, extras: bool = True) -> Rate:
    result = ppo.train(config(args, run_dir, sample_ahead, extras))
    with open(Path(result.run_dir) / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    first, last = rows[0], rows[-1]
    steps = float(last["env_steps"]) - float(first["env_steps"])
    seconds = float(last["seconds"]) - float(first["seconds"])
    dropped = float(last["dropped_episodes"]) - float(first["dropped_episodes"])
    return Rate(steps / seconds, dropped / max(1, len(rows) - 1))


SIDES = {"sampler": lambda args, folder: measure_sampler(args, folder),
         "ppo, sample ahead": lambda args, folder: measure_ppo(args, folder, True),
         "ppo, sample ahead, prefix only": lambda args, folder: measure_ppo(args, folder, True, extras=False),
         "ppo, in turn": lambda args, folder: measure_ppo(args, folder, False)}


def print_table(args: argparse.Namespace, results: dict[str, list[Rate]]) -> None:
    print()
    print(f"## PPO end to end against its sampler: {args.env}, {args.processes} worker processes, {args.n_workers} "
          f"logical workers, {args.num_samples} samples per iteration, {args.epochs} epochs of "
          f"{args.minibatch_size}-step minibatches, {args.iterations} iterations, {args.rounds} round(s)")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, torch {torch.__version__}")
    print()
    print("| side | env steps/s | / sampler | episodes dropped per call |")
    print("|:--|--:|--:|--:|")
    sampler = [rate.steps_per_second for rate in results["sampler"]]
    for side, rates in results.items():
        ratio = statistics.median(rate.steps_per_second / base for rate, base in zip(rates, sampler, strict=True))
        print(f"| {side} | {statistics.median(rate.steps_per_second for rate in rates):,.0f} | {ratio:.2f} | "
              f"{statistics.median(rate.dropped_per_call for rate in rates):.1f} |")
    print()
    print("Medians over rounds; the ratio is the median of each round's ratio to that round's sampler.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--processes", type=int, default=2, help="local worker processes")
    parser.add_argument("--n-workers", type=int, default=8, help="logical workers")
    parser.add_argument("--num-samples", type=int, default=4000, help="env steps per iteration")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=8, help="iterations per side and round")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if min(args.processes, args.n_workers, args.num_samples, args.iterations, args.rounds) < 1 or args.iterations < 2:
        parser.error("expected positive sizes and --iterations >= 2")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    results: dict[str, list[Rate]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(args.rounds):
            order = list(SIDES) if round_index % 2 == 0 else list(reversed(SIDES))
            for side in order:
                rate = SIDES[side](args, folder)
                results[side].append(rate)
                print(f"round {round_index + 1}/{args.rounds} {side}: {rate.steps_per_second:,.0f} steps/s",
                      flush=True)
    print_table(args, results)


if __name__ == "__main__":
    main()
