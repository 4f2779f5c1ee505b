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
    python benchmarks/train_cartpole.py --config examples/lunarlander.json --variants rqrl --budget 6000000

``--config FILE`` takes a run's settings as ``rqrl train --config`` does (a JSON object with the keys of a run's
config.json, ``algo`` naming the learner): they apply to that learner's variants, and its ``env_id`` replaces
``--env``. ``--workers`` sets the local workers of the rqrl variants; ``--run-dir`` keeps each run's metrics.csv.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import statistics
import tempfile
import time

import click
import numpy as np

from rqrl import LocalSampler, NewEnvUpdate
from rqrl.algorithms import dqn, ppo
from rqrl.algorithms.common import TrainResult, env_spaces, make_flat_env
from rqrl.algorithms.impala import ActorCritic, ImpalaConfig, train
from rqrl.cli.config_file import file_algorithm, file_settings, read_settings
from rqrl.maze.serial import SerialDistributedActors

VARIANTS = {"rqrl": "IMPALA, rqrl (Redis, local workers)",
            "baseline": "IMPALA, baseline (1 process, serial ActorGroup)",
            "ppo": "PPO, rqrl (RQSampler: Redis, local workers)",
            "ppo-baseline": "PPO, baseline (1 process, LocalSampler)",
            "dqn": "DQN, rqrl SEED (Redis, central inference)"}

log = logging.getLogger("train_cartpole")
CONFIGS = {"impala": ImpalaConfig, "ppo": ppo.PpoConfig, "dqn": dqn.DqnConfig}


def algorithm_of(variant: str) -> str:
    """The learner a variant trains: ``ppo`` for the PPO variants, ``dqn``, else IMPALA."""
    return "ppo" if variant.startswith("ppo") else "dqn" if variant == "dqn" else "impala"


def settings_from_file(path: str | None) -> tuple[str | None, dict]:
    """The algorithm and checked settings of ``--config`` (None and {} without one), as ``rqrl train`` reads them."""
    if path is None:
        return None, {}
    data = read_settings(path)
    algo = file_algorithm(path, data, None)
    return algo, file_settings(path, data, algo, CONFIGS[algo])


def run_settings(variant: str, config_algo: str | None, config: dict, workers: int | None) -> dict:
    """Extra config settings of one variant's run: the file's, where it names this variant's learner, and
    ``--workers`` for the variants with local workers."""
    settings = dict(config) if config_algo == algorithm_of(variant) else {}
    if workers is not None and variant in ("rqrl", "ppo"):
        settings["workers"] = workers
    return settings


def run_ppo(env_id: str, seed: int, variant: str, budget: int, run_dir: str, settings: dict) -> TrainResult:
    config = ppo.PpoConfig(**{"total_env_steps": budget, **settings, "env_id": env_id, "seed": seed,
                              "run_dir": run_dir, "run_name": f"{variant}-{seed}", "progress": False})
    sampler = None
    if variant == "ppo-baseline":
        obs_size, n_actions, _ = env_spaces(env_id)
        sampler = LocalSampler(ActorCritic(obs_size, n_actions, config.hidden_size),
                               NewEnvUpdate(functools.partial(make_flat_env, env_id)),
                               max_episode_length=ppo.max_episode_length(config), n_workers=config.n_workers, seed=seed)
    return ppo.train(config, sampler=sampler)


def run_once(env_id: str, seed: int, variant: str, budget: int, run_dir: str, dqn_seconds: float,
             settings: dict) -> dict:
    if variant == "dqn":
        started = time.monotonic()
        result = dqn.train(dqn.DqnConfig(**{"seconds": dqn_seconds, "total_env_steps": budget, **settings,
                                            "env_id": env_id, "seed": seed, "run_dir": run_dir,
                                            "run_name": f"{variant}-{seed}", "progress": False}))
        wall = time.monotonic() - started
        log.info("  %-12s seed %d: solved=%s in %.1f s, %s env steps", variant, seed, result.solved, wall,
                 f"{result.env_steps:,}")
        return {"solved": result.solved, "seconds": wall, "env_steps": result.env_steps, "bottleneck": None}
    if variant.startswith("ppo"):
        started = time.monotonic()
        result = run_ppo(env_id, seed, variant, budget, run_dir, settings)
        wall = time.monotonic() - started
        log.info("  %-12s seed %d: solved=%s in %.1f s, %s env steps", variant, seed, result.solved, wall,
                 f"{result.env_steps:,}")
        return {"solved": result.solved, "seconds": wall, "env_steps": result.env_steps, "bottleneck": None}
    config = ImpalaConfig(**{"total_env_steps": budget, **settings, "env_id": env_id, "seed": seed,
                             "run_dir": run_dir, "run_name": f"{variant}-{seed}", "progress": False})
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
    parser.add_argument("--env", default=None, help="gymnasium env id (default: --config's env_id, else CartPole-v1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=None,
                        help="env steps before giving up on a seed (default: --config's total_env_steps, else 2M)")
    parser.add_argument("--variants", nargs="+", default=["rqrl", "baseline"], choices=list(VARIANTS))
    parser.add_argument("--dqn-seconds", type=float, default=600.0, help="time budget of each DQN run")
    parser.add_argument("--config", help="JSON settings, as `rqrl train --config` takes (for its algo's variants)")
    parser.add_argument("--workers", type=int, help="local workers of the rqrl IMPALA and PPO variants")
    parser.add_argument("--run-dir", help="keep each run's folder (metrics.csv) here (default: a temporary one)")
    args = parser.parse_args()
    try:
        config_algo, config = settings_from_file(args.config)
    except click.UsageError as error:  # a bad file, said in one line
        parser.error(error.message)
    file_env, file_budget = config.pop("env_id", None), config.pop("total_env_steps", None)
    config.pop("run_dir", None)  # --run-dir, or a temporary folder
    args.env = args.env or file_env or "CartPole-v1"
    args.budget = args.budget or file_budget or 2_000_000
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    results: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    with contextlib.ExitStack() as stack:
        run_dir = args.run_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="rqrl-bench-"))
        for index, seed in enumerate(args.seeds):
            order = args.variants if index % 2 == 0 else list(reversed(args.variants))
            for variant in order:
                log.info("%s, seed %d (%d/%d): %s", args.env, seed, index + 1, len(args.seeds), variant)
                settings = run_settings(variant, config_algo, config, args.workers)
                results[variant].append(run_once(args.env, seed, variant, args.budget, run_dir, args.dqn_seconds,
                                                 settings))
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
