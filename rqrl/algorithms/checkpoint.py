"""Weights and training checkpoints as safetensors files: loading them never unpickles anything.

A checkpoint holds the model's tensors under ``model.``, the optimizer's per-parameter state under
``optimizer.state.{index}.{name}``, and everything else (optimizer param groups, counters, config)
as JSON in the safetensors metadata.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from rqrl.errors import CheckpointError, ConfigError


def _read_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status): os.umask can only
    read it by setting it, process-wide, and a file another thread creates meanwhile would get the wrong mode."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere (macOS): set and restore at once, at import, before the learner's threads
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_read_umask()
"""The mode a new file of this process gets (0o644 under the usual umask 022): safetensors writes through a private
temporary file (0o600), which another user of a shared run folder could not read."""


def write_error(path: Path, error: BaseException, kept: str, *, run_dir: Path | None = None,
                resume: bool = True) -> CheckpointError:
    """The CheckpointError of a run file that could not be written (a full or read-only disk): it names ``path``,
    the system's reason, what is ``kept`` on disk, and the fix; with ``resume``, how to go on with the run after,
    where ``run_dir`` (default: the file's folder) is a run folder (it has config.json).

    >>> import errno
    >>> str(write_error(Path("/x/metrics.csv"), OSError(errno.ENOSPC, "No space left on device"), "rows stay"))
    'cannot write /x/metrics.csv: No space left on device; rows stay. Free space on that disk (or make /x writable)'
    """
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    run_dir = path.parent if run_dir is None else run_dir
    then = (f", then resume the run with `rqrl train --resume {run_dir}`"
            if resume and (run_dir / "config.json").is_file() else "")
    return CheckpointError(f"cannot write {path}: {reason}; {kept}. Free space on that disk (or make "
                           f"{path.parent} writable){then}")


def _write_atomically(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write a temporary file, then rename it over ``path``: a save that fails (a full or read-only disk) or is
    killed leaves the earlier file whole. CheckpointError naming the file, the system's reason and the fix. The file
    gets FILE_MODE, as every other file of the run folder."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()},
                                    str(temporary), metadata=metadata)
        with contextlib.suppress(OSError):  # best effort: NFS with root_squash, FUSE or CIFS may refuse it
            os.chmod(temporary, FILE_MODE)
        os.replace(temporary, path)
    except (OSError, safetensors.SafetensorError) as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        kept = f"the {path.name} written before stays" if path.is_file() else f"no {path.name} was written"
        raise write_error(path, error, kept) from error


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


def recorded_mean_return(path: str | Path) -> float | None:
    """The mean return a weights file (best.safetensors) records: None if there is no file, it cannot be read, or
    its figure is no finite number (an older learner's NaN best)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            value = json.loads((handle.metadata() or {}).get("rqrl", "{}")).get("mean_return")
    except (OSError, ValueError, AttributeError, safetensors.SafetensorError):
        return None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def load_into(module: torch.nn.Module | torch.optim.Optimizer, state: Mapping[str, Any], path: str | Path,
              fix: str) -> None:
    """``module.load_state_dict(state)``; ConfigError naming ``path`` and ``fix`` if the state does not fit (another
    network size, another algorithm's checkpoint) instead of torch's size-mismatch traceback."""
    try:
        module.load_state_dict(state)  # type: ignore[arg-type]
    except (RuntimeError, ValueError, KeyError) as error:
        first = str(error).strip().splitlines()[0:3]
        raise ConfigError(f"{path} does not fit this {type(module).__name__} ({' '.join(first)}): {fix}") from error


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
