"""Env steps/s of Sample Factory's APPO sampler on CartPole-v1 or Atari Pong, sampling only (``SyncSamplingAPI``).

Sample Factory 2's sampling path without the learner, as in its ``sf_examples/sampler`` example: W rollout worker
processes with E envs each (``--num_workers W --num_envs_per_worker E``, double-buffered in
``--worker_num_splits 2`` halves, Sample Factory's default), one policy (inference) worker process that batches
their observations, ``--rollout 128``-step trajectories into shared buffers; this process counts the env steps of
every trajectory ``get_trajectories_sync`` hands back. No training runs, so the policy keeps its initial weights.
The model is Sample Factory's own actor-critic built to the benchmark's shape: an MLP encoder of 64-64 tanh
layers, no RNN, a linear action head over the 2 actions (plus the critic head Sample Factory always computes).

``--workload atari`` steps ALE/Pong-v5 made by harness.make_atari_env (the same gymnasium preprocessing as every
system; Sample Factory's own sf_examples/atari wrappers differ: NoFrameskip-v4 without sticky actions, RGB resized
then turned gray, and EpisodicLife, FireReset and ClipReward wrappers). Its model: Sample Factory's own conv encoder
(``ConvEncoderImpl``, TorchScript) with the benchmark conv net's layers, 8x8/4 to 8 channels and 4x4/2 to 16, ReLU,
no MLP after them, registered through its encoder factory (its nearest built-in, ``convnet_impala``, has twice the
channels), then its linear action and critic heads; ``--obs_scale=255``, no input normalization, no RNN.

Run in its venv (see install.sh)::

    benchmarks/peers/.venvs/sample_factory/bin/python benchmarks/peers/sample_factory_throughput.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import tempfile

import gymnasium
import harness
import torch
from sample_factory.algo.sampling.simplified_sampling_api import SyncSamplingAPI
from sample_factory.algo.utils.context import global_model_factory
from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
from sample_factory.algo.utils.rl_utils import samples_per_trajectory
from sample_factory.algo.utils.torch_utils import calc_num_elements
from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
from sample_factory.envs.env_utils import register_env
from sample_factory.model.encoder import ConvEncoderImpl, Encoder
from sample_factory.model.model_utils import nonlinearity

# The benchmark conv net's layers (harness.make_conv_policy) in Sample Factory's [in, out, kernel, stride] form.
CONV_FILTERS = [[4, 8, 8, 4], [8, 16, 4, 2]]


def make_env(full_env_name: str, cfg: object = None, env_config: object = None,
             render_mode: str | None = None) -> gymnasium.Env:
    if full_env_name == harness.ATARI_ID:
        return harness.make_atari_env(full_env_name)
    return gymnasium.make(full_env_name, render_mode=render_mode)


class BenchmarkConvEncoder(Encoder):
    """Sample Factory's conv encoder implementation with the benchmark conv net's filters and no MLP after them."""

    def __init__(self, cfg: object, obs_space: gymnasium.spaces.Dict) -> None:
        super().__init__(cfg)
        shape = obs_space["obs"].shape
        self.enc = torch.jit.script(ConvEncoderImpl(shape, CONV_FILTERS, [], nonlinearity(cfg)))
        self.encoder_out_size = calc_num_elements(self.enc, shape)

    def get_out_size(self) -> int:
        return self.encoder_out_size

    def forward(self, obs_dict: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.enc(obs_dict["obs"])


def make_encoder(cfg: object, obs_space: gymnasium.spaces.Dict) -> Encoder:
    return BenchmarkConvEncoder(cfg, obs_space)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batched-sampling", action="store_true",
                        help="Sample Factory's batched sampling (one tensor per worker) instead of per-env sampling")


def measure(args: argparse.Namespace, envs_per_worker: int) -> harness.Measured:
    env_id = harness.WORKLOADS[args.workload]
    register_env(env_id, make_env)
    if args.workload == "atari":
        global_model_factory().register_encoder_factory(make_encoder)
        model = ["--nonlinearity=relu", "--obs_scale=255", "--normalize_input=False"]
    else:
        model = ["--encoder_mlp_layers", "64", "64", "--nonlinearity=tanh"]
    with tempfile.TemporaryDirectory(prefix="sf-peer-") as train_dir:
        argv = [f"--env={env_id}", "--experiment=peers", f"--train_dir={train_dir}", "--device=cpu",
                f"--num_workers={args.workers}", f"--num_envs_per_worker={envs_per_worker}",
                f"--rollout={args.rollout_steps}", "--use_rnn=False", *model,
                f"--batched_sampling={args.batched_sampling}", "--seed=0"]
        parser, _ = parse_sf_args(argv=argv)
        cfg = parse_full_cfg(parser, argv)
        env_info = obtain_env_info_in_a_separate_process(cfg)
        sampler = SyncSamplingAPI(cfg, env_info)
        sampler.start()

        def step() -> int:
            trajectory = sampler.get_trajectories_sync()
            if trajectory is None:
                raise RuntimeError("Sample Factory's sampler stopped")
            return int(samples_per_trajectory(trajectory))

        try:
            return harness.timed_window(step, args.seconds, args.warmup)
        finally:
            sampler.stop()


def package_versions() -> str:
    return harness.versions(sample_factory=importlib.metadata.version("sample-factory"),
                            gymnasium=gymnasium.__version__)


if __name__ == "__main__":
    logging.getLogger("sf").setLevel(logging.WARNING)
    harness.main("Sample Factory", "SyncSamplingAPI: W rollout workers + 1 inference worker, sampling only",
                 package_versions, measure, __doc__.split("\n\n")[0], extra=add_options,
                 workloads=("cartpole", "atari"))
