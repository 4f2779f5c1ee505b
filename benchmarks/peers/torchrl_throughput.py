"""Env steps/s of TorchRL's multi-process collector (``MultiSyncCollector``) on CartPole-v1.

W collector worker processes, each stepping a batch of E CartPole-v1 envs with the 4-64-64-2 tanh MLP as a
``ProbabilisticActor`` (Categorical over the logits) and filling ``E * rollout_steps`` frames per batch; the
main process iterates the collector and counts the frames of every batch it yields. No training, no weight
updates: the collector's sampling path only. ``--batching`` picks how a worker batches its E envs:
``gym-sync`` (default) wraps a gymnasium ``SyncVectorEnv(E)`` in ``GymWrapper``, ``serial`` uses TorchRL's own
``SerialEnv(E, GymEnv)``; ``--collector async`` uses ``MultiAsyncCollector`` (one worker's batch at a time).

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/torchrl/bin/python benchmarks/peers/torchrl_throughput.py
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata

import gymnasium
import harness
import torch
from tensordict.nn import TensorDictModule
from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
from torchrl.envs import EnvBase, GymWrapper, SerialEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import ProbabilisticActor


def make_batched_env(batching: str, n_envs: int) -> EnvBase:
    if batching == "serial":
        return SerialEnv(n_envs, functools.partial(GymEnv, harness.ENV_ID, categorical_action_encoding=True))
    vector = gymnasium.vector.SyncVectorEnv([functools.partial(gymnasium.make, harness.ENV_ID)] * n_envs,
                                            autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    return GymWrapper(vector, categorical_action_encoding=True)


def make_actor() -> ProbabilisticActor:
    module = TensorDictModule(harness.make_policy(), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(module, in_keys=["logits"], out_keys=["action"],
                              distribution_class=torch.distributions.Categorical, return_log_prob=False)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batching", choices=["gym-sync", "serial"], default="gym-sync",
                        help="how a worker batches its E envs")
    parser.add_argument("--collector", choices=["sync", "async"], default="sync",
                        help="MultiSyncCollector or MultiAsyncCollector")


def measure(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    collector_class = MultiSyncCollector if args.collector == "sync" else MultiAsyncCollector
    frames_per_worker = envs_per_worker * args.rollout_steps
    frames_per_batch = frames_per_worker * (args.workers if args.collector == "sync" else 1)
    collector = collector_class(
        [functools.partial(make_batched_env, args.batching, envs_per_worker)] * args.workers,
        make_actor(), frames_per_batch=frames_per_batch, total_frames=-1, num_sub_threads=1,
    )
    batches = iter(collector)
    try:
        return harness.timed_window(lambda: next(batches).numel(), args.seconds, args.warmup)
    finally:
        collector.shutdown()


def package_versions() -> str:
    return harness.versions(torchrl=importlib.metadata.version("torchrl"),
                            tensordict=importlib.metadata.version("tensordict"), gymnasium=gymnasium.__version__)


if __name__ == "__main__":
    args = harness.parse_args(__doc__.split("\n\n")[0], extra=add_options)
    harness.main("TorchRL", f"{'MultiSyncCollector' if args.collector == 'sync' else 'MultiAsyncCollector'}, "
                 f"{args.batching} batching, sampling only", package_versions, measure, __doc__.split("\n\n")[0],
                 extra=add_options)
