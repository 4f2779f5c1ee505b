"""DQN through the SEED trainer with the learner and the inference server on a GPU (skipped where there is none)."""

from __future__ import annotations

import json

import pytest
import torch

from rqrl.algorithms.dqn import DqnConfig, load_q_model, train
from tests import fixtures  # noqa: F401 - registers RqrlGuessSign-v0

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("distributional", [False, True])
def test_cuda_learner_and_inference_server_train_and_the_weights_load_on_the_cpu(tmp_path, distributional):
    config = DqnConfig(env_id="tests.fixtures:RqrlGuessSign-v0", seconds=60, minimum_buffer_size=200,
                       target_return=1000, total_env_steps=4_000, learner_device="cuda", inference_device="cuda",
                       distributional=distributional, v_max=25.0, run_dir=str(tmp_path), run_name="dqn-cuda",
                       progress=False)
    result = train(config)
    assert result.env_steps >= 4_000 and result.updates > 0, result
    summary = json.loads((tmp_path / "dqn-cuda" / "summary.json").read_text())
    assert summary["updates"] == result.updates
    model, metadata = load_q_model(tmp_path / "dqn-cuda")
    assert next(model.parameters()).device.type == "cpu" and metadata["distributional"] == distributional
    assert model(torch.zeros(1, 2)).shape[-1] == 2
