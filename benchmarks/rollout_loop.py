"""CPU time per env step of rqrl's rollout loop (``ActorGroup.run``) next to a plain reference, in-process.

Each measurement runs in a fresh child process (one torch thread) and counts *its own* CPU time
(``time.process_time``), so other load on the machine barely moves it. Sides:

* ``loop`` -- ``ActorGroup.run`` with ``make_act_function`` of a tanh MLP ``obs-64-64-actions``
  (one side per ``--impl`` directory: put an older checkout's root there for an A/B);
* ``reference`` -- a gymnasium ``SyncVectorEnv`` of the same envs, one batched forward of the same
  MLP per step and numpy inverse-CDF sampling: no records, no checks (issue 10's yardstick).

Rounds interleave the sides (rotating which goes first); the table gives medians of env steps per
CPU-second. Run from the repository root::

    python benchmarks/rollout_loop.py --envs 8 32 --env-ids CartPole-v1 Acrobot-v1 --rounds 5
    python benchmarks/rollout_loop.py --impl /tmp/rqrl-base --impl . --rounds 5   # A/B of two checkouts
    python benchmarks/rollout_loop.py --profile --envs 32   # cProfile of ActorGroup.run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _policy(obs_size: int, n_actions: int):  # noqa: ANN202 - torch imported in the child only
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(obs_size, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, n_actions)).eval()


def _sizes(env_id: str) -> tuple[int, int]:
    import gymnasium

    env = gymnasium.make(env_id)
    return int(env.observation_space.shape[0]), int(env.action_space.n)


def _run_loop(env_id: str, n_envs: int, n_steps: int, rollouts: int, profile: bool) -> float:
    import gymnasium

    from rqrl.engine.policy import make_act_function
    from rqrl.maze.rollout import ActorGroup

    group = ActorGroup(lambda: gymnasium.make(env_id), list(range(n_envs)), list(range(n_envs)),
                       [1000 + i for i in range(n_envs)], n_steps)
    act = make_act_function(_policy(*_sizes(env_id)), group.action_space)
    group.run(act, 0, 1, cut_at_end=False)  # warm-up
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.process_time()
    for rollout_id in range(1, rollouts + 1):
        group.run(act, rollout_id, 1, cut_at_end=False)
    seconds = time.process_time() - start
    if profile:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return rollouts * n_steps * n_envs / seconds


def _run_reference(env_id: str, n_envs: int, n_steps: int, rollouts: int) -> float:
    import gymnasium
    import numpy as np
    import torch

    policy = _policy(*_sizes(env_id))
    envs = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make(env_id) for _ in range(n_envs)])
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=list(range(n_envs)))
    start = 0.0
    for rollout in range(rollouts + 1):
        if rollout == 1:
            start = time.process_time()
        for _ in range(n_steps):
            with torch.inference_mode():
                logits = policy(torch.from_numpy(obs)).numpy()
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            actions = (probs.cumsum(axis=1) < rng.random((len(probs), 1))).sum(axis=1)
            obs, _, _, _, _ = envs.step(np.minimum(actions, probs.shape[1] - 1))
    return rollouts * n_steps * n_envs / (time.process_time() - start)


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    if args.side == "reference":
        rate = _run_reference(args.env_ids[0], args.envs[0], args.steps, args.rollouts)
    else:
        rate = _run_loop(args.env_ids[0], args.envs[0], args.steps, args.rollouts, args.profile)
    print(json.dumps({"steps_per_cpu_second": rate}))


def _measure(side: str, impl: str, env_id: str, n_envs: int, rollouts: int, args: argparse.Namespace) -> float:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(impl), OMP_NUM_THREADS="1")
    command = [sys.executable, os.path.abspath(__file__), "--child", "--side", side, "--env-ids", env_id,
               "--envs", str(n_envs), "--steps", str(args.steps), "--rollouts", str(rollouts)]
    if args.profile:
        command.append("--profile")
    result = subprocess.run(command, env=env, text=True, check=True, stdout=subprocess.PIPE,
                            stderr=None if args.profile else subprocess.PIPE)
    return float(json.loads(result.stdout.strip().splitlines()[-1])["steps_per_cpu_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32], help="envs per ActorGroup")
    parser.add_argument("--env-ids", nargs="+", default=["CartPole-v1", "Acrobot-v1"])
    parser.add_argument("--steps", type=int, default=128, help="steps per rollout")
    parser.add_argument("--rollouts", type=int, default=0, help="rollouts per measurement (0: ~40k env steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--impl", action="append", default=None,
                        help="a checkout root to measure the loop of (repeat for an A/B; default: .)")
    parser.add_argument("--no-reference", action="store_true", help="measure only the loop side(s)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of ActorGroup.run, one round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="loop", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    impls = args.impl or ["."]
    sides = [("loop", impl) for impl in impls] + ([] if args.no_reference or args.profile else [("reference", ".")])
    names = [f"loop[{impl}]" if len(impls) > 1 else "loop" for impl in impls] + ["reference"][:len(sides) - len(impls)]
    rounds = 1 if args.profile else args.rounds
    loops = names[:len(impls)]
    ratios = [(top, loops[0]) for top in loops[1:]]
    ratios += [(top, "reference") for top in loops] if "reference" in names else []
    print(f"| env | envs | {' | '.join(f'{n} steps/CPU-s' for n in names)} | "
          f"{' | '.join(f'{top} / {bottom}' for top, bottom in ratios)} |")
    print("|---|---:|" + "---:|" * (len(names) + len(ratios)))
    for env_id in args.env_ids:
        for n_envs in args.envs:
            rollouts = args.rollouts or max(2, 40_000 // (args.steps * n_envs))
            rates: dict[str, list[float]] = {name: [] for name in names}
            for round_index in range(rounds):
                order = list(range(len(sides)))
                order = order[round_index % len(order):] + order[:round_index % len(order)]
                for index in order:
                    rates[names[index]].append(_measure(*sides[index], env_id, n_envs, rollouts, args))
            medians = {name: statistics.median(rates[name]) for name in names}
            print(f"| {env_id} | {n_envs} | {' | '.join(f'{m:,.0f}' for m in medians.values())} | "
                  f"{' | '.join(f'{medians[top] / medians[bottom]:.2f}' for top, bottom in ratios)} |", flush=True)


if __name__ == "__main__":
    main()
