"""What broadcasting policy weights costs: the learner's publish, each worker's fetch, and Redis's CPU per fetch.

A learner publishes a new version of the weights every ``--every-ms`` (as IMPALA does after each update) through
rqrl's WeightStore on a private Redis, while ``--readers`` processes fetch each new version as workers do before a
rollout, and load it into their copy of the model. The models: IMPALA's Nature CNN for Atari (6.7 MB of float32)
and its CartPole MLP (18 KB). Redis's CPU is read from its own INFO counters, so the figure per fetch holds on any
machine load; the milliseconds are wall-clock times on this machine.

Run from the repository root::

    python benchmarks/weights_broadcast.py --seconds 10 --readers 4
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from dataclasses import dataclass

import redis
import torch

from benchmarks.actors_throughput import stop_processes
from rqrl.algorithms.impala import ActorCritic
from rqrl.engine.codec import weights_key
from rqrl.engine.connection import connect
from rqrl.engine.keys import RunKeys
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.server import EmbeddedRedis
from rqrl.engine.weights import WeightStore

MODELS = {"nature-cnn": ((4, 84, 84), 6), "mlp": (4, 2)}
"""Model name -> IMPALA ActorCritic's observation shape and actions: Pong's and CartPole's."""
RUN = "weights-broadcast"
KEY = weights_key("benchmark-secret", RUN)


@dataclass(frozen=True)
class Result:
    model: str
    megabytes: float
    publishes: int
    publish_ms: float
    fetches: int
    fetch_ms: float
    redis_ms_per_fetch: float
    redis_cores: float


def make_model(name: str) -> ActorCritic:
    obs_shape, n_actions = MODELS[name]
    return ActorCritic(obs_shape, n_actions)


def reader(url: str, name: str, stop, fetches, seconds) -> None:  # noqa: ANN001 - mp values
    """A worker's side: fetch every new version, load it into the model; the count and time go to shared values."""
    torch.set_num_threads(1)
    model = make_model(name)
    store = WeightStore(connect(url), RunKeys(RUN), KEY)
    held = None
    while not stop.is_set():
        started = time.perf_counter()
        fetched = store.fetch_if_newer(held)
        if fetched is None:
            time.sleep(0.01)  # a worker checks once a rollout; this is a rollout of about 10 ms
            continue
        held, state_dict = fetched
        model.load_state_dict(state_dict)
        with fetches.get_lock():
            fetches.value += 1
            seconds.value += time.perf_counter() - started


def redis_cpu_seconds(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(name: str, args: argparse.Namespace) -> Result:
    model = make_model(name)
    state_dict = model.state_dict()
    megabytes = sum(tensor.numel() * tensor.element_size() for tensor in state_dict.values()) / 1e6
    context = multiprocessing.get_context("fork")
    with EmbeddedRedis() as server:
        client = connect(server.url)
        store = WeightStore(client, RunKeys(RUN), KEY)
        store.publish(state_dict)
        stop, fetches, seconds = context.Event(), context.Value("q", 0), context.Value("d", 0.0)
        readers = [context.Process(target=reader, args=(server.url, name, stop, fetches, seconds), daemon=True)
                   for _ in range(args.readers)]
        for process in readers:
            process.start()
        try:
            time.sleep(1.0)  # the readers' start and first fetch
            fetches_before, seconds_before, cpu_before = fetches.value, seconds.value, redis_cpu_seconds(client)
            publish_ms: list[float] = []
            started = time.perf_counter()
            while time.perf_counter() - started < args.seconds:
                published = time.perf_counter()
                store.publish(state_dict)
                publish_ms.append(1000 * (time.perf_counter() - published))
                time.sleep(max(0.0, args.every_ms / 1000 - (time.perf_counter() - published)))
            elapsed = time.perf_counter() - started
            redis_seconds = redis_cpu_seconds(client) - cpu_before
            fetched, fetch_seconds = fetches.value - fetches_before, seconds.value - seconds_before
        finally:
            stop_processes(readers, stop)
    return Result(name, megabytes, len(publish_ms), statistics.median(publish_ms), fetched,
                  1000 * fetch_seconds / max(fetched, 1), 1000 * redis_seconds / max(fetched, 1),
                  redis_seconds / elapsed)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["nature-cnn", "mlp"])
    parser.add_argument("--readers", type=int, default=4, help="worker processes fetching each version")
    parser.add_argument("--every-ms", type=float, default=100.0, help="milliseconds between two publishes")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per model")
    args = parser.parse_args(argv)
    if args.readers < 1 or args.seconds <= 0 or args.every_ms < 0:
        parser.error("expected --readers >= 1, --seconds > 0 and --every-ms >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()  # as rqrl's learners and workers do (the readers are forked: they keep it too)
    results = [measure(name, args) for name in args.models]
    print(f"\n{args.readers} readers, a publish every {args.every_ms:g} ms, {args.seconds:g} s per model\n")
    print("| model | MB | publishes | publish ms (median) | fetches | fetch + load ms (mean) | Redis CPU ms per fetch "
          "| Redis cores |")
    print("|:--|--:|--:|--:|--:|--:|--:|--:|")
    for result in results:
        print(f"| {result.model} | {result.megabytes:.2f} | {result.publishes} | {result.publish_ms:.1f} | "
              f"{result.fetches} | {result.fetch_ms:.1f} | {result.redis_ms_per_fetch:.2f} | "
              f"{result.redis_cores:.2f} |")


if __name__ == "__main__":
    main()
