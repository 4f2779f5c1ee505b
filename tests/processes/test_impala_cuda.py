"""IMPALA with the learner on a GPU (skipped where there is none)."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from rqrl.algorithms.common import make_flat_env
from rqrl.algorithms.impala import ActorCritic, ImpalaConfig, train
from rqrl.maze.serial import SerialDistributedActors

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_serial_actors_with_a_cuda_learner(tmp_path):
    config = ImpalaConfig(total_env_steps=4096, n_actors=8, batch_size=8, learner_device="cuda", run_dir=str(tmp_path),
                          run_name="cuda-serial", progress=False)
    actors = SerialDistributedActors(functools.partial(make_flat_env, "CartPole-v1"), ActorCritic(4, 2, 64),
                                     config.n_rollout_steps, 8, 8)
    result = train(config, actors=actors)
    assert result.env_steps >= 4096
    assert (tmp_path / "cuda-serial" / "final.safetensors").is_file()


def test_distributed_actors_on_cpu_workers_with_a_cuda_learner(tmp_path):
    config = ImpalaConfig(total_env_steps=20_000, learner_device="cuda", workers=1, run_dir=str(tmp_path),
                          run_name="cuda-redis", progress=False)
    result = train(config)
    summary = json.loads((tmp_path / "cuda-redis" / "summary.json").read_text())
    assert result.updates > 0 and summary["env_steps"] >= 20_000
