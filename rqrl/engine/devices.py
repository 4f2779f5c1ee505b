"""Whether torch can use a device here, said before anything starts: a CUDA device on a machine or torch build
without one fails deep inside torch (``AssertionError: Torch not compiled with CUDA enabled``) otherwise."""

from __future__ import annotations

from typing import Any

from rqrl.errors import ConfigError


def check_device(setting: str, device: Any) -> None:
    """ConfigError in one line for a ``device`` torch cannot use on this machine (``setting`` names where it was
    given: a flag such as ``--learner-device`` or an argument such as ``inference_device``)."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"{setting} {str(device)!r} is no torch device ({error}): use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{setting} {str(device)!r}: this torch ({torch.__version__}) sees no CUDA device; use "
                          f"{setting} cpu, or a CUDA build of torch on a machine with a GPU")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(f"{setting} {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
