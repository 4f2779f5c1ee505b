"""Env steps/s of Sample Factory's APPO sampler on CartPole-v1, sampling only (``SyncSamplingAPI``).

Sample Factory 2's sampling path without the learner, as in its ``sf_examples/sampler`` example: W rollout worker
processes with E envs each (``--num_workers W --num_envs_per_worker E``, double-buffered in
``--worker_num_splits 2`` halves, Sample Factory's default), one policy (inference) worker process that batches
their observations, ``--rollout 128``-step trajectories into shared buffers; this process counts the env steps of
every trajectory ``get_trajectories_sync`` hands back. No training runs, so the policy keeps its initial weights.
The model is Sample Factory's own actor-critic built to the benchmark's shape: an MLP encoder of 64-64 tanh
layers, no RNN, a linear action head over the 2 actions (plus the critic head Sample Factory always computes).

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
from sample_factory.algo.sampling.simplified_sampling_api import SyncSamplingAPI
from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
from sample_factory.algo.utils.rl_utils import samples_per_trajectory
from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
from sample_factory.envs.env_utils import register_env


def make_env(full_env_name: str, cfg: object = None, env_config: object = None,
             render_mode: str | None = None) -> gymnasium.Env:
    return gymnasium.make(full_env_name, render_mode=render_mode)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batched-sampling", action="store_true",
                        help="Sample Factory's batched sampling (one tensor per worker) instead of per-env sampling")


def measure(args: argparse.Namespace, envs_per_worker: int) -> tuple[int, float]:
    register_env(harness.ENV_ID, make_env)
    with tempfile.TemporaryDirectory(prefix="sf-peer-") as train_dir:
        argv = [f"--env={harness.ENV_ID}", "--experiment=peers", f"--train_dir={train_dir}", "--device=cpu",
                f"--num_workers={args.workers}", f"--num_envs_per_worker={envs_per_worker}",
                f"--rollout={args.rollout_steps}", "--use_rnn=False", "--encoder_mlp_layers", "64", "64",
                "--nonlinearity=tanh", f"--batched_sampling={args.batched_sampling}", "--seed=0"]
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
                 package_versions, measure, __doc__.split("\n\n")[0], extra=add_options)
