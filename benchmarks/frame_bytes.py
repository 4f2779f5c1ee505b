"""Atari frames on the wire: Redis bytes per env step, and the worker's and learner's CPU per rollout, by encoding.

Real Atari (``ALE/Pong-v5``, ``ALE/Breakout-v5`` with gymnasium's standard preprocessing: noop reset, frame
skip 4, 84x84 grayscale, a stack of 4) stepped by the worker's own ``ActorGroup`` with uniformly random
actions, so the stepping cost is the env's alone and the encoding's share is the largest it can be. Each
rollout group is encoded four ways:

- *raw*: every observation as it is (each frame crosses four times, in four stacks);
- *unique frames*: each stack's new frame only (``rqrl.engine.frames``), uncompressed;
- *unique frames + zstd*: what workers send (``rqrl.engine.compression``, zstd level 1);
- *unique frames + lz4*: the alternative measured (lz4 block; needs ``pip install lz4``).

Without ale-py (``pip install "rqrl[atari]"``) the random 84x84 frames of ``benchmarks/image_obs.py`` stand
in: they do not compress, so only the unique frames count there.

Run from the repository root::

    python benchmarks/frame_bytes.py --rollouts 6
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium
import torch

import rqrl
from rqrl.algorithms.atari import make_atari_env
from rqrl.engine.compression import compress, decompress
from rqrl.engine.policy import categorical_step, make_act_function
from rqrl.maze.group_records import decode_group, encode_group, encode_steps_group
from rqrl.maze.rollout import ActorGroup, GroupRollout

RUN = "frame-bytes"


class RandomPolicy(torch.nn.Module):
    """Uniformly random actions: the rollout's CPU is the env's."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.n_actions = n_actions

    def act(self, obs: torch.Tensor, generator: torch.Generator):  # noqa: ANN201 - a PolicyStep
        return categorical_step(torch.zeros(len(obs), self.n_actions), generator)


def atari_factory(env_id: str) -> Callable[[], gymnasium.Env]:
    """An ALE env with the standard preprocessing, as ``rqrl train`` makes it (``rqrl.algorithms.atari``)."""
    return functools.partial(make_atari_env, env_id)


def random_frames() -> gymnasium.Env:
    from benchmarks.image_obs import FrameStackEnv

    return FrameStackEnv()


@dataclass
class Costs:
    """Per rollout group: bytes on the wire, and CPU seconds to encode and to decode, per encoding."""

    steps: int
    step_seconds: float
    bytes: dict[str, int]
    encode_seconds: dict[str, float]
    decode_seconds: dict[str, float]


def _cpu(function: Callable[[], object]) -> tuple[object, float]:
    started = time.process_time()
    result = function()
    return result, time.process_time() - started


def measure(group: ActorGroup, act, rollout_id: int) -> Costs:  # noqa: ANN001 - an ActFunction
    rollout, stepping = _cpu(lambda: group.run_group(act, rollout_id, 1, cut_at_end=False))
    assert isinstance(rollout, GroupRollout)
    continues = [True] * len(rollout.actor_ids)
    records = rollout.records()
    raw, raw_encode = _cpu(lambda: encode_group(records, RUN))
    sent, sent_encode = _cpu(lambda: encode_steps_group(rollout.steps, rollout.actor_ids, continues, 1, rollout_id,
                                                        "w", RUN))
    unique = decompress(sent)
    _, zstd_seconds = _cpu(lambda: compress(bytes(unique)))
    encodings = {"raw": raw, "unique frames": bytes(unique), "unique frames + zstd": sent}
    encode = {"raw": raw_encode, "unique frames": sent_encode - zstd_seconds, "unique frames + zstd": sent_encode}
    decode = {}
    try:
        import lz4.block

        lz4_blob, lz4_seconds = _cpu(lambda: lz4.block.compress(bytes(unique)))
        encodings["unique frames + lz4"] = lz4_blob
        encode["unique frames + lz4"] = encode["unique frames"] + lz4_seconds
        _, lz4_decode = _cpu(lambda: lz4.block.decompress(lz4_blob))
    except ImportError:
        lz4_decode = None
    for name, blob in encodings.items():  # the learner's decode: decompress, unpack, split into records
        if name == "unique frames + lz4":
            continue
        _, decode[name] = _cpu(lambda blob=blob: decode_group(blob, RUN))
    if lz4_decode is not None:
        decode["unique frames + lz4"] = decode["unique frames"] + lz4_decode
    return Costs(int(rollout.steps.rewards.size), stepping, {name: len(blob) for name, blob in encodings.items()},
                 encode, decode)


def run_env(name: str, factory: Callable[[], gymnasium.Env], args: argparse.Namespace) -> list[Costs]:
    envs = args.envs
    group = ActorGroup(factory, list(range(envs)), list(range(envs)), list(range(100, 100 + envs)), args.rollout_steps)
    act = make_act_function(RandomPolicy(int(group.action_space.n)), group.action_space)
    measure(group, act, 0)  # warm-up: allocations, first resets
    costs = [measure(group, act, rollout_id) for rollout_id in range(1, args.rollouts + 1)]
    print(f"    {name}: {len(costs)} rollouts of {costs[0].steps} steps measured", flush=True)
    return costs


def print_table(results: dict[str, list[Costs]], obs_bytes: int, args: argparse.Namespace) -> None:
    print()
    print(f"## Bytes per env step and CPU per rollout, by encoding ({args.envs} envs x {args.rollout_steps} steps per "
          f"rollout, {args.rollouts} rollouts each)")
    print()
    print(f"machine: {os.cpu_count()} logical CPUs, {platform.python_implementation()} {platform.python_version()}, "
          f"torch {torch.__version__}, rqrl {rqrl.__version__}")
    print()
    print("| env | encoding | bytes per step | / raw observation | worker: encode ms per rollout | "
          "encode / env stepping | learner: decode ms per rollout |")
    print("|:--|:--|--:|--:|--:|--:|--:|")
    middle = statistics.median
    for env, costs in results.items():
        for encoding in costs[0].bytes:
            per_step = middle(c.bytes[encoding] / c.steps for c in costs)
            encode = middle(c.encode_seconds[encoding] for c in costs)
            stepping = middle(c.step_seconds for c in costs)
            decode = middle(c.decode_seconds[encoding] for c in costs)
            print(f"| {env} | {encoding} | {per_step:,.0f} | {per_step / obs_bytes:.3f} | {encode * 1e3:.1f} | "
                  f"{encode / stepping:.3f} | {decode * 1e3:.1f} |")
    print()
    print(f"The raw observation is {obs_bytes:,} bytes (4 x 84 x 84 uint8). 'encode / env stepping' is the worker CPU "
          f"the encoding adds to stepping the envs (random actions: no policy forward). Medians over rollouts.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--envs", type=int, default=8, help="envs in the rollout group (one worker's actors)")
    parser.add_argument("--rollout-steps", type=int, default=64, help="n_rollout_steps")
    parser.add_argument("--rollouts", type=int, default=6, help="rollout groups measured per env")
    parser.add_argument("--env", nargs="+", default=["ALE/Pong-v5", "ALE/Breakout-v5", "random"],
                        help="ALE env ids, and/or 'random' (image_obs.py's random frames)")
    args = parser.parse_args(argv)
    if min(args.envs, args.rollout_steps, args.rollouts) < 1:
        parser.error("expected --envs, --rollout-steps and --rollouts >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, list[Costs]] = {}
    for env_id in args.env:
        if env_id == "random":
            results["random 84x84 frames"] = run_env(env_id, random_frames, args)
            continue
        try:
            import ale_py  # noqa: F401
        except ImportError:
            print(f"    {env_id}: skipped, ale-py is not installed (pip install \"rqrl[atari]\")")
            continue
        results[env_id] = run_env(env_id, atari_factory(env_id), args)
    print_table(results, 4 * 84 * 84, args)


if __name__ == "__main__":
    main()
