"""Popping the next batch while the learner trains (RunOptions.pop_ahead): env steps/s with it on and off.

A learner loop of ``collect_outputs`` then a training step, on image_obs.py's 84x84x4 random frame stacks and its
small conv policy, with W local workers of E envs each (one rollout of every actor a batch). The training step is
``sleep`` (the CPU idle for the given milliseconds, as a learner waiting on its GPU is), ``cpu`` (an actual update of
the conv policy on the batch, on this process's one torch thread: it competes with the workers for the cores) or
``cuda`` (the same update on the GPU, the batch collected straight onto it, its loss read back as a learner's
metrics are). The two settings run side by side, alternating which goes first, in one process.

Run from the repository root::

    python benchmarks/pop_ahead.py --train sleep --train-ms 0 50 --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.image_obs import ConvPolicy, make_env
from rqrl.maze.actors import SubprocDistributedActors
from rqrl.maze.records import BatchedRecord

log = logging.getLogger("pop_ahead")


@dataclass(frozen=True)
class Measurement:
    steps: int
    seconds: float
    collect_seconds: list[float]
    """Each collect_outputs call's own time (its dequeue_time)."""

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds

    @property
    def collect_ms(self) -> float:
        return 1000 * statistics.fmean(self.collect_seconds) if self.collect_seconds else float("nan")


def training_step(mode: str, milliseconds: float, policy: ConvPolicy,
                  optimizer: torch.optim.Optimizer) -> Callable[[BatchedRecord], None]:
    """What the learner does with each batch: sleep, or one gradient step of the policy (its logits' mean, a
    stand-in loss with the real forward and backward passes over every observation) on the policy's device; the
    loss is read back (as a learner reads its metrics), which waits for a GPU step to finish."""
    def sleep(batch: BatchedRecord) -> None:
        time.sleep(milliseconds / 1000)

    def update(batch: BatchedRecord) -> None:
        obs = batch.obs.flatten(0, 1)
        loss = policy(obs).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()

    return sleep if mode == "sleep" else update


def measure(pop_ahead: bool, train_ms: float, args: argparse.Namespace) -> Measurement:
    n_actors = args.workers * args.envs
    policy = ConvPolicy().eval()
    device = "cuda" if args.train == "cuda" else "cpu"  # where the learner's batches and policy live
    learner_policy = ConvPolicy().to(device)
    optimizer = torch.optim.SGD(learner_policy.parameters(), lr=1e-4)
    train = training_step(args.train, train_ms, learner_policy, optimizer)
    actors = SubprocDistributedActors(make_env, policy, args.rollout_steps, n_actors, n_actors, 2.0, "fork",
                                      list(range(n_actors)), [1000 + a for a in range(n_actors)],
                                      n_workers=args.workers, actors_per_job=args.envs, pop_ahead=pop_ahead)
    with actors:
        actors.broadcast_updated_policy(policy.state_dict())
        warm_until = time.perf_counter() + args.warmup
        while time.perf_counter() < warm_until:
            train(actors.collect_outputs(device).record)
        steps, collect_seconds = 0, []
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            outputs = actors.collect_outputs(device)
            collect_seconds.append(outputs.dequeue_time)
            steps += int(outputs.record.rewards.numel())
            train(outputs.record)
        elapsed = time.perf_counter() - started
    return Measurement(steps, elapsed, collect_seconds)


def print_table(args: argparse.Namespace, results: dict[float, list[dict[bool, Measurement]]]) -> None:
    print(f"\n{args.workers} workers x {args.envs} envs, {args.rollout_steps}-step rollouts, batches of "
          f"{args.workers * args.envs} rollouts, training step: {args.train}; {args.rounds} round(s) of "
          f"{args.seconds:.0f} s a side\n")
    print("| training step | pop_ahead off: steps/s | on: steps/s | on / off | collect ms off | collect ms on |")
    print("|:--|--:|--:|--:|--:|--:|")
    for train_ms, rounds in results.items():
        step = f"sleep {train_ms:.0f} ms" if args.train == "sleep" else f"conv update on {args.train}"
        for measured in rounds:
            off, on = measured[False], measured[True]
            print(f"| {step} | {off.steps_per_second:,.0f} | {on.steps_per_second:,.0f} | "
                  f"{on.steps_per_second / off.steps_per_second:.2f} | {off.collect_ms:.1f} | {on.collect_ms:.1f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--envs", type=int, default=8, help="envs per worker")
    parser.add_argument("--rollout-steps", type=int, default=64, help="n_rollout_steps")
    parser.add_argument("--train", choices=("sleep", "cpu", "cuda"), default="sleep", help="the training step")
    parser.add_argument("--train-ms", type=float, nargs="+", default=[0.0, 50.0],
                        help="milliseconds each sleep step takes (--train sleep)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (the settings alternate which goes first)")
    args = parser.parse_args(argv)
    if min(args.workers, args.envs, args.rollout_steps, args.rounds) < 1 or args.seconds <= 0 or min(args.train_ms) < 0:
        parser.error("expected --workers, --envs, --rollout-steps, --rounds >= 1, --seconds > 0, --train-ms >= 0")
    if args.train == "cuda" and not torch.cuda.is_available():
        parser.error("--train cuda needs a CUDA GPU that torch can see (torch.cuda.is_available() is False)")
    if args.train != "sleep":
        args.train_ms = [0.0]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    results: dict[float, list[dict[bool, Measurement]]] = {train_ms: [] for train_ms in args.train_ms}
    for round_index in range(args.rounds):
        for train_ms in args.train_ms:
            order = [False, True] if round_index % 2 == 0 else [True, False]
            measured = {}
            for pop_ahead in order:
                log.info("round %d/%d, training step %s %.0f ms: pop_ahead %s", round_index + 1, args.rounds,
                         args.train, train_ms, "on" if pop_ahead else "off")
                measured[pop_ahead] = measure(pop_ahead, train_ms, args)
                log.info("    %.0f steps/s, collect %.1f ms", measured[pop_ahead].steps_per_second,
                         measured[pop_ahead].collect_ms)
            results[train_ms].append(measured)
    print_table(args, results)


if __name__ == "__main__":
    main()
