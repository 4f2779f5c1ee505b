"""How long each family's learner takes to stop when its Redis is gone, and whether it raises there.

For each family, a private redis-server (``EmbeddedRedis``, given to the learner as an external Redis) and
one local worker (or SEED's actor and server processes) run a few rollouts of CartPole-v1; then the
redis-server is SIGKILLed (a crash, a lost host) and the learner is stopped:

* ``maze``: ``RedisDistributedActors.stop()`` after a collect (the next batch's pop in flight);
* ``garage``: ``MultiprocessingSampler.shutdown_worker()`` after an ``obtain_samples``;
* ``seed``: a SEED ``Trainer`` interrupted (KeyboardInterrupt in its thread, as Ctrl-C) 1 s after the kill;
* ``ppo``: ``rqrl.algorithms.ppo.train`` (the Python API, sampling one call ahead) interrupted 1 s after the kill.

Before 2026-11-27 each of these rode out the 60 s outage window per command and
then raised; now the tear-down rides out 3 s and warns what it left in Redis. The table gives the seconds
from the stop (or the interrupt) to its return and what reached the caller.

Run from the repository root::

    python benchmarks/stop_without_redis.py --families maze garage seed
"""

from __future__ import annotations

import _thread
import argparse
import logging
import os
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium
import torch

from rqrl.engine.server import EmbeddedRedis

SECRET = secrets.token_hex(32)


def make_cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def outcome(call: Callable[[], None]) -> str:
    """What ``call`` let reach its caller: nothing, or the exception's type."""
    try:
        call()
    except BaseException as error:  # noqa: BLE001 - the table reports it, whatever it is
        return type(error).__name__
    return "returned"


def maze(server: EmbeddedRedis) -> tuple[float, str]:
    from rqrl import RedisDistributedActors

    actors = RedisDistributedActors(make_cartpole, mlp(), 16, 2, 2, redis_url=server.url, n_local_workers=1,
                                    secret=SECRET)
    actors.start()
    actors.broadcast_updated_policy(actors.policy.state_dict())
    actors.collect_outputs("cpu")
    kill(server)
    started = time.monotonic()
    result = outcome(lambda: actors.stop(timeout=10))
    return time.monotonic() - started, result


def garage(server: EmbeddedRedis) -> tuple[float, str]:
    from rqrl.algorithms.impala import ActorCritic
    from rqrl.algorithms.ppo import PpoConfig, make_sampler

    model = ActorCritic(4, 2, 16)
    config = PpoConfig(redis_url=server.url, workers=1, n_workers=2, progress=False)
    sampler = make_sampler(config, model, secret=SECRET)
    sampler.start_worker()
    sampler.obtain_samples(0, 200, model.state_dict())
    kill(server)
    started = time.monotonic()
    result = outcome(sampler.shutdown_worker)
    return time.monotonic() - started, result


def seed(server: EmbeddedRedis) -> tuple[float, str]:
    from rqrl.seed import Config, Trainer
    from rqrl.seed.agent import Agent, AgentConfig

    agent = Agent(AgentConfig(state_shape=(4,), action_space_size=2, use_distributional=False, replay_capacity=5000,
                              batch_size=16, seed=0), mlp)
    trainer = Trainer(agent, Config(redis_url=server.url, secret=SECRET, actor_threads=2, minimum_buffer_size=50,
                                    inference_batchsize=2, inference_delay=0.01, request_timeout=1.0), make_cartpole)
    marks: dict[str, float] = {}

    def pull_the_plug() -> None:
        deadline = time.monotonic() + 60
        while trainer.stats.train_steps < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        kill(server)
        time.sleep(1.0)
        marks["interrupted"] = time.monotonic()
        _thread.interrupt_main()

    threading.Thread(target=pull_the_plug, daemon=True).start()
    result = outcome(lambda: trainer.start(120))
    return time.monotonic() - marks.get("interrupted", time.monotonic()), result


def ppo(server: EmbeddedRedis) -> tuple[float, str]:
    from rqrl.algorithms.ppo import PpoConfig, train

    marks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        config = PpoConfig(redis_url=server.url, workers=1, n_workers=2, num_samples=400, epochs=1, progress=False,
                           total_env_steps=10**9, run_dir=run_dir, run_name="stop-without-redis")

        def pull_the_plug() -> None:
            metrics, deadline = Path(run_dir) / "stop-without-redis" / "metrics.csv", time.monotonic() + 60
            while (not metrics.exists() or metrics.stat().st_size < 200) and time.monotonic() < deadline:
                time.sleep(0.1)  # a few iterations in, the next call in flight on its own thread
            kill(server)
            time.sleep(1.0)
            marks["interrupted"] = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C (interrupt_main would not wake a main thread that waits)

        threading.Thread(target=pull_the_plug, daemon=True).start()
        result = outcome(lambda: train(config, secret=SECRET))
    return time.monotonic() - marks.get("interrupted", time.monotonic()), result


def kill(server: EmbeddedRedis) -> None:
    """SIGKILL the redis-server: no shutdown, nothing kept."""
    assert server.process is not None
    server.process.kill()
    server.process.wait()


FAMILIES = {"maze": (maze, "RedisDistributedActors.stop()"), "garage": (garage, "shutdown_worker()"),
            "seed": (seed, "Trainer interrupted"), "ppo": (ppo, "train_ppo interrupted")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=["maze", "garage", "seed", "ppo"])
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the warnings of the tear-down are expected here
    rows = []
    for family in arguments.families:
        measure, what = FAMILIES[family]
        server = EmbeddedRedis().start()
        try:
            print(f"{family}: running, then killing its Redis ...", flush=True)
            seconds, result = measure(server)
        finally:
            server.stop()
        rows.append(f"| {family} | {what} | {seconds:.1f} | {result} |")
    print("| family | stop | seconds to return | what reached the caller |")
    print("|:--|:--|--:|:--|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
