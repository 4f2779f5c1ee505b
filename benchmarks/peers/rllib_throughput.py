"""Env steps/s of RLlib's EnvRunner sampling on CartPole-v1 (new API stack), sampling only.

W remote ``SingleAgentEnvRunner`` actors (``num_env_runners=W``), each stepping a gymnasium ``SyncVectorEnv`` of
E envs (``num_envs_per_env_runner=E``) with ``rollout_fragment_length=128``; every round this process asks all
runners to ``sample()`` one fragment in parallel (what PPO's ``synchronous_parallel_sample`` does) and counts the
env steps of the episodes they return. The EnvRunnerGroup is built without an Algorithm or Learner: no training,
no weight sync. The model is RLlib's default PPO module shaped like the benchmark policy: ``fcnet_hiddens=[64,
64]``, tanh, with the value function sharing the encoder (the cheapest default-module forward).

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/rllib/bin/python benchmarks/peers/rllib_throughput.py
"""

from __future__ import annotations

import argparse
import logging

import gymnasium
import harness
import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.env_runner_group import EnvRunnerGroup


def measure(args: argparse.Namespace, envs_per_worker: int) -> tuple[int, float]:
    config = (
        PPOConfig()
        .environment(harness.ENV_ID)
        .env_runners(num_env_runners=args.workers, num_envs_per_env_runner=envs_per_worker,
                     rollout_fragment_length=args.rollout_steps, num_cpus_per_env_runner=1)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                   vf_share_layers=True))
        .debugging(seed=0, log_level="WARN")
    )
    if not ray.is_initialized():
        ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    group = EnvRunnerGroup(config=config, local_env_runner=False)

    def step() -> int:
        batches = group.foreach_env_runner(lambda runner: runner.sample(), local_env_runner=False)
        return sum(episode.env_steps() for episodes in batches for episode in episodes)

    try:
        return harness.timed_window(step, args.seconds, args.warmup)
    finally:
        group.stop()


def package_versions() -> str:
    return harness.versions(ray=ray.__version__, gymnasium=gymnasium.__version__)


if __name__ == "__main__":
    try:
        harness.main("RLlib", "EnvRunnerGroup: W remote SingleAgentEnvRunners, sample() in parallel, sampling only",
                     package_versions, measure, __doc__.split("\n\n")[0])
    finally:
        if ray.is_initialized():
            ray.shutdown()
