"""SEED on real Atari frames, whole observations against unique frames: its transition messages (bytes, the
actor's encode, the trainer's decode) and its replay (bytes, add time, sample time).

Several Pong envs (``make_atari_env``: 84x84 grayscale, frame skip 4, 4-frame stacks) take random actions;
their steps become 3-step transitions (``NStepCollector``) in messages as SEED's actor threads send them (16
transitions of one env in a row), which fill two replays side by side, message by message as the trainer adds
them: one holding every observation whole (``ArrayStore``, the replay
before 2026-11-27), one holding each frame once (``FrameStore``), filled two ways: from the transitions' stacks,
each frame of each stack looked up (before 2026-11-28), and from the distinct frames their decoded message
carried (the trainer now). The table gives the bytes a
stored transition takes, the time to add one, the time to sample a batch of 64 (and check it is the
same batch, bit for bit, from both), and what a replay of 1M transitions (the DQN papers') would take. The
messages are also encoded and decoded as actors and trainer do now (``encode_transitions``,
``decode_transitions``) and as they did before 2026-11-27 (both stacks of every transition whole, then zstd).

Needs the Atari extra (``pip install "rqrl[atari]"``). Run from the repository root::

    python benchmarks/replay_memory.py --transitions 20000 --capacity 10000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rqrl.algorithms.atari import make_atari_env
from rqrl.seed.actor import TRANSITIONS_PER_MESSAGE, decode_transitions, encode_transitions
from rqrl.seed.frame_store import ArrayStore, FrameStore, TransitionFrames
from rqrl.seed.nstep import NStepCollector, TransitionBatch, stack
from rqrl.seed.replay import ReplayBuffer
from rqrl.seed.store import seal, unseal

KEY = b"benchmark key of 32 bytes, fixed"


def pong_messages(count: int, envs: int, seed: int) -> list[TransitionBatch]:
    """``count`` 3-step transitions of ``envs`` Pong envs stepping side by side with random actions, in messages as
    SEED's actor threads send them (one env's, each TRANSITIONS_PER_MESSAGE transitions in a row, or fewer at an
    episode's end), in the order they would be sent."""
    games = [make_atari_env("ALE/Pong-v5") for _ in range(envs)]
    collectors = [NStepCollector(3, 0.99) for _ in games]
    outboxes: list[list] = [[] for _ in games]
    observations = [game.reset(seed=seed + index)[0] for index, game in enumerate(games)]
    random = np.random.default_rng(seed)
    messages: list[TransitionBatch] = []
    made = 0
    while made < count:
        for index, game in enumerate(games):
            action = int(random.integers(game.action_space.n))
            next_obs, reward, terminated, truncated, _ = game.step(action)
            outboxes[index] += collectors[index].step(observations[index], action, None, float(reward), next_obs,
                                                      None, terminated, truncated)
            observations[index] = game.reset()[0] if terminated or truncated else next_obs
            if len(outboxes[index]) >= TRANSITIONS_PER_MESSAGE or ((terminated or truncated) and outboxes[index]):
                messages.append(stack(outboxes[index], game.action_space.n))
                made += messages[-1].size
                outboxes[index] = []
                if len(messages) % 200 == 0:
                    print(f"  stepping Pong: {made:,} of {count:,} transitions", flush=True)
    return messages


def whole_message(batch: TransitionBatch, key: bytes) -> bytes:
    """A message as actors sent them before 2026-11-27: every array whole, then zstd."""
    return seal({**batch._asdict(), "episode_returns": np.zeros(0)}, {"sender": "", "sequence": "0"}, key)


def whole_decode(blob: bytes, key: bytes) -> TransitionBatch:
    arrays, _ = unseal(blob, key)
    return TransitionBatch(*(arrays[name] for name in TransitionBatch._fields))


def message_rows(messages: list[TransitionBatch]) -> list[tuple[str, float, float, float]]:
    """(encoding, bytes per transition, encode us per transition, decode us per transition) of ``messages``, the
    way each encoding makes them; checks that each decodes to the transitions encoded."""
    transitions = sum(message.size for message in messages)
    rows = []
    for name, encode, decode in (("whole observations + zstd (before)", whole_message, whole_decode),
                                 ("unique frames + zstd (now)", encode_transitions,
                                  lambda blob, key: decode_transitions(blob, key).batch)):
        encode_seconds = decode_seconds = 0.0
        size = 0
        for message in messages:  # each decoded, checked and let go: holding them all would time page faults
            started = time.perf_counter()
            blob = encode(message, KEY)
            encoded = time.perf_counter()
            batch = decode(blob, KEY)
            encode_seconds += encoded - started
            decode_seconds += time.perf_counter() - encoded
            size += len(blob)
            assert all(np.array_equal(getattr(batch, field), getattr(message, field)) for field in message._fields)
        rows.append((name, size / transitions, encode_seconds / transitions * 1e6, decode_seconds / transitions * 1e6))
    return rows


def fill(replay: ReplayBuffer, batches: list[TransitionBatch],
         frames: list[TransitionFrames | None] | None = None) -> tuple[float, int]:
    """Seconds to add the batches (messages, as the trainer adds them, with their decoded ``frames`` if given) that
    came once the replay was full (a long run's steady state: the first ones also pay the page faults of new
    memory), and how many transitions they held."""
    seconds, timed = 0.0, 0
    for batch, batch_frames in zip(batches, frames or [None] * len(batches), strict=True):
        full = len(replay) == replay.capacity
        started = time.perf_counter()
        replay.add(batch, frames=batch_frames)
        if full:
            seconds, timed = seconds + time.perf_counter() - started, timed + batch.size
    return seconds, timed


def sample_seconds(replay: ReplayBuffer, batch_size: int, rounds: int, seed: int) -> tuple[float, list]:
    """Mean seconds per sample of ``batch_size`` (each let go: holding them would time page faults), and ten more
    samples drawn with ``seed``, which draws the same rows from any replay of the same transitions."""
    started = time.perf_counter()
    for _ in range(rounds):
        replay.sample(batch_size)
    seconds = (time.perf_counter() - started) / rounds
    replay.random = np.random.default_rng(seed)
    return seconds, [replay.sample(batch_size)[0] for _ in range(10)]


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
    batches = pong_messages(args.transitions, args.envs, args.seed)
    added = sum(batch.size for batch in batches)
    print("encoding messages ...", flush=True)
    messages = message_rows(batches)
    rows = []
    samples = {}
    decoded = [decode_transitions(encode_transitions(batch, KEY), KEY).frames for batch in batches]
    for name, kind, frames in (("whole observations (before 2026-11-27)", ArrayStore, None),
                               ("unique frames, found in every stack (before 2026-11-28)", FrameStore, None),
                               ("unique frames, the message's kept (now)", FrameStore, decoded)):
        replay = ReplayBuffer(args.capacity, (4, 84, 84), 6, prioritized=False, seed=args.seed, obs_dtype=np.uint8)
        replay.observations = kind(args.capacity, (4, 84, 84), np.uint8)
        print(f"filling the replay of {name} ...", flush=True)
        seconds, timed = fill(replay, batches, frames)
        per_sample, samples[name] = sample_seconds(replay, args.batch_size, 200, args.seed)
        per_transition = replay.nbytes / len(replay)
        rows.append((name, per_transition, seconds / max(timed, 1) * 1e6, per_sample * 1e3,
                     per_transition * 1e6 / 2**30))
    same = all(np.array_equal(a.obs, b.obs) and np.array_equal(a.next_obs, b.next_obs)
               for drawn in zip(*samples.values(), strict=True) for a, b in zip(drawn, drawn[1:], strict=False))
    print(f"\n{added:,} Pong transitions (3-step) in messages of {TRANSITIONS_PER_MESSAGE}, decoded to the same "
          f"transitions")
    print("| message | bytes per transition | actor: encode, us per transition | trainer: decode, us per transition |")
    print("|:--|--:|--:|--:|")
    for name, size, encode_us, decode_us in messages:
        print(f"| {name} | {size:,.0f} | {encode_us:.1f} | {decode_us:.1f} |")
    print(f"\n{added:,} Pong transitions (3-step) into replays of {args.capacity:,}; samples of {args.batch_size}")
    print("| replay | KB per transition | add, us per transition (replay full) | sample, ms per batch "
          "| 1M transitions, GB |")
    print("|:--|--:|--:|--:|--:|")
    for name, per_transition, add_us, sample_ms, million_gb in rows:
        print(f"| {name} | {per_transition / 1024:.1f} | {add_us:.1f} | {sample_ms:.2f} | {million_gb:.1f} |")
    print(f"\nratio, whole / frames: {rows[0][1] / rows[1][1]:.1f}x the bytes; "
          f"samples identical bit for bit: {same}")


if __name__ == "__main__":
    main()
