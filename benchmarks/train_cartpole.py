"""Wall-clock seconds and env steps until IMPALA (or PPO) solves an env: rqrl's distributed actors (or
garage sampler) next to a single-process baseline, side by side in one run.

*rqrl*: ``rqrl.algorithms.impala.train`` with its default actors (embedded Redis, one local RQ worker
per core, the learner in this process). *baseline*: the same learner, loss and hyperparameters on
``SerialDistributedActors``, which steps the job's ``ActorGroup`` in the learner's process
(no Redis, no workers, always on-policy). Solved = mean return of the last 100 episodes at or
above the env's reward threshold. Seeds alternate between the variants so machine noise hits all.
*ppo*: ``rqrl.algorithms.ppo.train`` on its default ``RQSampler`` (embedded Redis, local workers);
*ppo-baseline*: the same on ``LocalSampler`` (the logical workers in the learner's process, the same
episodes for the same weights). *dqn*: ``rqrl.algorithms.dqn.train`` (DQN through the SEED trainer: actor
threads, a central inference server, transitions over Redis), capped at ``--dqn-seconds``.
The table's last column is what ``rqrl train`` names as the run's bottleneck (IMPALA only).

Run from the repository root::

    python benchmarks/train_cartpole.py --seeds 0 1 2
    python benchmarks/train_cartpole.py --env Acrobot-v1 --seeds 0 1 2
    python benchmarks/train_cartpole.py --variants rqrl baseline ppo ppo-baseline dqn --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import tempfile
import time

import numpy as np

from rqrl import LocalSampler, NewEnvUpdate
from rqrl.algorithms import dqn, ppo
from rqrl.algorithms.common import TrainResult, env_spaces, make_flat_env
from rqrl.algorithms.impala import ActorCritic, ImpalaConfig, train
from rqrl.maze.serial import SerialDistributedActors

VARIANTS = {"rqrl": "IMPALA, rqrl (Redis, local workers)",
            "baseline": "IMPALA, baseline (1 process, serial ActorGroup)",
            "ppo": "PPO, rqrl (RQSampler: Redis, local workers)",
            "ppo-baseline": "PPO, baseline (1 process, LocalSampler)",
            "dqn": "DQN, rqrl SEED (Redis, central inference)"}

log = logging.getLogger("train_cartpole")


def run_ppo(env_id: str, seed: int, variant: str, budget: int, run_dir: str) -> TrainResult:
    config = ppo.PpoConfig(env_id=env_id, seed=seed, total_env_steps=budget, run_dir=run_dir,
                           run_name=f"{variant}-{seed}", progress=False)
    sampler = None
    if variant == "ppo-baseline":
        obs_size, n_actions, _ = env_spaces(env_id)
        sampler = LocalSampler(ActorCritic(obs_size, n_actions, config.hidden_size),
                               NewEnvUpdate(functools.partial(make_flat_env, env_id)),
                               max_episode_length=ppo.max_episode_length(config), n_workers=config.n_workers, seed=seed)
    return ppo.train(config, sampler=sampler)


def run_once(env_id: str, seed: int, variant: str, budget: int, run_dir: str, dqn_seconds: float) -> dict:
    if variant == "dqn":
        started = time.monotonic()
        result = dqn.train(dqn.DqnConfig(env_id=env_id, seed=seed, seconds=dqn_seconds, total_env_steps=budget,
                                         run_dir=run_dir, run_name=f"{variant}-{seed}", progress=False))
        wall = time.monotonic() - started
        log.info("  %-12s seed %d: solved=%s in %.1f s, %s env steps", variant, seed, result.solved, wall,
                 f"{result.env_steps:,}")
        return {"solved": result.solved, "seconds": wall, "env_steps": result.env_steps, "bottleneck": None}
    if variant.startswith("ppo"):
        started = time.monotonic()
        result = run_ppo(env_id, seed, variant, budget, run_dir)
        wall = time.monotonic() - started
        log.info("  %-12s seed %d: solved=%s in %.1f s, %s env steps", variant, seed, result.solved, wall,
                 f"{result.env_steps:,}")
        return {"solved": result.solved, "seconds": wall, "env_steps": result.env_steps, "bottleneck": None}
    config = ImpalaConfig(env_id=env_id, seed=seed, total_env_steps=budget, run_dir=run_dir,
                          run_name=f"{variant}-{seed}", progress=False)
    actors = None
    if variant == "baseline":
        obs_size, n_actions, _ = env_spaces(env_id)
        seeds = np.random.SeedSequence(seed).generate_state(2 * config.n_actors).tolist()
        actors = SerialDistributedActors(
            functools.partial(make_flat_env, env_id), ActorCritic(obs_size, n_actions, config.hidden_size),
            config.n_rollout_steps, config.n_actors, config.batch_size,
            actor_env_seeds=seeds[: config.n_actors], actor_agent_seeds=seeds[config.n_actors:])
    started = time.monotonic()
    result = train(config, actors=actors)
    wall = time.monotonic() - started  # includes start-up (Redis, workers) and shut-down
    log.info("  %-8s seed %d: solved=%s in %.1f s, %s env steps, mean return %.1f; %s", variant, seed,
             result.solved, wall, f"{result.env_steps:,}", result.mean_return or float("nan"), result.bottleneck_detail)
    bottleneck = result.bottleneck if variant == "rqrl" else None  # the serial baseline has no queue to wait on
    return {"solved": result.solved, "seconds": wall, "env_steps": result.env_steps, "bottleneck": bottleneck}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=2_000_000, help="env steps before giving up on a seed")
    parser.add_argument("--variants", nargs="+", default=["rqrl", "baseline"], choices=list(VARIANTS))
    parser.add_argument("--dqn-seconds", type=float, default=600.0, help="time budget of each DQN run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    results: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-") as run_dir:
        for index, seed in enumerate(args.seeds):
            order = args.variants if index % 2 == 0 else list(reversed(args.variants))
            for variant in order:
                log.info("%s, seed %d (%d/%d): %s", args.env, seed, index + 1, len(args.seeds), variant)
                results[variant].append(run_once(args.env, seed, variant, args.budget, run_dir, args.dqn_seconds))
    print(f"\n{args.env}: time and env steps to solve, median over seeds {args.seeds}\n")
    print("| learner and sampling | solved | median seconds | median env steps | median steps/s | seconds per seed "
          "| bottleneck per seed |")
    print("|---|--:|--:|--:|--:|---|---|")
    for variant, runs in results.items():
        seconds = [run["seconds"] for run in runs]
        steps = [run["env_steps"] for run in runs]
        rates = [run["env_steps"] / run["seconds"] for run in runs]
        label = VARIANTS[variant]
        print(f"| {label} | {sum(run['solved'] for run in runs)}/{len(runs)} | {statistics.median(seconds):.1f} "
              f"| {statistics.median(steps):,.0f} | {statistics.median(rates):,.0f} "
              f"| {', '.join(f'{s:.1f}' for s in seconds)} "
              f"| {', '.join(run['bottleneck'] or '-' for run in runs)} |")
    for distributed, baseline in (("rqrl", "baseline"), ("ppo", "ppo-baseline")):
        if distributed in results and baseline in results:
            speedup = statistics.median(run["seconds"] for run in results[baseline]) / statistics.median(
                run["seconds"] for run in results[distributed])
            print(f"\n{VARIANTS[distributed]} solves {speedup:.2f}x as fast as {VARIANTS[baseline]} (median "
                  f"wall-clock).")


if __name__ == "__main__":
    main()
