"""Env steps/s of gymnasium's ``AsyncVectorEnv`` on CartPole-v1 stepped by the benchmark policy.

gymnasium's multi-process vectorization runs one subprocess per env, so "W workers x E envs" is an
``AsyncVectorEnv`` of W*E env processes; this process does one batched forward of the 4-64-64-2 tanh MLP per
step over all W*E observations and samples in numpy (the same policy step as the reference in
benchmarks/actors_throughput.py). There is no rollout length: steps are counted as they happen (autoreset).
``--shared-memory`` is gymnasium's default and kept.

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/gymnasium_async/bin/python benchmarks/peers/gymnasium_async_throughput.py
"""

from __future__ import annotations

import argparse

import gymnasium
import harness
import numpy as np

PATH = "AsyncVectorEnv(W*E env processes) + batched forward in this process"


def make_env() -> gymnasium.Env:
    return gymnasium.make(harness.ENV_ID)


def measure(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    n_envs = args.workers * envs_per_worker
    envs = gymnasium.vector.AsyncVectorEnv([make_env] * n_envs)
    try:
        act = harness.numpy_act(harness.make_policy(), np.random.default_rng(0))
        obs, _ = envs.reset(seed=list(range(n_envs)))

        def step() -> int:
            nonlocal obs
            obs, _, _, _, _ = envs.step(act(obs))
            return n_envs

        return harness.timed_window(step, args.seconds, args.warmup)
    finally:
        envs.close()


if __name__ == "__main__":
    harness.main("gymnasium AsyncVectorEnv", PATH, lambda: harness.versions(gymnasium=gymnasium.__version__),
                 measure, __doc__.split("\n\n")[0])
