"""PPO with the learner on a GPU and the sampler's workers on the CPU (skipped where there is none)."""

from __future__ import annotations

import json

import pytest
import torch

from rqrl.algorithms.checkpoint import load_checkpoint
from rqrl.algorithms.ppo import PpoConfig, train
from tests import fixtures  # noqa: F401 - registers RqrlGuessSign-v0

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_cuda_learner_trains_on_cpu_workers_and_resumes(tmp_path):
    config = PpoConfig(env_id="tests.fixtures:RqrlGuessSign-v0", total_env_steps=3_000, num_samples=500,
                       minibatch_size=100, epochs=2, workers=1, learner_device="cuda", run_dir=str(tmp_path),
                       run_name="ppo-cuda", progress=False)
    first = train(config)
    assert first.updates >= 6 and first.env_steps >= 3_000
    checkpoint = load_checkpoint(tmp_path / "ppo-cuda" / "checkpoint.safetensors")
    assert all(value.device.type == "cpu" for value in checkpoint.model.values())  # portable to a CPU learner
    resumed = train(PpoConfig(**{**vars(config), "total_env_steps": 4_500, "resume": str(tmp_path / "ppo-cuda")}))
    assert resumed.updates > first.updates and resumed.env_steps >= 4_500
    summary = json.loads((tmp_path / "ppo-cuda" / "summary.json").read_text())
    assert summary["updates"] == resumed.updates
