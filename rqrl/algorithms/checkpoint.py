"""Weights and training checkpoints as safetensors files: loading them never unpickles anything.

A checkpoint holds the model's tensors under ``model.``, the optimizer's per-parameter state under
``optimizer.state.{index}.{name}``, and everything else (optimizer param groups, counters, config)
as JSON in the safetensors metadata.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from rqrl.errors import CheckpointError, ConfigError


def _write_atomically(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    safetensors.torch.save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
                                str(temporary), metadata=metadata)
    os.replace(temporary, path)


def save_weights(path: str | Path, state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, Any]) -> None:
    """Write a state dict (e.g. final or best weights) with JSON-able metadata."""
    _write_atomically(Path(path), dict(state_dict), {"rqrl": json.dumps(dict(metadata))})


def load_weights(path: str | Path, device: str = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read what save_weights wrote: ``(state_dict, metadata)``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}")
    try:
        with safetensors.safe_open(str(path), framework="pt", device=device) as handle:
            metadata = json.loads((handle.metadata() or {}).get("rqrl", "{}"))
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except (OSError, ValueError, safetensors.SafetensorError) as error:
        raise CheckpointError(f"cannot read weights file {path}: {error}") from error
    return tensors, metadata


def weights_file(path: str | Path) -> Path:
    """The weights file of a run folder (best, else final), or ``path`` itself if it is a file."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = [candidate for candidate in (path / "best.safetensors", path / "final.safetensors") if candidate.is_file()]
    if not found:
        raise ConfigError(f"{path} holds no best.safetensors or final.safetensors; is it a run folder?")
    return found[0]


@dataclass
class TrainingState:
    """Everything --resume needs: model, optimizer and the counters of the run."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    counters: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: str | Path, state: TrainingState) -> None:
    tensors = {f"model.{key}": value for key, value in state.model.items()}
    for index, parameter_state in state.optimizer.get("state", {}).items():
        for name, value in parameter_state.items():
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            tensors[f"optimizer.state.{index}.{name}"] = value
    metadata = {
        "rqrl": json.dumps({"counters": state.counters, "param_groups": state.optimizer.get("param_groups", [])})
    }
    _write_atomically(Path(path), tensors, metadata)


def load_checkpoint(path: str | Path, device: str = "cpu") -> TrainingState:
    tensors, raw = _read_raw(Path(path), device)
    model = {key[len("model."):]: value for key, value in tensors.items() if key.startswith("model.")}
    optimizer_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer.state."):
            index, name = key[len("optimizer.state."):].split(".", 1)
            optimizer_state.setdefault(int(index), {})[name] = value
    optimizer = {"state": optimizer_state, "param_groups": raw.get("param_groups", [])}
    return TrainingState(model=model, optimizer=optimizer, counters=raw.get("counters", {}))


def _read_raw(path: Path, device: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, metadata = load_weights(path, device)
    if "counters" not in metadata:
        raise CheckpointError(f"{path} is a weights file, not a training checkpoint")
    return tensors, metadata
