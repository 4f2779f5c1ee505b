"""rqrl.algorithms.cnn: the Nature CNN's shapes, its pixel scaling, what it refuses, and torso_for's choice."""

from __future__ import annotations

import pytest
import torch

from rqrl.algorithms.cnn import FEATURES, NatureCNN, torso_for
from rqrl.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_layers_are_the_nature_papers():
    cnn = NatureCNN((4, 84, 84))
    convs = [layer for layer in cnn.convs if isinstance(layer, torch.nn.Conv2d)]
    assert [(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) for conv in convs] == [
        (4, 32, (8, 8), (4, 4)), (32, 64, (4, 4), (2, 2)), (64, 64, (3, 3), (1, 1))]
    assert (cnn.fc.in_features, cnn.fc.out_features) == (64 * 7 * 7, 512) and FEATURES == 512
    assert sum(parameter.numel() for parameter in cnn.parameters()) == 1_684_128


@pytest.mark.parametrize("leading", [(), (5,), (3, 2)])
def test_any_leading_axes_give_512_features_each(leading):
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    frames = torch.randint(0, 256, (*leading, 4, 84, 84), dtype=torch.uint8)
    features = cnn(frames)
    assert features.shape == (*leading, 512) and features.dtype == torch.float32
    assert (features >= 0).all()  # a ReLU last
    if leading == (3, 2):  # time-major [T, B]: each image on its own
        assert torch.allclose(features[1, 0], cnn(frames[1, 0]), atol=1e-5)


def test_pixels_are_scaled_inside_so_uint8_and_float_frames_agree():
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert torch.allclose(cnn(frames), cnn(frames.float()), atol=1e-6)
    first = cnn.convs[0]
    with torch.no_grad():  # the first layer sees pixels / 255: a white frame is all ones
        expected = first(torch.ones(1, 4, 84, 84))
        assert torch.allclose(first(torch.full((1, 4, 84, 84), 255, dtype=torch.uint8).float() / 255), expected)


def test_other_image_sizes_fit_and_too_small_or_channels_last_ones_are_refused():
    assert NatureCNN((3, 36, 40))(torch.zeros(1, 3, 36, 40)).shape == (1, 512)
    with pytest.raises(ConfigError, match=r"channels-first images \(C, H, W\) of at least 36x36 pixels, got "
                                          r"observations of shape \(84, 84, 3\)"):
        NatureCNN((84, 84, 3))
    with pytest.raises(ConfigError, match="got observations of shape"):
        NatureCNN((84, 84))


def test_torso_for_takes_the_cnn_for_images_only():
    torso, size = torso_for((4, 84, 84))
    assert isinstance(torso, NatureCNN) and size == 512
    assert torso_for((7,)) == (None, 7) and torso_for(7) == (None, 7)
    with pytest.raises(ConfigError, match=r"a vector's size \(n,\) or an image's shape \(C, H, W\), got \(2, 3\)"):
        torso_for((2, 3))
