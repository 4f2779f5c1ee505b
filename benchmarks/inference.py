"""Central inference (rqrl.seed) measured two ways, in one run.

1. *Round trips*: one inference server process on a private redis-server; T client threads in this
   process, sharing one ``ActorInference`` as an actor process's threads do, each ask for one CartPole-sized
   observation at a time and wait for its answer. Reports latency p50/p99, inferences/s and the mean
   forward pass the server ran, against ``inference_batchsize`` and T.
2. *Env steps/s*: the SEED setup (``Trainer`` with one actor process of E threads, one inference server,
   epsilon 0 so every step asks the server, no training) against rqrl's per-actor policy
   (``SubprocDistributedActors``, one local worker stepping the same E envs as one batch with its own
   copy of the model), for a small and a large MLP on CartPole-v1. Central inference pays a Redis round
   trip per step and per env; it can only win where the forward pass dominates (a large model, a GPU
   server shared by many CPU actors).

Run from the repository root::

    python benchmarks/inference.py --seconds 5 --batch-sizes 1 4 16 --threads 1 4 16 --envs 8 --hidden 64 1024
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import multiprocessing
import os
import platform
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
import torch

from rqrl.engine.keys import RunKeys
from rqrl.engine.local_workers import multiprocessing_context
from rqrl.engine.server import EmbeddedRedis
from rqrl.engine.weights import WeightStore
from rqrl.maze.actors import SubprocDistributedActors
from rqrl.seed import Config, Trainer
from rqrl.seed.agent import Agent, AgentConfig
from rqrl.seed.inference import ActorInference, InferenceClient, run_server_process
from rqrl.seed.store import SeedRecord, SeedRun

log = logging.getLogger("inference")
SECRET = "benchmark-secret"


def make_env() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


def mlp(hidden: int) -> torch.nn.Module:
    """A 4-hidden-hidden-2 ReLU MLP: Q-values for the SEED side, logits for the per-actor side."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 2))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@contextlib.contextmanager
def served_run(url: str, threads: int, settings: dict[str, Any],
               model_factory: Callable[[], torch.nn.Module]) -> Iterator[SeedRun]:
    """A SEED run on ``url`` whose one inference server process holds ``model_factory``'s model (its weights
    published), for ``threads`` client threads; stopped and deleted at the end."""
    import redis

    connection = redis.Redis.from_url(url)
    run = SeedRun(connection, RunKeys(f"bench-{uuid.uuid4().hex[:8]}"), SECRET, uuid.uuid4().hex)
    run.record(SeedRecord(None, 1, threads))  # the server process joins the run through its record
    run.write({"inference_device": "cpu", "broadcast_period": 60.0, "inference_threads": 1, **settings},
              model_factory, make_env)
    WeightStore(connection, run.keys, run.weights_key).publish(model_factory().state_dict())
    server = multiprocessing_context(None).Process(target=run_server_process,
                                                   args=(url, run.keys.run_name, SECRET, 0, os.getpid()))
    server.start()
    try:
        yield run
    finally:
        run.stop()
        server.join(10)
        if server.is_alive():
            server.kill()
        run.delete()
        connection.close()


def round_trips(url: str, batch_size: int, threads: int, seconds: float, hidden: int, delay: float,
                device: str = "cpu") -> dict[str, float]:
    """Latencies and throughput of ``threads`` clients against one server process."""
    settings = {"inference_batchsize": batch_size, "inference_delay": delay, "inference_device": device}
    with served_run(url, threads, settings, functools.partial(mlp, hidden)) as run:
        return client_latencies(run, batch_size, threads, seconds, delay)


def client_latencies(run: SeedRun, batch_size: int, threads: int, seconds: float, delay: float) -> dict[str, float]:
    """Latencies and throughput of ``threads`` client threads sharing one ActorInference on ``run``."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = threading.Event()
    obs = np.zeros(4, np.float32)

    inference = ActorInference(InferenceClient(run, "bench", timeout=30.0), batch_size, delay)

    def client(index: int) -> None:
        with inference.member():
            inference.evaluate(obs)  # the server is up and holds weights
            while not stop.is_set():
                started = time.perf_counter()
                inference.evaluate(obs)
                latencies[index].append(time.perf_counter() - started)

    workers = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(threads)]
    for worker in workers:
        worker.start()
    while not all(latencies[index] for index in range(threads)):  # warm: every client got an answer
        time.sleep(0.01)
    for values in latencies:
        values.clear()
    counters_before = run.counters()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    elapsed = time.perf_counter() - started
    counters = run.counters()
    for worker in workers:
        worker.join(30)
    flat = [value for values in latencies for value in values]
    batches = sum(counters.get(key, 0) - counters_before.get(key, 0) for key in ("batches_full", "batches_delay"))
    inferences = counters.get("inferences", 0) - counters_before.get("inferences", 0)
    requests = counters.get("requests", 0) - counters_before.get("requests", 0)
    return {"p50": percentile(flat, 50) * 1e3, "p99": percentile(flat, 99) * 1e3,
            "rate": len(flat) / elapsed, "batch": inferences / batches if batches else float("nan"),
            "request": inferences / requests if requests else float("nan")}


def seed_steps(envs: int, hidden: int, seconds: float, device: str = "cpu") -> tuple[float, float]:
    """Env steps/s of the SEED setup with ``envs`` actor threads and no training, and its mean observations per
    request (how many of the actor process's threads asked together)."""
    agent = Agent(AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False,
                              replay_capacity=10_000_000), functools.partial(mlp, hidden))
    config = Config(actor_threads=envs, inference_batchsize=envs, inference_delay=0.002, epsilon=0.0,
                    minimum_buffer_size=10_000_000, broadcast_period=60.0,
                    inference_device=torch.device(device))
    rate, counters = trainer_steps(agent, config, make_env, seconds)
    per_request = counters.get("inferences", 0) / counters["requests"] if counters.get("requests") else float("nan")
    return rate, per_request


def trainer_steps(agent: Agent, config: Config, env_factory: Callable[[], gymnasium.Env],
                  seconds: float) -> tuple[float, dict[str, int]]:
    """Env steps/s of a SEED ``Trainer`` over ``seconds`` from its first transition (NaN if it never got two
    readings), and its run's counters."""
    marks: list[tuple[float, int]] = []

    def progress(trainer: Trainer) -> None:
        received = trainer.stats.transitions_received
        if received and not marks:
            marks.append((time.perf_counter(), received))
        if marks and time.perf_counter() - marks[0][0] >= seconds:
            marks.append((time.perf_counter(), received))
            trainer.stop()

    trainer = Trainer(agent, config, env_factory, on_progress=progress, progress_seconds=0.1)
    trainer.start(seconds + 120)
    if len(marks) < 2:
        return float("nan"), trainer.stats.counters
    (start, first), (end, last) = marks[0], marks[-1]
    return (last - first) / (end - start), trainer.stats.counters


def per_actor_steps(envs: int, hidden: int, seconds: float) -> float:
    """Env steps/s of SubprocDistributedActors: one worker stepping ``envs`` envs with its own model copy."""
    policy = mlp(hidden).eval()
    actors = SubprocDistributedActors(make_env, policy, 32, envs, envs, 2.0, "forkserver", list(range(envs)),
                                      [1000 + index for index in range(envs)], n_workers=1, actors_per_job=envs)
    with actors:
        actors.broadcast_updated_policy(policy.state_dict())
        actors.collect_outputs("cpu")  # start-up
        steps, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            steps += int(actors.collect_outputs("cpu").record.rewards.numel())
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="Measured window of each configuration.")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--delay", type=float, default=0.002, help="inference_delay of the round-trip table.")
    parser.add_argument("--envs", type=int, default=8, help="Envs of the steps/s comparison.")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 1024], help="MLP widths to compare.")
    parser.add_argument("--device", default="cpu", help="inference_device of the servers (cpu, cuda); the per-actor "
                                                          "policy always runs on the workers' CPU.")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at start")

    print(f"\n### Round trips (one server on {arguments.device}, MLP 4-64-64-2, inference_delay {arguments.delay} s)\n")
    print("| inference_batchsize | actor threads | p50 ms | p99 ms | inferences/s | mean forward pass | mean request |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    with EmbeddedRedis() as redis_server:
        for batch_size in arguments.batch_sizes:
            for threads in arguments.threads:
                row = round_trips(redis_server.url, batch_size, threads, arguments.seconds, 64, arguments.delay,
                                  arguments.device)
                print(f"| {batch_size} | {threads} | {row['p50']:.2f} | {row['p99']:.2f} | {row['rate']:,.0f} | "
                      f"{row['batch']:.1f} | {row['request']:.1f} |", flush=True)

    print(f"\n### Env steps/s, CartPole-v1, {arguments.envs} envs: SEED (server on {arguments.device}) against a "
          "per-actor policy\n")
    print("| MLP hidden | SEED steps/s | SEED observations per request | per-actor steps/s | SEED / per-actor |")
    print("|--:|--:|--:|--:|--:|")
    for hidden in arguments.hidden:
        seed, per_request = seed_steps(arguments.envs, hidden, arguments.seconds, arguments.device)
        local = per_actor_steps(arguments.envs, hidden, arguments.seconds)
        print(f"| {hidden} | {seed:,.0f} | {per_request:.1f} | {local:,.0f} | {seed / local:.2f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
