"""check_device: a device torch cannot use here is one ConfigError line naming where it was given."""

from __future__ import annotations

import pytest
import torch

from rqrl.engine.devices import check_device
from rqrl.errors import ConfigError


def test_a_cuda_device_without_cuda_is_one_line_naming_the_flag():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="--learner-device 'cuda': this torch .* sees no CUDA device"):
        check_device("--learner-device", "cuda")
    with pytest.raises(ConfigError, match="is no torch device"):
        check_device("--learner-device", "gpu")
    check_device("--learner-device", "cpu")


def test_the_seed_trainer_refuses_an_inference_device_it_cannot_use_before_starting_anything():
    """It started five inference servers that each died on `Torch not compiled with CUDA enabled`, then blamed the
    __main__ guard."""
    from rqrl.seed.agent import AgentConfig
    from rqrl.seed.config import Config
    from rqrl.seed.trainer import Trainer
    from tests.seed_fixtures import cartpole_agent, make_cartpole

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="inference_device 'cuda': this torch .* sees no CUDA device"):
        Trainer(cartpole_agent(), Config(inference_device="cuda"), make_cartpole)
    Trainer(cartpole_agent(), Config(inference_device="cuda", queue_name="q", redis_url="redis://127.0.0.1:1/0"),
            make_cartpole)  # servers on workers elsewhere: their devices are theirs
    with pytest.raises(ConfigError, match="network_device 'cuda:0': this torch"):
        AgentConfig(state_shape=(4,), action_space_size=2, network_device="cuda:0")
