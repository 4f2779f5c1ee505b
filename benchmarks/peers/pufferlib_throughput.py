"""Env steps/s of PufferLib's ``pufferlib.vector.Multiprocessing`` on CartPole-v1 stepped by the benchmark policy.

W worker processes (``num_workers=W``), each stepping E gymnasium CartPole-v1 envs wrapped in
``pufferlib.emulation.GymnasiumPufferEnv`` and writing to shared memory (``num_envs=W*E``). This process runs the
policy loop on whatever ``recv()`` hands back: one batched forward of the 4-64-64-2 tanh MLP and numpy sampling
(the reference's policy step), then ``send()``. ``--batch-workers`` sets ``batch_size`` in workers: 1 (default)
is PufferLib's fastest, zero-copy "one worker per batch" path, in which the policy runs on one worker's envs
while the other steps (EnvPool-style double buffering); W is the fully synchronous path. No rollout length:
steps are counted as ``recv()`` returns them.

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/pufferlib/bin/python benchmarks/peers/pufferlib_throughput.py
"""

from __future__ import annotations

import argparse
import importlib.metadata

import gymnasium
import harness
import numpy as np
import pufferlib.emulation
import pufferlib.vector


def make_env() -> pufferlib.emulation.GymnasiumPufferEnv:
    return pufferlib.emulation.GymnasiumPufferEnv(env=gymnasium.make(harness.ENV_ID))


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-workers", type=int, default=1,
                        help="workers whose envs make one recv() batch (1: async double buffering, W: fully sync)")


def measure(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    if not 1 <= args.batch_workers <= args.workers or args.workers % args.batch_workers:
        raise SystemExit(f"expected --batch-workers to divide --workers {args.workers}, got {args.batch_workers}")
    vecenv = pufferlib.vector.make(make_env, backend=pufferlib.vector.Multiprocessing,
                                   num_envs=args.workers * envs_per_worker, num_workers=args.workers,
                                   batch_size=args.batch_workers * envs_per_worker)
    try:
        act = harness.numpy_act(harness.make_policy(), np.random.default_rng(0))
        vecenv.async_reset(0)

        def step() -> int:
            obs = vecenv.recv()[0]
            vecenv.send(act(obs).astype(vecenv.single_action_space.dtype))
            return len(obs)

        return harness.timed_window(step, args.seconds, args.warmup)
    finally:
        vecenv.close()


def package_versions() -> str:
    return harness.versions(pufferlib=importlib.metadata.version("pufferlib"), gymnasium=gymnasium.__version__)


if __name__ == "__main__":
    harness.main("PufferLib", "pufferlib.vector.Multiprocessing + batched forward in this process", package_versions,
                 measure, __doc__.split("\n\n")[0], extra=add_options)
