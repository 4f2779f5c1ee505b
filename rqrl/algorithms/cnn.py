"""The Nature-DQN CNN (Mnih et al. 2015, "Human-level control through deep reinforcement learning", Methods), the
torso under the heads of IMPALA's and PPO's ActorCritic and DQN's QNetwork when observations are images: a uint8
Box ``(C, H, W)`` (rqrl.algorithms.common.is_image), such as Atari's 4 stacked 84x84 frames (rqrl.algorithms.atari).

>>> torso, size = torso_for((4, 84, 84))
>>> size, tuple(torso(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape)
(512, (2, 512))
>>> torso_for((4,))
(None, 4)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from rqrl.errors import ConfigError

FEATURES = 512
"""Width of the CNN's fully connected layer: the size of the features the heads read."""
MIN_SIDE = 36
"""The smallest height and width the three convolutions leave at least one pixel of."""


class NatureCNN(nn.Module):
    """conv 32 8x8 stride 4, conv 64 4x4 stride 2, conv 64 3x3 stride 1, a 512-unit layer, a ReLU after each.
    Pixels (0..255, uint8 or float) are scaled by 1/255 inside, so uint8 observations travel and are stored as
    they are; any leading axes: ``(..., C, H, W) -> (..., 512)``. Orthogonal init (gain sqrt 2), zero biases."""

    def __init__(self, obs_shape: Sequence[int]):
        super().__init__()
        shape = tuple(int(size) for size in obs_shape)
        if len(shape) != 3 or min(shape[1:]) < MIN_SIDE or shape[0] < 1:
            raise ConfigError(f"the Nature CNN takes channels-first images (C, H, W) of at least {MIN_SIDE}x{MIN_SIDE} "
                              f"pixels, got observations of shape {shape}")
        channels, height, width = shape
        self.obs_shape = shape
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten())
        with torch.no_grad():
            flat = int(self.convs(torch.zeros(1, channels, height, width)).shape[1])  # 3136 for 84x84
        self.fc = nn.Linear(flat, FEATURES)
        for layer in (*self.convs, self.fc):
            if isinstance(layer, nn.Conv2d | nn.Linear) and layer.bias is not None:
                nn.init.orthogonal_(layer.weight, math.sqrt(2))
                nn.init.zeros_(layer.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        leading = obs.shape[:-3]
        pixels = obs.reshape(-1, *obs.shape[-3:]).float() / 255.0
        return torch.relu(self.fc(self.convs(pixels))).reshape(*leading, FEATURES)


def torso_for(obs_shape: int | Sequence[int]) -> tuple[NatureCNN | None, int]:
    """``(NatureCNN, 512)`` for an image shape ``(C, H, W)``, ``(None, n)`` for a vector's ``n`` or ``(n,)``: what a
    network's heads sit on, and the size of what they read."""
    shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(int(size) for size in obs_shape)
    if len(shape) == 3:
        return NatureCNN(shape), FEATURES
    if len(shape) != 1:
        raise ConfigError(f"expected a vector's size (n,) or an image's shape (C, H, W), got {shape}")
    return None, shape[0]
