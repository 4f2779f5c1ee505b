"""Env steps per second with external workers only: one actor per job (the old default) against the actors
split over the registered workers (the default since issue 25), side by side in alternating rounds.

A private redis-server, ``--workers`` external ``rqrl worker`` processes, and ``RedisDistributedActors`` with
``n_local_workers=0`` collecting CartPole-v1 batches of all its actors for ``--seconds`` per round.

Run from the repository root::

    python benchmarks/actors_per_job.py --workers 2 --actors 16 --seconds 15 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

from rqrl import RedisDistributedActors
from rqrl.engine.server import EmbeddedRedis

REPO_ROOT = Path(__file__).resolve().parent.parent
SECRET = "benchmark-secret-benchmark-secret"


def make_env():
    import gymnasium

    return gymnasium.make("CartPole-v1")


def policy():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))


def steps_per_second(url: str, actors: int, per_job: int | None, seconds: float, round_index: int) -> float:
    """Env steps/s collect_outputs delivered over ``seconds``, after a first batch."""
    run = RedisDistributedActors(make_env, policy(), 128, actors, actors, 2.0, redis_url=url, n_local_workers=0,
                                 actors_per_job=per_job, secret=SECRET, run_name=f"bench-{per_job}-{round_index}")
    with run:
        run.broadcast_updated_policy(run.policy.state_dict())
        run.collect_outputs("cpu")
        steps, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            steps += run.collect_outputs("cpu").record.rewards.numel()
        groups = len(run.config.actor_groups)
    print(f"  round {round_index}: actors_per_job={per_job or 'auto'} ({groups} groups): "
          f"{steps / seconds:,.0f} steps/s", file=sys.stderr)
    return steps / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--actors", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "RQRL_SECRET": SECRET, "PYTHONPATH": path}
    with EmbeddedRedis() as server:
        workers = [subprocess.Popen([sys.executable, "-m", "rqrl", "worker", "--redis-url", server.url, "--name",
                                     f"bench-{index}", "--log-level", "WARNING"], env=env, cwd=REPO_ROOT)
                   for index in range(args.workers)]
        try:
            client = redis.Redis.from_url(server.url)
            while client.scard("rq:workers:rqrl") < args.workers:
                time.sleep(0.2)
            results: dict[str, list[float]] = {"1 (before)": [], "auto (now)": []}
            for round_index in range(args.rounds):
                order = [1, None] if round_index % 2 == 0 else [None, 1]
                for per_job in order:
                    rate = steps_per_second(server.url, args.actors, per_job, args.seconds, round_index)
                    results["1 (before)" if per_job == 1 else "auto (now)"].append(rate)
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.wait(30)
    before, now = (statistics.median(values) for values in results.values())
    print(f"\n{args.workers} external workers, {args.actors} CartPole actors, 128-step rollouts, "
          f"{args.rounds} alternating rounds of {args.seconds:g} s (medians)\n")
    print("| actors_per_job | env steps/s | per round |\n|---|--:|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {', '.join(f'{value:,.0f}' for value in values)} |")
    print(f"\nauto / 1 = {now / before:.2f}")


if __name__ == "__main__":
    main()
