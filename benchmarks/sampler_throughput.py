"""Env steps per second of ``RQSampler.obtain_samples`` next to the same episodes collected in plain processes.

Sides, for each number of worker processes:

* ``rqrl`` -- ``RQSampler`` with an embedded Redis and that many local ``rqrl worker`` processes;
  ``--workers`` logical workers, a tanh MLP ``obs-64-64-actions`` as the agent (its state dict is the
  ``agent_update`` of every call), seeded; steps/s = steps returned / wall time of the calls;
* ``plain`` -- the ceiling: the same number of plain processes (fork) with no Redis, each keeping its
  share of the logical workers warm (worker ``w`` on process ``w % processes``), given the same state dict
  over a pipe and running exactly the episodes the rqrl call returned (same seeds: the same episodes,
  which the script checks), sending them back pickled, as garage's MultiprocessingSampler does.

Run from the repository root (it prints a markdown table)::

    python benchmarks/sampler_throughput.py --processes 1 2 --workers 8 --num-samples 4000 --iterations 5
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import statistics
import time
from typing import Any


def _policy(obs_size: int, n_actions: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(obs_size, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, n_actions)).eval()


def _plain_process(connection: Any, env_id: str, factory: Any, workers: list[int], policy: Any) -> None:
    """A plain worker process: keeps its logical workers warm, runs the episodes it is asked for."""
    import gymnasium
    import torch

    torch.set_num_threads(1)
    logical = {}
    for w in workers:
        logical[w] = factory(w)
        logical[w].update_env(gymnasium.make(env_id))
        logical[w].update_agent(copy.deepcopy(policy))  # each logical worker its own copy, as on rqrl workers
    while True:
        message = connection.recv()
        if message is None:
            return
        state_dict, version, wanted = message
        episodes = []
        for w, ks in wanted.items():
            worker = logical[w]
            worker.update_agent(state_dict)
            for k in ks:
                worker.reseed(((version - 1) << 32) | k)  # the sampler job's rule: the same episodes
                episodes.append(worker.rollout())
        connection.send(episodes)


class PlainSampler:
    """The ceiling: plain processes and pipes, no Redis, no RQ."""

    def __init__(self, env_id: str, factory: Any, processes: int, policy: Any):
        context = multiprocessing.get_context("fork")
        self.pipes, self.processes = [], []
        self.placement = {w: w % processes for w in range(factory.n_workers)}
        for index in range(processes):
            parent, child = context.Pipe()
            process = context.Process(target=_plain_process, daemon=True, args=(
                child, env_id, factory, [w for w, p in self.placement.items() if p == index], policy))
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def run(self, version: int, state_dict: Any, chosen: list[tuple[int, int]]) -> list[Any]:
        wanted: list[dict[int, list[int]]] = [{} for _ in self.pipes]
        for w, k in chosen:
            wanted[self.placement[w]].setdefault(w, []).append(k)
        for pipe, share in zip(self.pipes, wanted, strict=True):
            pipe.send((state_dict, version, share))
        return [episode for pipe in self.pipes for episode in pipe.recv()]

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(5)


def measure(env_id: str, processes: int, workers: int, num_samples: int, iterations: int,
            max_episode_length: int) -> dict[str, float]:
    import gymnasium
    import torch

    from rqrl import RQSampler, WorkerFactory

    torch.set_num_threads(1)
    env = gymnasium.make(env_id)
    policy = _policy(int(env.observation_space.shape[0]), int(env.action_space.n))
    factory = WorkerFactory(max_episode_length=max_episode_length, n_workers=workers, seed=0)
    rqrl_seconds, rqrl_steps, calls = 0.0, 0, []
    with RQSampler(factory, policy, env, n_local_workers=processes, start_method="fork", progress=False) as sampler:
        sampler.obtain_samples(0, num_samples, policy.state_dict())  # warm-up: workers start, envs are built
        for iteration in range(iterations):
            started = time.perf_counter()
            batch = sampler.obtain_samples(iteration, num_samples, policy.state_dict())
            rqrl_seconds += time.perf_counter() - started
            rqrl_steps += int(batch.lengths.sum())
            calls.append(batch)
        dropped = sampler.dropped_episodes
    plain = PlainSampler(env_id, factory, processes, policy)
    try:
        plain.run(1, policy.state_dict(), [(w, 0) for w in range(workers)])  # warm-up
        plain_seconds, plain_steps = 0.0, 0
        for iteration, batch in enumerate(calls):
            # the rqrl call's episodes: version iteration + 2 (after the warm-up), the round-robin prefix
            chosen = [(position % workers, position // workers) for position in range(len(batch.lengths))]
            started = time.perf_counter()
            episodes = plain.run(iteration + 2, policy.state_dict(), chosen)
            plain_seconds += time.perf_counter() - started
            plain_steps += sum(int(e.lengths.sum()) for e in episodes)
    finally:
        plain.close()
    if plain_steps != rqrl_steps:
        raise AssertionError(f"the plain side ran {plain_steps} steps, rqrl returned {rqrl_steps}: not the same "
                             f"episodes")
    return {"rqrl": rqrl_steps / rqrl_seconds, "plain": plain_steps / plain_seconds,
            "dropped": dropped / (iterations + 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, default=8, help="logical workers (n_workers)")
    parser.add_argument("--num-samples", type=int, default=4000)
    parser.add_argument("--iterations", type=int, default=5, help="timed obtain_samples calls per round")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per configuration (the table: medians)")
    parser.add_argument("--max-episode-length", type=int, default=500)
    args = parser.parse_args()
    print(f"{args.env}, {args.workers} logical workers, obtain_samples({args.num_samples}) x {args.iterations}, "
          f"{args.rounds} round(s)\n")
    print("| processes | logical workers | rqrl steps/s | plain steps/s | rqrl / plain | dropped episodes per call |")
    print("|---|---|---|---|---|---|")
    for processes in args.processes:
        results = [measure(args.env, processes, args.workers, args.num_samples, args.iterations,
                           args.max_episode_length) for _ in range(args.rounds)]
        rqrl = statistics.median(r["rqrl"] for r in results)
        plain = statistics.median(r["plain"] for r in results)
        dropped = statistics.median(r["dropped"] for r in results)
        print(f"| {processes} | {args.workers} | {rqrl:,.0f} | {plain:,.0f} | {rqrl / plain:.2f} | {dropped:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
