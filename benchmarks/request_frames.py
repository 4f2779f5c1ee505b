"""SEED's inference requests of frame stacks: whole stacks (what clients sent before 2026-11-28) against the
frames the server lacks (``rqrl.seed.request_frames``), side by side in one run.

The observations are T envs' 84x84 4-frame stacks stepped together, one request of all T a step, as an actor
process whose T threads all ask at once sends them: real Pong (``make_atari_env``, random actions; needs
``pip install "rqrl[atari]"``) and random frames (which do not compress, so only the unique frames count).

1. *Encoding*: ``--clients`` actor processes (each its own T envs) make a request a step, sealed both ways
   (signed, zstd where it pays, as clients do); bytes per observation, the clients' CPU per observation (find the
   frames, seal), and the server's (unseal each step's requests of every client and write their observations into
   one batch, as a server's batch holds several actor processes' requests), the least of ``--repeats`` runs, with a
   check that the server rebuilt every observation bit for bit.
2. *Round trips*: one inference server process on a private redis-server, T client threads sharing one
   ``ActorInference`` and asking about the stacks in turn, for ``--seconds``, whole and frames alternating for
   ``--rounds``. The server's model is a mean over pixels (what is measured is the transport alone) and the
   Nature DQN's CNN (SEED's Atari setup), on ``--device``.
3. *SEED on Pong*: ``rqrl.seed.Trainer`` with one actor process of T threads stepping Pong, one inference server
   with the Nature DQN's network on ``--device``, epsilon 0 (every step asks the server) and no training: env steps/s
   with ``request_frames`` on and off, alternating for ``--rounds``.

Run from the repository root::

    PYTHONPATH=$PWD python benchmarks/request_frames.py --threads 16 --steps 200 --seconds 5 --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import threading
import time

import numpy as np
import torch

from benchmarks.inference import served_run, trainer_steps
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.server import EmbeddedRedis
from rqrl.seed.inference import ActorInference, InferenceClient, ObservationBatch
from rqrl.seed.request_frames import HeldFrames, SentFrames
from rqrl.seed.store import seal, unseal

KEY = b"benchmark key of 32 bytes, fixed"
DEPTH, SIDE = 4, 84


class MeanPixel(torch.nn.Module):
    """Two Q-values from an image's mean pixel: a forward pass that costs next to nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.flatten(1).mean(1, keepdim=True) * self.weight


def nature_q() -> torch.nn.Module:
    """Q-values of Pong's 6 actions from the Nature DQN's CNN: what ``rqrl train dqn`` serves on Atari."""
    from rqrl.algorithms.cnn import FEATURES, NatureCNN

    torch.manual_seed(0)
    return torch.nn.Sequential(NatureCNN((DEPTH, SIDE, SIDE)), torch.nn.Linear(FEATURES, 6))


MODELS = {"mean-pixel": MeanPixel, "nature-cnn": nature_q}


def pong_stacks(envs: int, steps: int, seed: int) -> np.ndarray:
    """``[steps, envs, 4, 84, 84]`` observations of ``envs`` Pong envs stepping together with random actions."""
    from rqrl.algorithms.atari import make_atari_env

    games = [make_atari_env("ALE/Pong-v5") for _ in range(envs)]
    observations = [game.reset(seed=seed + index)[0] for index, game in enumerate(games)]
    random = np.random.default_rng(seed)
    steps_seen = []
    for _ in range(steps):
        steps_seen.append(np.stack(observations))
        for index, game in enumerate(games):
            obs, _, terminated, truncated, _ = game.step(int(random.integers(game.action_space.n)))
            observations[index] = game.reset()[0] if terminated or truncated else obs
    return np.stack(steps_seen)


def random_stacks(envs: int, steps: int, seed: int) -> np.ndarray:
    """``[steps, envs, 4, 84, 84]``: each env's stack shifted by one new frame of uniform noise a step."""
    frames = np.random.default_rng(seed).integers(0, 256, (envs, steps + DEPTH - 1, SIDE, SIDE), np.uint8)
    return np.stack([frames[:, t:t + DEPTH] for t in range(steps)])


def client_requests(stacks: np.ndarray, client_number: int, frames: bool) -> tuple[list[bytes], float]:
    """(sealed requests, client seconds) of one client's request a step: whole stacks, or the frames the server
    lacks (each answered before the next is made)."""
    client, blobs, started = SentFrames(), [], time.perf_counter()
    for number, step in enumerate(stacks):
        arrays = client.request(step, number)[0] if frames else {"obs": step}
        blobs.append(seal(arrays, {"reply": "reply", "id": str(number), "client": f"c{client_number}"}, KEY))
        client.answered("server", number)
    return blobs, time.perf_counter() - started


def server_batches(requests: list[list[bytes]], stacks: list[np.ndarray]) -> float:
    """Server seconds to unseal each step's requests of every client and write their observations into one batch,
    as an inference server does; checks each client's observations."""
    held, batch, seconds = HeldFrames(), ObservationBatch(), 0.0
    for number in range(len(requests[0])):
        started = time.perf_counter()
        batch.clear()
        for blobs in requests:
            arrays, metadata = unseal(blobs[number], KEY)
            batch.add(held.rebuild(metadata["client"], number, arrays) if "frames" in arrays else arrays["obs"])
        seconds += time.perf_counter() - started
        rows = batch.view().reshape(len(stacks), *stacks[0].shape[1:])
        assert all((rows[client] == client_stacks[number]).all() for client, client_stacks in enumerate(stacks))
    return seconds


def encoding_rows(stacks: list[np.ndarray], repeats: int) -> list[tuple[str, float, float, float]]:
    """(encoding, bytes per observation, client us per observation, server us per observation) of one request a
    step from each client (``stacks``: one ``[steps, envs, ...]`` per client), the least time of ``repeats``."""
    observations = sum(client_stacks.shape[0] * client_stacks.shape[1] for client_stacks in stacks)
    rows = []
    for name, frames in (("whole stacks (before)", False), ("frames the server lacks (now)", True)):
        client_runs, server_runs = [], []
        for _ in range(repeats):
            made = [client_requests(client_stacks, client, frames) for client, client_stacks in enumerate(stacks)]
            client_runs.append(sum(seconds for _, seconds in made))
            server_runs.append(server_batches([blobs for blobs, _ in made], stacks))
        size = sum(len(blob) for blobs, _ in made for blob in blobs)
        rows.append((name, size / observations, min(client_runs) * 1e6 / observations,
                     min(server_runs) * 1e6 / observations))
    return rows


def round_trip_rate(url: str, stacks: np.ndarray, seconds: float, whole: bool, model: str,
                    device: str = "cpu") -> tuple[float, float]:
    """(inferences/s, request bytes per inference) of one client thread per env against one server process on
    ``device``."""
    threads = stacks.shape[1]
    settings = {"inference_batchsize": threads, "inference_delay": 0.002, "inference_device": device}
    with served_run(url, threads, settings, MODELS[model]) as run:
        client = InferenceClient(run, "bench", timeout=30.0, send_frames=not whole)  # whole: as before 2026-11-28
        return client_rate(ActorInference(client, threads, 0.002), stacks, seconds)


def client_rate(inference: ActorInference, stacks: np.ndarray, seconds: float) -> tuple[float, float]:
    """(inferences/s, request bytes per inference) of one thread per env of ``stacks`` asking through
    ``inference`` in turn about its env's stacks."""
    threads, client = stacks.shape[1], inference.client
    counts = [0] * threads
    stop, measuring = threading.Event(), threading.Event()

    def ask(index: int) -> None:
        with inference.member():
            for step in range(10**9):
                if stop.is_set():
                    return
                inference.evaluate(stacks[step % len(stacks), index])
                counts[index] += measuring.is_set()

    workers = [threading.Thread(target=ask, args=(index,), daemon=True) for index in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # the server is up, holds weights and the clients' frames
    sent_before, started = client.bytes_sent, time.perf_counter()
    measuring.set()
    time.sleep(seconds)
    measuring.clear()
    elapsed, sent = time.perf_counter() - started, client.bytes_sent - sent_before
    stop.set()
    for worker in workers:
        worker.join(30)
    return sum(counts) / elapsed, sent / max(sum(counts), 1)


def seed_pong_steps(threads: int, seconds: float, request_frames: bool, device: str = "cpu") -> float:
    """Env steps/s of SEED on Pong: one actor process of ``threads`` threads, every step asking the server, no
    training (the replay never reaches its minimum)."""
    import functools

    from rqrl.algorithms.atari import make_atari_env
    from rqrl.algorithms.dqn import QNetwork
    from rqrl.seed import Config
    from rqrl.seed.agent import Agent, AgentConfig

    capacity = 100_000
    agent = Agent(AgentConfig(state_shape=(DEPTH, SIDE, SIDE), state_dtype="uint8", action_space_size=6,
                              replay_capacity=capacity, use_distributional=False),
                  functools.partial(QNetwork, (DEPTH, SIDE, SIDE), 6, 512, None, False))
    config = Config(actor_threads=threads, inference_batchsize=threads, inference_delay=0.002, epsilon=0.0,
                    minimum_buffer_size=capacity, broadcast_period=60.0, request_frames=request_frames,
                    inference_device=device)
    return trainer_steps(agent, config, functools.partial(make_atari_env, "ALE/Pong-v5"), seconds)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=16, help="Envs (actor threads) asking together.")
    parser.add_argument("--steps", type=int, default=200, help="Steps of observations per source.")
    parser.add_argument("--seconds", type=float, default=5.0, help="Measured window of each round-trip run.")
    parser.add_argument("--rounds", type=int, default=2, help="Round-trip runs of each kind, alternating.")
    parser.add_argument("--repeats", type=int, default=5, help="Encoding runs of each kind (the least time counts).")
    parser.add_argument("--clients", type=int, default=8,
                        help="Actor processes whose requests a server batch holds, in the encoding table.")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS),
                        help="The server's model in the round trips: a mean over pixels (the transport alone), the "
                             "Nature DQN's CNN (SEED's Atari setup).")
    parser.add_argument("--sources", nargs="+", default=["pong", "random"], choices=["pong", "random"])
    parser.add_argument("--device", default="cpu", help="The inference server's device (cpu, cuda).")
    parser.add_argument("--seed-seconds", type=float, default=10.0,
                        help="Measured window of each SEED run on Pong (0: skip that table).")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    keep_freed_memory()  # as actor processes (on rqrl workers) and servers do: no page faults per request
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, {arguments.threads} envs asking together, "
          f"84x84x4 stacks, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    sources = {"pong": pong_stacks, "random": random_stacks}
    stacks = {name: sources[name](arguments.threads, arguments.steps, 0) for name in arguments.sources}

    print(f"\n### Encoding: bytes and CPU per observation, {arguments.clients} clients' requests a batch\n")
    print("| frames | request | bytes per observation | client us per observation | server us per observation |")
    print("|:--|:--|--:|--:|--:|")
    for name, steps in stacks.items():
        clients = [steps, *(sources[name](arguments.threads, arguments.steps, seed)
                            for seed in range(1, arguments.clients))]
        for encoding, size, client, server in encoding_rows(clients, arguments.repeats):
            print(f"| {name} | {encoding} | {size:,.0f} | {client:.1f} | {server:.1f} |", flush=True)

    print(f"\n### Round trips: one server process on {arguments.device}, {arguments.threads} client threads\n")
    print("| model | frames | request | inferences/s, each round | request bytes per inference | frames / whole |")
    print("|:--|:--|:--|:--|--:|--:|")
    with EmbeddedRedis() as redis_server:
        for model in arguments.models:
            for name, steps in stacks.items():
                rates: dict[bool, list[float]] = {True: [], False: []}
                sizes: dict[bool, float] = {}
                for _ in range(arguments.rounds):
                    for whole in (True, False):
                        rate, sizes[whole] = round_trip_rate(redis_server.url, steps, arguments.seconds, whole, model,
                                                             arguments.device)
                        rates[whole].append(rate)
                ratio = statistics.mean(rates[False]) / statistics.mean(rates[True])
                for whole, label in ((True, "whole stacks (before)"), (False, "frames the server lacks (now)")):
                    print(f"| {model} | {name} | {label} | {', '.join(f'{rate:,.0f}' for rate in rates[whole])} | "
                          f"{sizes[whole]:,.0f} | {'' if whole else f'{ratio:.2f}'} |", flush=True)
    if arguments.seed_seconds > 0 and "pong" in arguments.sources:
        print(f"\n### SEED on Pong: one actor process of {arguments.threads} threads, the Nature DQN's network on "
              f"{arguments.device}, every step asking\n")
        print("| requests | env steps/s, each round | frames / whole |")
        print("|:--|:--|--:|")
        seed_rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(arguments.rounds):
            for request_frames in (False, True):
                seed_rates[request_frames].append(seed_pong_steps(arguments.threads, arguments.seed_seconds,
                                                                  request_frames, arguments.device))
        ratio = statistics.mean(seed_rates[True]) / statistics.mean(seed_rates[False])
        for request_frames, label in ((False, "whole stacks (request_frames=False)"),
                                      (True, "frames the server lacks (request_frames=True)")):
            print(f"| {label} | {', '.join(f'{rate:,.0f}' for rate in seed_rates[request_frames])} | "
                  f"{f'{ratio:.2f}' if request_frames else ''} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
