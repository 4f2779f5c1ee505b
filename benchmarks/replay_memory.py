"""Bytes, add time and sample time of SEED's replay on real Atari frames: whole observations against unique frames.

Several Pong envs (``make_atari_env``: 84x84 grayscale, frame skip 4, 4-frame stacks) take random actions;
their steps become 3-step transitions (``NStepCollector``) and, interleaved as an actor's messages bring
them, fill two replays side by side: one holding every observation whole (``ArrayStore``, the replay
before 2026-11-27), one holding each frame once (``FrameStore``, the replay now). The table gives the bytes a
stored transition takes, the time to add one, the time to sample a batch of 64 (and check it is the
same batch, bit for bit, from both), and what a replay of 1M transitions (the DQN papers') would take.

Needs the Atari extra (``pip install "rqrl[atari]"``). Run from the repository root::

    python benchmarks/replay_memory.py --transitions 20000 --capacity 10000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rqrl.algorithms.atari import make_atari_env
from rqrl.seed.frame_store import ArrayStore, FrameStore
from rqrl.seed.nstep import NStepCollector, stack
from rqrl.seed.replay import ReplayBuffer


def pong_transitions(count: int, envs: int, seed: int) -> list:
    """``count`` 3-step transitions of ``envs`` Pong envs stepping together with random actions, batched as one
    actor would send them (a step of every env at a time)."""
    games = [make_atari_env("ALE/Pong-v5") for _ in range(envs)]
    collectors = [NStepCollector(3, 0.99) for _ in games]
    observations = [game.reset(seed=seed + index)[0] for index, game in enumerate(games)]
    random = np.random.default_rng(seed)
    batches, made = [], 0
    while made < count:
        step = []
        for index, game in enumerate(games):
            action = int(random.integers(game.action_space.n))
            next_obs, reward, terminated, truncated, _ = game.step(action)
            step += collectors[index].step(observations[index], action, None, float(reward), next_obs, None,
                                           terminated, truncated)
            observations[index] = game.reset()[0] if terminated or truncated else next_obs
        if step:
            batches.append(stack(step, games[0].action_space.n))
            made += len(step)
        if len(batches) % 200 == 0 and step:
            print(f"  stepping Pong: {made:,} of {count:,} transitions", flush=True)
    return batches


def fill(replay: ReplayBuffer, batches: list) -> float:
    """Seconds to add every batch."""
    started = time.perf_counter()
    for batch in batches:
        replay.add(batch)
    return time.perf_counter() - started


def sample_seconds(replay: ReplayBuffer, batch_size: int, rounds: int, seed: int) -> tuple[float, list]:
    """Mean seconds per sample of ``batch_size``, and the samples (the same seeds draw the same rows)."""
    replay.random = np.random.default_rng(seed)
    started = time.perf_counter()
    samples = [replay.sample(batch_size)[0] for _ in range(rounds)]
    return (time.perf_counter() - started) / rounds, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=20_000, help="Transitions to add to each replay.")
    parser.add_argument("--capacity", type=int, default=10_000, help="Each replay's capacity (below --transitions "
                                                                     "to see the ring wrap and frames freed).")
    parser.add_argument("--envs", type=int, default=8, help="Pong envs stepping side by side.")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"stepping {args.envs} Pong envs for {args.transitions:,} transitions ...", flush=True)
    batches = pong_transitions(args.transitions, args.envs, args.seed)
    added = sum(batch.size for batch in batches)
    rows = []
    samples = {}
    for name, kind in (("whole observations (before)", ArrayStore), ("unique frames (now)", FrameStore)):
        replay = ReplayBuffer(args.capacity, (4, 84, 84), 6, prioritized=False, seed=args.seed, obs_dtype=np.uint8)
        replay.observations = kind(args.capacity, (4, 84, 84), np.uint8)
        print(f"filling the replay of {name} ...", flush=True)
        seconds = fill(replay, batches)
        per_sample, samples[name] = sample_seconds(replay, args.batch_size, 200, args.seed)
        per_transition = replay.nbytes / len(replay)
        rows.append((name, per_transition, seconds / added * 1e6, per_sample * 1e3, per_transition * 1e6 / 2**30))
    same = all(np.array_equal(a.obs, b.obs) and np.array_equal(a.next_obs, b.next_obs)
               for a, b in zip(*samples.values(), strict=True))
    print(f"\n{added:,} Pong transitions (3-step) into replays of {args.capacity:,}; samples of {args.batch_size}")
    print("| replay | KB per transition | add, us per transition | sample, ms per batch | 1M transitions, GB |")
    print("|:--|--:|--:|--:|--:|")
    for name, per_transition, add_us, sample_ms, million_gb in rows:
        print(f"| {name} | {per_transition / 1024:.1f} | {add_us:.1f} | {sample_ms:.2f} | {million_gb:.1f} |")
    print(f"\nratio, whole / frames: {rows[0][1] / rows[1][1]:.1f}x the bytes; "
          f"samples identical bit for bit: {same}")


if __name__ == "__main__":
    main()
