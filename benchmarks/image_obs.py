"""Image observations (84x84x4 uint8, Atari-sized frame stacks): steps/s and bytes moved per step.

The env returns a new 84x84 frame per step stacked with the last three (a ``uint8`` array of shape
``(84, 84, 4)``, 28,224 bytes). The *rqrl* side runs it through ``SubprocDistributedActors`` with
``W`` local workers and the learner's ``collect_outputs``; the *reference* runs the same envs in
``W`` plain processes as a gymnasium ``SyncVectorEnv`` stepped with the same policy (a small
convolutional net, one batched forward per step, numpy sampling) and moves nothing.

Bytes are read from Redis's own counters (``total_net_input_bytes`` / ``total_net_output_bytes``):
per env step, a rollout pays its observations once into Redis (the worker's push) and once out (the
learner's pop). ``in / obs bytes`` near 1.0 means no observation crosses the wire twice and
nothing but a small header and the per-step scalars rides along.

Run from the repository root::

    python benchmarks/image_obs.py --seconds 10 --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium
import numpy as np
import torch

import rqrl
from benchmarks.actors_throughput import cpu_snapshot, cpu_used, stop_processes
from benchmarks.scale import RedisCost
from rqrl.cli.status import read_worker_times
from rqrl.engine.timings import protocol_timings
from rqrl.engine.worker_times import WORKER_TIME_PARTS
from rqrl.maze.actors import SubprocDistributedActors

log = logging.getLogger("image_obs")

EnvFactory = Callable[[], gymnasium.Env]

FRAME = (84, 84)
STACK = 4
OBS_BYTES = FRAME[0] * FRAME[1] * STACK
EPISODE_STEPS = 500


class FrameStackEnv(gymnasium.Env):
    """Returns stacks of random 84x84 uint8 frames, oldest first, stacked along the first axis (``(4, 84, 84)``, as
    gymnasium's FrameStackObservation and Atari preprocessing give them) or the last (``(84, 84, 4)``); episodes
    end (truncated) after EPISODE_STEPS."""

    def __init__(self, channels_first: bool = True) -> None:
        self.channels_first = channels_first
        shape = (STACK, *FRAME) if channels_first else (*FRAME, STACK)
        self.observation_space = gymnasium.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gymnasium.spaces.Discrete(4)
        self._stack = np.zeros((STACK, *FRAME), np.uint8)
        self._steps = 0

    def _push_frame(self) -> np.ndarray:
        self._stack[:-1] = self._stack[1:]
        self._stack[-1] = self.np_random.integers(0, 256, FRAME, dtype=np.uint8)
        return self._stack.copy() if self.channels_first else np.ascontiguousarray(np.moveaxis(self._stack, 0, -1))

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        self._stack[:] = 0
        return self._push_frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._steps += 1
        return self._push_frame(), float(action == 0), False, self._steps >= EPISODE_STEPS, {}


def make_env() -> gymnasium.Env:
    """Channels-first stacks, ``(4, 84, 84)``."""
    return FrameStackEnv()


def make_channels_last_env() -> gymnasium.Env:
    """Channels-last stacks, ``(84, 84, 4)``."""
    return FrameStackEnv(channels_first=False)


ENV_FACTORIES = {"first": make_env, "last": make_channels_last_env}


class ConvPolicy(torch.nn.Module):
    """A small conv net over uint8 frame stacks (scaled to [0, 1] inside), giving ``n_actions`` logits (4 for
    FrameStackEnv; benchmarks/peers runs it on Pong's 6)."""

    def __init__(self, channels_first: bool = True, n_actions: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.channels_first = channels_first
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(STACK, 8, 8, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 4, stride=2),
            torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 9 * 9, n_actions),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        images = obs if self.channels_first else obs.permute(0, 3, 1, 2)
        return self.body(images.float() / 255.0)


@dataclass(frozen=True)
class Measurement:
    steps: int
    seconds: float
    redis: RedisCost | None = None
    cpu_seconds: dict[str, float] | None = None
    """CPU seconds by role over the window: workers, learner, redis, other (see actors_throughput.cpu_snapshot)."""
    learner_waited: float | None = None
    """Seconds of the window the learner's collects waited for rollouts (``last_wait_seconds``, summed)."""
    worker_times: dict[str, float] | None = None
    """The workers' mean share of their time in each part of their loop (rqrl.cli.status.read_worker_times), over
    the last window each published (a heartbeat, 5 s) if it ended a heartbeat or more into this window; None if
    none did (a window under 2 heartbeats may have none)."""

    def cpu_per_step(self, role: str) -> float | None:
        """Microseconds of ``role``'s CPU per env step."""
        if self.cpu_seconds is None or not self.steps:
            return None
        return self.cpu_seconds.get(role, 0.0) / self.steps * 1e6

    @property
    def own_cpu_seconds(self) -> float | None:
        """CPU seconds of this process and its children (workers, redis-server) over the window."""
        cpu = self.cpu_seconds
        return None if cpu is None else cpu.get("learner", 0.0) + cpu.get("workers", 0.0) + cpu.get("redis", 0.0)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds

    def bytes_per_step(self, direction: str) -> float | None:
        if self.redis is None or not self.steps:
            return None
        return (self.redis.bytes_in if direction == "in" else self.redis.bytes_out) / self.steps


def measure_rqrl(workers: int, envs: int, args: argparse.Namespace, env_factory: EnvFactory | None = None,
                 n_actions: int = 4) -> Measurement:
    """rqrl's side; ``env_factory`` (default: ``args.layout``'s random frames) and ``n_actions`` let
    benchmarks/peers run it on Atari."""
    n_actors = workers * envs
    device = getattr(args, "learner_device", "cpu")  # benchmarks/peers has none: the CPU
    policy = ConvPolicy(args.layout == "first", n_actions).eval()
    actors = SubprocDistributedActors(env_factory or ENV_FACTORIES[args.layout], policy, args.rollout_steps, n_actors,
                                      n_actors, 2.0, "fork", list(range(n_actors)), [1000 + a for a in range(n_actors)],
                                      n_workers=workers, actors_per_job=envs)
    with actors:
        actors.broadcast_updated_policy(policy.state_dict())
        actors.collect_outputs(device)
        warm_until = time.perf_counter() + args.warmup
        while time.perf_counter() < warm_until:
            actors.collect_outputs(device)
        before, cpu_before = RedisCost.read(actors.connection), cpu_snapshot()
        steps, waited = 0, 0.0
        # the workers' time shares of windows (a heartbeat each) that ended a heartbeat or more into this one
        times_since = time.time() + protocol_timings().heartbeat
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            steps += int(actors.collect_outputs(device).record.rewards.numel())
            waited += actors.last_wait_seconds
        elapsed = time.perf_counter() - started
        cpu = cpu_used(cpu_before, cpu_snapshot())
        cost = RedisCost.read(actors.connection).since(before)
        worker_times = mean_worker_times(read_worker_times(actors.connection, actors.keys, since=times_since))
    return Measurement(steps, elapsed, cost, cpu, waited, worker_times)


def mean_worker_times(by_worker: dict[str, dict[str, float]]) -> dict[str, float] | None:
    """Each part's share of the workers' time, averaged over the workers that published one."""
    if not by_worker:
        return None
    return {part: statistics.mean(shares[part] for shares in by_worker.values()) for part in WORKER_TIME_PARTS}


def _reference_process(envs: int, seed: int, layout: str, env_factory: EnvFactory, n_actions: int,
                       counter, stop) -> None:  # noqa: ANN001 - mp values
    torch.set_num_threads(1)
    policy = ConvPolicy(layout == "first", n_actions).eval()
    vector = gymnasium.vector.SyncVectorEnv([env_factory for _ in range(envs)])
    rng = np.random.default_rng(seed)
    obs, _ = vector.reset(seed=seed)
    try:
        while not stop.is_set():
            with torch.inference_mode():
                logits = policy(torch.from_numpy(obs)).numpy()
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            actions = np.minimum((probs.cumsum(axis=1) < rng.random((envs, 1))).sum(axis=1), n_actions - 1)
            obs, _, _, _, _ = vector.step(actions)
            with counter.get_lock():
                counter.value += envs
    finally:
        vector.close()


def measure_reference(workers: int, envs: int, args: argparse.Namespace, env_factory: EnvFactory | None = None,
                      n_actions: int = 4) -> Measurement:
    """The reference's side, with measure_rqrl's ``env_factory`` and ``n_actions``."""
    context = multiprocessing.get_context("fork")
    counter, stop = context.Value("q", 0), context.Event()
    factory = env_factory or ENV_FACTORIES[args.layout]
    processes = [context.Process(target=_reference_process,
                                 args=(envs, index, args.layout, factory, n_actions, counter, stop), daemon=True)
                 for index in range(workers)]
    for process in processes:
        process.start()
    try:
        deadline = time.monotonic() + 120
        while counter.value == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(args.warmup)
        before, started, cpu_before = counter.value, time.perf_counter(), cpu_snapshot()
        time.sleep(args.seconds)
        steps, elapsed = counter.value - before, time.perf_counter() - started
        cpu = cpu_used(cpu_before, cpu_snapshot())
    finally:
        stop_processes(processes, stop)
    return Measurement(steps, elapsed, None, cpu)


def print_table(args: argparse.Namespace, results: dict[int, list[dict[str, Measurement]]]) -> None:
    print()
    shape = f"{STACK}x{FRAME[0]}x{FRAME[1]}" if args.layout == "first" else f"{FRAME[0]}x{FRAME[1]}x{STACK}"
    print(f"## Image observations {shape} uint8 ({OBS_BYTES:,} bytes), {args.workers} "
          f"workers, {args.rollout_steps}-step rollouts, batches onto {args.learner_device}, "
          f"{args.seconds:g} s window, {args.rounds} round(s)")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, {platform.python_implementation()} {platform.python_version()}, "
          f"torch {torch.__version__}, rqrl {rqrl.__version__}")
    print()
    print("| envs per worker | rqrl steps/s | reference steps/s | rqrl / reference | Redis bytes in per step "
          "| in / obs bytes | Redis bytes out per step | out / obs bytes |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for envs, rounds in results.items():
        middle = statistics.median
        ratio = middle(r["rqrl"].steps_per_second / r["reference"].steps_per_second for r in rounds)
        bytes_in = middle(r["rqrl"].bytes_per_step("in") or 0.0 for r in rounds)
        bytes_out = middle(r["rqrl"].bytes_per_step("out") or 0.0 for r in rounds)
        print(f"| {envs} | {middle(r['rqrl'].steps_per_second for r in rounds):,.0f} | "
              f"{middle(r['reference'].steps_per_second for r in rounds):,.0f} | {ratio:.2f} | {bytes_in:,.0f} | "
              f"{bytes_in / OBS_BYTES:.3f} | {bytes_out:,.0f} | {bytes_out / OBS_BYTES:.3f} |")
    print()
    print("Where the CPU went, microseconds per env step (CPU seconds over the window / env steps delivered):")
    print()
    print("| envs per worker | rqrl workers | rqrl learner | redis-server | rqrl total | reference workers | "
          "rqrl total / reference | other load (cores) |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for envs, rounds in results.items():
        def per_step(side: str, role: str, rounds: list[dict[str, Measurement]] = rounds) -> float:
            values = [value for r in rounds if (value := r[side].cpu_per_step(role)) is not None]
            return statistics.median(values) if values else float("nan")
        total = sum(per_step("rqrl", role) for role in ("workers", "learner", "redis"))
        reference = per_step("reference", "workers")
        other = statistics.median((r["rqrl"].cpu_seconds or {}).get("other", 0.0) / r["rqrl"].seconds for r in rounds)
        print(f"| {envs} | {per_step('rqrl', 'workers'):.1f} | {per_step('rqrl', 'learner'):.1f} | "
              f"{per_step('rqrl', 'redis'):.1f} | {total:.1f} | {reference:.1f} | {total / reference:.2f} | "
              f"{other:.2f} |")
    print_worker_times(results)
    print()
    print("Medians over rounds; the ratio is the median of per-round ratios. Bytes are Redis's network counters "
          "over the window divided by the env steps delivered in it. CPU is read from /proc: the learner is this "
          "process, workers and redis-server its children; other load is the machine's busy time not theirs.")


def print_worker_times(results: dict[int, list[dict[str, Measurement]]]) -> None:
    """Where the rqrl workers' time went, as each published it (rqrl.engine.worker_times)."""
    print()
    print("Where the rqrl workers' time went, % of wall time (each worker's last published window of a heartbeat, 5 s, "
          "ended inside the measured window: '-' where none did, take --seconds 10 or more; averaged over workers; "
          "other: the rest, between rollouts and jobs), and the share of the window the learner waited for rollouts:")
    print()
    print("| envs per worker | " + " | ".join(WORKER_TIME_PARTS) + " | other | learner waited |")
    print("|--:|" + "--:|" * (len(WORKER_TIME_PARTS) + 2))
    for envs, rounds in results.items():
        waited = statistics.median((r["rqrl"].learner_waited or 0.0) / r["rqrl"].seconds for r in rounds)
        published = [r["rqrl"].worker_times for r in rounds if r["rqrl"].worker_times is not None]
        if not published:
            print(f"| {envs} | " + " | ".join("-" for _ in WORKER_TIME_PARTS) + f" | - | {100 * waited:.1f} |")
            continue
        shares = {part: statistics.median(times[part] for times in published) for part in WORKER_TIME_PARTS}
        other = max(0.0, 1.0 - sum(shares.values()))
        print(f"| {envs} | " + " | ".join(f"{100 * shares[part]:.1f}" for part in WORKER_TIME_PARTS)
              + f" | {100 * other:.1f} | {100 * waited:.1f} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (and reference processes)")
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32], help="envs per worker")
    parser.add_argument("--rollout-steps", type=int, default=64, help="n_rollout_steps")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (sides alternate which goes first)")
    parser.add_argument("--learner-device", default="cpu",
                        help="where collect_outputs puts the batches (cuda: a GPU learner's; frame stacks then go as "
                             "their frames and are gathered there)")
    parser.add_argument("--layout", choices=sorted(ENV_FACTORIES), default="first",
                        help="stack axis: first, (4, 84, 84) as gymnasium's Atari preprocessing; or last, (84, 84, 4)")
    args = parser.parse_args(argv)
    if args.workers < 1 or min(args.envs) < 1 or args.rollout_steps < 1 or args.rounds < 1 or args.seconds <= 0:
        parser.error("expected --workers, --envs, --rollout-steps, --rounds >= 1 and --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    sides = {"rqrl": measure_rqrl, "reference": measure_reference}
    results: dict[int, list[dict[str, Measurement]]] = {envs: [] for envs in args.envs}
    for round_index in range(args.rounds):
        for envs in args.envs:
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            measured = {}
            for side in order:
                log.info("round %d/%d, %d envs per worker: %s", round_index + 1, args.rounds, envs, side)
                measured[side] = sides[side](args.workers, envs, args)
                log.info("    %.0f steps/s", measured[side].steps_per_second)
            results[envs].append(measured)
    print_table(args, results)


if __name__ == "__main__":
    main()
