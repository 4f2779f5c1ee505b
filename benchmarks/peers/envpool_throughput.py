"""Env steps/s of EnvPool (C++ thread-pool env stepping) on Atari Pong with the benchmark conv net, sampling only.

EnvPool steps its envs in C++ threads of this process: ``envpool.make("Pong-v5", num_envs=W*E,
num_threads=W)``, W threads for the W worker processes of the other systems, with its own Atari preprocessing set to
the benchmark's: frame skip 4 with the max of the last two frames, 84x84 grayscale (INTER_AREA resize), a stack of
4 ((4, 84, 84) uint8, oldest first), up to 30 no-ops at reset, sticky actions 0.25 (Pong-v5's; EnvPool defaults to
0), no FIRE on reset (EnvPool's default presses it; gymnasium's AtariPreprocessing does not), no life-loss episodes,
27,000-step episodes. This process does one batched forward of the benchmark conv net (harness.make_conv_policy)
per step and numpy sampling, the reference's policy step. EnvPool has no rollout length: steps are counted as they
come back (it resets finished envs on their next step, as gymnasium's vector envs do).

``--batch-size`` picks EnvPool's mode: 0 (default) is its async mode with half the envs per batch
(``batch_size=W*E/2``): the policy steps one half while the threads step the other, EnvPool's fastest way to use
the cores; ``--batch-size W*E`` is its synchronous mode (every env stepped each round, the threads idle during the
forward).

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/envpool/bin/python benchmarks/peers/envpool_throughput.py --workload atari
"""

from __future__ import annotations

import argparse

import envpool
import harness
import numpy as np

TASK = "Pong-v5"  # EnvPool's name for ALE/Pong-v5


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=0,
                        help="envs per EnvPool batch: 0 = async with half of W*E; W*E = synchronous")


def make_pool(n_envs: int, threads: int, batch_size: int):  # noqa: ANN201 - an EnvPool gymnasium env
    return envpool.make(TASK, env_type="gymnasium", num_envs=n_envs, batch_size=batch_size, num_threads=threads,
                        seed=0, noop_max=30, frame_skip=4, stack_num=4, img_height=84, img_width=84, gray_scale=True,
                        repeat_action_probability=0.25, use_fire_reset=False, episodic_life=False, reward_clip=False,
                        max_episode_steps=27_000, use_inter_area_resize=True)


def measure(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    n_envs = args.workers * envs_per_worker
    batch_size = args.batch_size or max(1, n_envs // 2)
    if not 1 <= batch_size <= n_envs:
        raise SystemExit(f"--batch-size must be between 1 and W*E = {n_envs}")
    pool = make_pool(n_envs, args.workers, batch_size)
    act = harness.numpy_act(harness.make_conv_policy(int(pool.action_space.n)), np.random.default_rng(0))
    try:
        pool.async_reset()

        def step() -> int:
            obs, _, _, _, info = pool.recv()
            pool.send(act(obs), info["env_id"])
            return len(obs)

        return harness.timed_window(step, args.seconds, args.warmup)
    finally:
        pool.close()


def step_one_pool() -> None:
    """install.sh's check: EnvPool's Atari emulator and its Pong ROM load and step."""
    pool = make_pool(1, 1, 1)
    pool.reset()
    pool.step(np.zeros(1, dtype=np.int64))
    pool.close()


def package_versions() -> str:
    return harness.versions(envpool=envpool.__version__)


if __name__ == "__main__":
    harness.main("EnvPool", "envpool.make(Pong-v5): W*E envs in W C++ threads, batched forward in this process",
                 package_versions, measure, __doc__.split("\n\n")[0], extra=add_options, workloads=("atari",),
                 check_atari=step_one_pool)
