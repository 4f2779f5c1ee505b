"""Observation trees: a numpy (or torch) array, or a dict of observation trees, as gymnasium's
Box, Discrete and (nested) Dict spaces produce them; numpy and torch only.

Every walker over such trees is built on ``map_tree``:

>>> import numpy as np
>>> stack_obs([{"pos": np.zeros(2), "goal": 1}, {"pos": np.ones(2), "goal": 2}])["goal"]
array([1, 2])
>>> flatten_obs({"pos": np.zeros(2), "state": {"goal": np.int64(1)}}, "obs").keys()
dict_keys(['obs/pos', 'obs/state/goal'])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rqrl.engine.stack_gather import gather_series_to
from rqrl.errors import RecordError

Obs = np.ndarray | dict[str, "Obs"]
TensorObs = torch.Tensor | dict[str, "TensorObs"]

__all__ = [
    "Obs",
    "TensorObs",
    "concat_to",
    "empty_like_batch",
    "flatten_obs",
    "map_tree",
    "select",
    "stack_obs",
    "stack_to",
    "to_array",
    "to_tensor",
    "unflatten_obs",
]


def map_tree(fn: Callable[..., Any], *trees: Any) -> Any:
    """``fn`` applied to the leaves of trees of one structure, leaf by leaf; dicts stay dicts.

    The keys are those of the first tree (in its order); every other tree must have them too.
    """
    first = trees[0]
    if isinstance(first, Mapping):
        return {key: map_tree(fn, *(tree[key] for tree in trees)) for key in first}
    return fn(*trees)


def to_array(obs: Any) -> Obs:
    """One env observation as numpy (a Discrete int becomes a 0-d array)."""
    return map_tree(np.asarray, obs)


def to_tensor(obs: Obs) -> TensorObs:
    """A numpy tree as torch tensors sharing its memory."""
    return map_tree(torch.from_numpy, obs)


def stack_obs(observations: Sequence[Obs]) -> Obs:
    """Observations of one structure stacked along a new leading axis."""
    return map_tree(_stack_leaves, *observations)


def select(obs: Obs, index: Any) -> Obs:
    """``obs[index]`` through dicts."""
    return map_tree(lambda array: array[index], obs)


def empty_like_batch(example: Obs) -> Obs:
    """A zero-length batch with the shape and dtype of one observation."""
    return map_tree(lambda array: np.zeros((0, *array.shape), dtype=array.dtype), example)


def stack_to(values: Sequence[Obs], axis: int, device: torch.device | str) -> TensorObs:
    """Numpy trees stacked along a new ``axis`` as tensors on ``device``. Rollouts of frame stacks stacked
    time-major (``axis`` 1) onto an accelerator go as their frames and are gathered there
    (``rqrl.engine.stack_gather``)."""
    on_accelerator = torch.device(device).type != "cpu"

    def stack(*arrays: np.ndarray) -> torch.Tensor:
        gathered = gather_series_to(arrays, device) if axis == 1 and on_accelerator else None
        return torch.from_numpy(np.stack(arrays, axis=axis)).to(device) if gathered is None else gathered

    return map_tree(stack, *values)


def concat_to(values: Sequence[Obs], device: torch.device | str) -> TensorObs:
    """Numpy trees concatenated along their first axis as tensors on ``device``."""
    return map_tree(lambda *arrays: torch.from_numpy(np.concatenate(arrays, axis=0)).to(device), *values)


def flatten_obs(obs: Obs, prefix: str) -> dict[str, np.ndarray]:
    """``{"obs": a}`` or ``{"obs/key/sub": a, ...}`` for (nested) dict observations: the wire form."""
    if isinstance(obs, Mapping):
        flat: dict[str, np.ndarray] = {}
        for key, value in obs.items():
            if "/" in str(key):
                raise RecordError(f"observation key {key!r} must not contain '/'")
            flat.update(flatten_obs(value, f"{prefix}/{key}"))
        return flat
    return {prefix: np.asarray(obs)}


def unflatten_obs(arrays: Mapping[str, np.ndarray], prefix: str) -> Obs:
    """Inverse of flatten_obs for the arrays under ``prefix`` (dict keys come back sorted)."""
    if prefix in arrays:
        return arrays[prefix]
    nested: dict[str, Obs] = {}
    head = prefix + "/"
    children = sorted({name[len(head):].split("/")[0] for name in arrays if name.startswith(head)})
    if not children:
        raise RecordError(f"record has no {prefix!r} arrays")
    for child in children:
        nested[child] = unflatten_obs(arrays, head + child)
    return nested


def _stack_leaves(*arrays: np.ndarray) -> np.ndarray:
    return np.stack(arrays)
