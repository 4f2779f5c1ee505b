"""Where a sampler worker process spends its CPU time: cProfile (CPU clock) of one local ``rqrl worker``.

Runs ``RQSampler.obtain_samples`` on CartPole-v1 with one local worker process (fork) whose ``run_worker``
is wrapped in ``cProfile.Profile(time.process_time)``, so the figures are CPU seconds of that process, not
wall time on a loaded machine. Prints the worker's top functions (cumulative and own time) and the worker's
CPU microseconds per env step. Run from the repository root::

    python benchmarks/profile_sampler.py --workers 8 --num-samples 4000 --iterations 5
    python benchmarks/profile_sampler.py --cpu-only   # no profiler overhead: CPU us per step only
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import shutil
import tempfile
import time
from typing import Any


def _profiled(target: Any, path: str, **kwargs: Any) -> Any:
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        return target(**kwargs)
    finally:
        profile.disable()
        profile.dump_stats(path)


def _timed(target: Any, path: str, **kwargs: Any) -> Any:
    started = time.process_time()
    try:
        return target(**kwargs)
    finally:
        with open(path, "w") as file:
            file.write(str(time.process_time() - started))


def main() -> None:
    folder = tempfile.mkdtemp(prefix="rqrl-profile-")
    try:
        report(os.path.join(folder, "worker.prof"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(path: str) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8, help="logical workers (n_workers)")
    parser.add_argument("--num-samples", type=int, default=4000)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--workers-per-job", type=int, default=None)
    parser.add_argument("--cpu-only", action="store_true", help="no profiler: only the worker's CPU time per step")
    args = parser.parse_args()

    import gymnasium
    import torch

    import rqrl.engine.local_workers
    from rqrl import RQSampler, WorkerFactory

    torch.set_num_threads(1)
    wrapper = _timed if args.cpu_only else _profiled
    rqrl.engine.local_workers.run_worker = functools.partial(wrapper, rqrl.engine.local_workers.run_worker, path)  # type: ignore[assignment]
    env = gymnasium.make("CartPole-v1")
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                 torch.nn.Linear(64, 2)).eval()
    factory = WorkerFactory(max_episode_length=500, n_workers=args.workers, seed=0)
    steps = 0
    with RQSampler(factory, policy, env, n_local_workers=1, start_method="fork", progress=False,
                   workers_per_job=args.workers_per_job) as sampler:
        for iteration in range(args.iterations):
            steps += int(sampler.obtain_samples(iteration, args.num_samples, policy.state_dict()).lengths.sum())
        dropped = sampler.dropped_episodes
    if args.cpu_only:
        with open(path) as file:
            cpu = float(file.read())
        print(f"{steps} steps returned, {dropped} episodes dropped; worker CPU {cpu:.2f} s (includes dropped "
              f"episodes and idle polling): {1e6 * cpu / steps:.1f} us per returned step")
        return
    stats = pstats.Stats(path)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"{steps} steps returned, {dropped} episodes dropped; worker CPU {total:.2f} s "
          f"(includes dropped episodes and idle polling): {1e6 * total / steps:.1f} us per returned step\n")
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(path, stream=out).sort_stats(key).print_stats(args.top)
        print(out.getvalue().split("\n", 6)[-1] if key == "cumulative" else out.getvalue())


if __name__ == "__main__":
    main()
