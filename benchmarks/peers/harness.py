"""What every peer script shares: its arguments, the workloads (env and policy), numpy sampling and the JSON line.

Each ``<peer>_throughput.py`` runs in that peer's own venv (see install.sh), so this module imports nothing from
rqrl: only the standard library, numpy and torch, which every venv has (gymnasium and ale-py only when an Atari
env is made).

Two workloads (``--workload``): *cartpole*, CartPole-v1 with the 4-64-64-2 tanh MLP; *atari*, ALE/Pong-v5 with
the standard preprocessing (``make_atari_env``: uint8 (4, 84, 84) frame stacks) and a small conv net
(``make_conv_policy``, benchmarks/image_obs.py's ConvPolicy with Pong's 6 actions).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

ENV_ID = "CartPole-v1"
ATARI_ID = "ALE/Pong-v5"
ATARI_ACTIONS = 6  # Pong-v5's minimal action set
WORKLOADS = {"cartpole": ENV_ID, "atari": ATARI_ID}


def make_policy() -> torch.nn.Module:
    """The benchmark policy: a 4-64-64-2 tanh MLP giving logits, same initial weights everywhere (as in
    benchmarks/actors_throughput.py)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 2)).eval()


def make_atari_env(env_id: str = ATARI_ID, channels_last: bool = False):  # noqa: ANN201 - a gymnasium.Env
    """The standard preprocessing every system steps: ``gymnasium.make(env_id, frameskip=1)``, then
    ``AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84)`` (grayscale, max over the last two frames,
    INTER_AREA resize, no life-loss termination) and a stack of the last 4 frames: uint8 (4, 84, 84), oldest
    first, as benchmarks/frame_bytes.py's ``atari_factory`` (what ``rqrl train`` makes). gymnasium < 1.0 (Sample
    Factory's venv) has ``FrameStack`` (LazyFrames) where 1.x has ``FrameStackObservation``: the same stack,
    turned into an array here. ``channels_last`` moves the stack axis last, (84, 84, 4), for RLlib's conv encoder,
    which takes images channels-last."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    if env_id not in gymnasium.registry:  # gymnasium 0.29 (Sample Factory's): ale-py 0.12's import registers
        from ale_py.registration import register_v5_envs  # nothing there (its vector env needs gymnasium 1.x), but

        register_v5_envs()  # its AtariEnv works
    env = gymnasium.make(env_id, frameskip=1)
    env = gymnasium.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    if hasattr(gymnasium.wrappers, "FrameStackObservation"):
        env = gymnasium.wrappers.FrameStackObservation(env, 4)
        if not channels_last:
            return env
    else:
        env = gymnasium.wrappers.FrameStack(env, 4)

    class Stacks(gymnasium.ObservationWrapper):
        """The stack as a plain uint8 array, channels-last if asked."""

        def __init__(self, inner: gymnasium.Env) -> None:
            super().__init__(inner)
            self.observation_space = gymnasium.spaces.Box(0, 255, (84, 84, 4) if channels_last else (4, 84, 84),
                                                          np.uint8)

        def observation(self, observation: object) -> np.ndarray:
            stack = np.asarray(observation)
            return np.ascontiguousarray(np.moveaxis(stack, 0, -1)) if channels_last else stack

    return Stacks(env)


def make_conv_policy(n_actions: int = ATARI_ACTIONS) -> torch.nn.Module:
    """The Atari benchmark policy, layer for layer and weight for weight benchmarks/image_obs.py's ConvPolicy (the
    one rqrl and the reference run): uint8 (4, 84, 84) scaled to [0, 1], conv 8x8/4 to 8 channels, ReLU, conv 4x4/2
    to 16, ReLU, flatten (1,296), linear to the logits."""

    class ConvPolicy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(4, 8, 8, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 4, stride=2),
                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 9 * 9, n_actions),
            )

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.body(obs.float() / 255.0)

    return ConvPolicy().eval()


def workload_policy(workload: str) -> torch.nn.Module:
    return make_conv_policy() if workload == "atari" else make_policy()


def numpy_act(policy: torch.nn.Module, rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """One batched forward and numpy sampling from the softmax: the reference's policy step."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        actions = (probs.cumsum(axis=1) < rng.random((len(probs), 1))).sum(axis=1)
        return np.minimum(actions, probs.shape[1] - 1)

    return act


@dataclass(frozen=True)
class Result:
    """One configuration's measurement, printed as one JSON line that run.py parses."""

    system: str
    workers: int
    envs_per_worker: int
    steps: int
    seconds: float
    steps_per_second: float
    path: str
    cpu_seconds: float | None = None  # CPU the system's processes used in the window (see tree_cpu_seconds)
    steps_per_cpu_second: float | None = None


def parse_args(description: str, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--envs-per-worker", type=int, nargs="+", default=[8, 32], help="E: envs per worker")
    parser.add_argument("--rollout-steps", type=int, default=128, help="rollout length, where the peer has one")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window per configuration")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds stepped before the window opens")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="cartpole",
                        help=f"cartpole: {ENV_ID}, 4-64-64-2 MLP; atari: {ATARI_ID}, preprocessed, conv net")
    parser.add_argument("--check", action="store_true",
                        help="import the peer, print its versions and exit (install.sh's check)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.workers < 1 or min(args.envs_per_worker) < 1 or args.rollout_steps < 1 or args.seconds <= 0:
        parser.error("expected --workers, --envs-per-worker, --rollout-steps >= 1 and --seconds > 0")
    return args


def versions(**packages: str) -> str:
    """'python 3.11.7, torch 2.13.0+cpu, ..., ale-py 0.12.1': what install.sh records and run.py shows (ale-py where
    it is installed)."""
    parts = {"python": platform.python_version(), "torch": torch.__version__, **packages}
    try:
        parts.setdefault("ale-py", importlib.metadata.version("ale-py"))
    except importlib.metadata.PackageNotFoundError:
        pass
    return ", ".join(f"{name} {version}" for name, version in parts.items())


def _step_one_atari_env() -> None:
    env = make_atari_env()
    env.reset(seed=0)
    env.step(0)
    env.close()


def emit(result: Result) -> None:
    print(json.dumps(asdict(result)), flush=True)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """User + system CPU seconds so far of process ``root`` (default: this one), all its threads, and every
    process descending from it (Sample Factory's workers, Ray's raylet and its workers, ...), from /proc; None
    where there is no /proc. A descendant that exits inside a window takes its CPU with it."""
    if not os.path.isdir("/proc"):
        return None
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                data = file.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2:].split()  # fields[0] is the state (field 3 of proc(5))
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(children.get(pid, []))
    return total


def timed_window(step: Callable[[], int], seconds: float, warmup: float) -> tuple[int, float, float | None]:
    """Call ``step`` (which returns env steps done) through ``warmup`` seconds, then count steps for at least
    ``seconds``; returns (steps, elapsed seconds, CPU seconds of this process tree in the window or None)."""
    warm_until = time.perf_counter() + warmup
    while time.perf_counter() < warm_until:
        step()
    steps = 0
    cpu_before = tree_cpu_seconds()
    started = time.perf_counter()
    while True:
        steps += step()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            cpu_after = tree_cpu_seconds()
            cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
            return steps, elapsed, cpu


Measured = tuple[int, float] | tuple[int, float, float | None]  # steps, seconds[, CPU seconds]


def main(system: str, path: str, package_versions: Callable[[], str],
         measure: Callable[[argparse.Namespace, int], Measured], description: str,
         argv: list[str] | None = None,
         extra: Callable[[argparse.ArgumentParser], None] | None = None,
         workloads: tuple[str, ...] = ("cartpole",), check_atari: Callable[[], None] | None = None) -> None:
    """Parse arguments; with --check print versions (with ``--workload atari`` after ``check_atari``, by default
    making and stepping one env of make_atari_env: ROMs, cv2), else measure and emit one line per E.
    ``workloads``: those the script has a path for."""
    args = parse_args(description, argv, extra)
    if args.workload not in workloads:
        raise SystemExit(f"{system} has no {args.workload} workload here (it has: {', '.join(workloads)})")
    if args.check:
        if args.workload == "atari":
            (check_atari or _step_one_atari_env)()
        print(package_versions())
        return
    torch.set_num_threads(1)
    for envs in args.envs_per_worker:
        steps, seconds, *rest = measure(args, envs)
        cpu = rest[0] if rest else None
        emit(Result(system, args.workers, envs, steps, seconds, steps / seconds, path, cpu,
                    steps / cpu if cpu else None))
    sys.stdout.flush()
