"""Env steps/s of RLlib's EnvRunner sampling on CartPole-v1 or Atari Pong (new API stack), sampling only.

W remote ``SingleAgentEnvRunner`` actors (``num_env_runners=W``), each stepping a gymnasium ``SyncVectorEnv`` of
E envs (``num_envs_per_env_runner=E``) with ``rollout_fragment_length=128``; every round this process asks all
runners to ``sample()`` one fragment in parallel (what PPO's ``synchronous_parallel_sample`` does) and counts the
env steps of the episodes they return. The EnvRunnerGroup is built without an Algorithm or Learner: no training,
no weight sync. The model is RLlib's default PPO module shaped like the benchmark policy: ``fcnet_hiddens=[64,
64]``, tanh, with the value function sharing the encoder (the cheapest default-module forward).

``--workload atari`` steps ALE/Pong-v5 made by harness.make_atari_env with the stack moved last, (84, 84, 4) uint8,
as RLlib's conv encoder takes images channels-last (the same gymnasium preprocessing as every system; RLlib's own
``wrap_atari_for_new_api_stack`` differs: it resizes and grays every raw RGB frame before skipping, turns frames
into float32 in [-1, 1], and adds EpisodicLife and FireReset wrappers). Its model: the default PPO module with the
benchmark conv net's layers as ``conv_filters=[[8, 8, 4, "valid"], [16, 4, 2, "valid"]]``, ReLU, no hidden layers
in the heads (``head_fcnet_hiddens=[]``: a linear action head over the 1,296 features) and the value head sharing
the conv encoder. Its conv net takes float tensors and RLlib has no input-scaling option, so the env-to-module
connector pipeline is RLlib's default one (built here explicitly) plus one piece at its end that turns the uint8
frames into floats in [0, 1], as the benchmark conv net does inside: the episodes keep uint8 frames.

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/rllib/bin/python benchmarks/peers/rllib_throughput.py
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import gymnasium
import harness
import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.env_to_module import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    BatchIndividualItems,
    NumpyToTensor,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.tune.registry import register_env

ATARI_NAME = "peers-atari"


def make_atari_env(env_config: object = None) -> gymnasium.Env:
    return harness.make_atari_env(harness.ATARI_ID, channels_last=True)


class ScaleFrames(ConnectorV2):
    """The last env-to-module piece: the batch's uint8 frames (a torch tensor by now) as float32 in [0, 1]."""

    def __call__(self, *, rl_module: object, batch: dict, episodes: list, explore: bool | None = None,
                 shared_data: dict | None = None, **kwargs: object) -> dict:
        batch[Columns.OBS] = batch[Columns.OBS].float().div_(255.0)
        return batch


def atari_env_to_module(env: object = None, spaces: object = None, device: object = None) -> list[ConnectorV2]:
    """RLlib's default single-agent env-to-module pipeline (AlgorithmConfig.build_env_to_module_connector), then
    ScaleFrames."""
    return [AddObservationsFromEpisodesToBatch(), AddTimeDimToBatchAndZeroPad(), AddStatesFromEpisodesToBatch(),
            BatchIndividualItems(multi_agent=False), NumpyToTensor(device=device), ScaleFrames()]


def measure(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    connectors = {}
    if args.workload == "atari":
        register_env(ATARI_NAME, make_atari_env)
        env = ATARI_NAME
        connectors = {"env_to_module_connector": atari_env_to_module,
                      "add_default_connectors_to_env_to_module_pipeline": False}
        model = DefaultModelConfig(conv_filters=[[8, 8, 4, "valid"], [16, 4, 2, "valid"]], conv_activation="relu",
                                   head_fcnet_hiddens=[], vf_share_layers=True)
    else:
        env = harness.ENV_ID
        model = DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh", vf_share_layers=True)
    config = (
        PPOConfig()
        .environment(env)
        .env_runners(num_env_runners=args.workers, num_envs_per_env_runner=envs_per_worker,
                     rollout_fragment_length=args.rollout_steps, num_cpus_per_env_runner=1, **connectors)
        .rl_module(model_config=model)
        .debugging(seed=0, log_level="WARN")
    )
    if not ray.is_initialized():
        # the env runners import harness (make_atari_env): they inherit this PYTHONPATH through the raylet
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                                 os.environ.get("PYTHONPATH")]))
        ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    group = EnvRunnerGroup(config=config, local_env_runner=False)

    def step() -> int:
        batches = group.foreach_env_runner(lambda runner: runner.sample(), local_env_runner=False)
        if len(batches) < args.workers:  # a runner failed (RLlib logs why and restarts it): no result, not 0
            raise RuntimeError(f"{args.workers - len(batches)} of {args.workers} env runners failed to sample")
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
                     package_versions, measure, __doc__.split("\n\n")[0], workloads=("cartpole", "atari"))
    finally:
        if ray.is_initialized():
            ray.shutdown()
