"""The learner's replay: a ring of n-step transitions in host memory, sampled uniformly or by priority.

Prioritized sampling (Schaul et al. 2016) draws transition i with probability ``p_i**alpha / sum p**alpha``
from a sum tree (O(log capacity) per draw, vectorised over the batch) and weighs its loss by
``(N * P(i))**-beta / max_j (N * P(j))**-beta``; new transitions get the largest priority seen so far.
Image observations are kept as their unique frames (``frame_store``): an Atari transition takes ~7 KB, not 56.

>>> buffer = ReplayBuffer(capacity=4, obs_shape=(1,), n_actions=2, prioritized=False, seed=0)
>>> len(buffer)
0
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rqrl.errors import ConfigError
from rqrl.seed.frame_store import TransitionFrames, observation_store
from rqrl.seed.nstep import TransitionBatch


class SumTree:
    """Binary tree over ``capacity`` non-negative leaves whose nodes hold their subtree's sum."""

    def __init__(self, capacity: int):
        self.size = 1
        while self.size < capacity:
            self.size *= 2
        self.nodes = np.zeros(2 * self.size, np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def leaves(self, indices: np.ndarray) -> np.ndarray:
        return self.nodes[self.size + indices]

    def set(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves (a later duplicate index wins) and update their ancestors."""
        nodes = np.unique(self.size + np.asarray(indices, np.int64))
        self.nodes[self.size + np.asarray(indices, np.int64)] = values
        while nodes[0] > 1:
            nodes = np.unique(nodes // 2)
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Leaf index of each target prefix sum in [0, total)."""
        nodes = np.ones(len(targets), np.int64)
        targets = np.array(targets, np.float64)
        while nodes[0] < self.size:
            left = 2 * nodes
            go_right = targets >= self.nodes[left]
            targets = np.where(go_right, targets - self.nodes[left], targets)
            nodes = np.where(go_right, left + 1, left)
        return nodes - self.size


class ReplayBuffer:
    """``capacity`` transitions; the oldest are overwritten once full."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], n_actions: int, prioritized: bool = True,
                 alpha: float = 0.6, seed: int | None = None, obs_dtype: np.dtype[Any] | type = np.float32):
        if not (isinstance(capacity, int) and capacity >= 1):
            raise ConfigError(f"expected replay capacity >= 1, got {capacity!r}")
        self.capacity, self.prioritized, self.alpha = capacity, prioritized, alpha
        self.obs_shape = tuple(obs_shape)
        self.observations = observation_store(capacity, self.obs_shape, obs_dtype)  # uint8 images: unique frames
        self.actions = np.zeros(capacity, np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.discounts = np.zeros(capacity, np.float32)
        self.next_masks = np.ones((capacity, n_actions), bool)
        self.tree = SumTree(capacity) if prioritized else None
        self.max_priority = 1.0
        self.random = np.random.default_rng(seed)
        self.cursor = 0
        self.count = 0
        self.added = 0  # transitions ever added

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        """Bytes the stored transitions take, priorities included (image frames: the pool's slots handed out so
        far, with their bookkeeping)."""
        arrays = (self.actions, self.rewards, self.discounts, self.next_masks)
        tree = 0 if self.tree is None else self.tree.nodes.nbytes
        return self.observations.nbytes + sum(array.nbytes for array in arrays) + tree

    def add(self, batch: TransitionBatch, priorities: np.ndarray | None = None,
            frames: TransitionFrames | None = None) -> None:
        """Store ``batch`` (a batch larger than the capacity keeps its last ``capacity`` transitions); without
        ``priorities`` (or where they are NaN) new transitions get the largest priority seen. ``frames``: the
        batch's observations as a message's distinct frames (rqrl.seed.frame_store.TransitionFrames), if it has
        them."""
        size = batch.size
        if lengths := batch.uneven_lengths():
            raise ConfigError(f"a transition batch's fields differ in length ({lengths}): each holds one row per "
                              f"transition")
        if size == 0:
            return
        for name, held in (("obs", self.obs_shape), ("next_obs", self.obs_shape),
                           ("next_masks", self.next_masks.shape[1:])):
            given = getattr(batch, name).shape[1:]
            if given != held:
                raise ConfigError(f"transitions with {name} of shape {given} do not fit the replay's {held}; "
                                  f"set AgentConfig.state_shape and action_space_size to the env's")
        if self.observations.dtype == np.uint8 and not (batch.obs.dtype == batch.next_obs.dtype == np.uint8):
            raise ConfigError(f"transitions with {batch.obs.dtype} observations do not fit a uint8 replay (for "
                              f"images); set AgentConfig.state_dtype to 'float32' for this env")
        start = max(0, size - self.capacity)
        indices = (self.cursor + np.arange(size - start)) % self.capacity
        self.observations.put(indices, batch.obs[start:], batch.next_obs[start:],
                              None if frames is None else frames.tail(start))
        self.actions[indices] = batch.actions[start:]
        self.rewards[indices] = batch.rewards[start:]
        self.discounts[indices] = batch.discounts[start:]
        self.next_masks[indices] = batch.next_masks[start:]
        if self.tree is not None:
            values = np.full(len(indices), self.max_priority)
            if priorities is not None:
                given = np.asarray(priorities, np.float64)[start:]
                values = np.where(np.isnan(given), self.max_priority, given)
            self.update_priorities(indices, values)
        self.cursor = int((self.cursor + len(indices)) % self.capacity)
        self.count = min(self.capacity, self.count + len(indices))
        self.added += size

    def sample(self, batch_size: int, beta: float = 1.0) -> tuple[TransitionBatch, np.ndarray, np.ndarray]:
        """``(batch, indices, importance weights)``; weights are all 1 when sampling uniformly."""
        if self.count == 0:
            raise ConfigError("cannot sample from an empty replay; wait for minimum_buffer_size transitions")
        if self.tree is None:
            indices = self.random.integers(0, self.count, batch_size)
            weights = np.ones(batch_size, np.float32)
        else:
            total = self.tree.total
            segment = total / batch_size
            targets = (np.arange(batch_size) + self.random.random(batch_size)) * segment
            indices = np.minimum(self.tree.find(np.minimum(targets, np.nextafter(total, 0))), self.count - 1)
            probabilities = self.tree.leaves(indices) / total
            weights64 = (self.count * np.maximum(probabilities, 1e-12)) ** -beta
            weights = (weights64 / weights64.max()).astype(np.float32)
        obs, next_obs = self.observations.get(indices)
        batch = TransitionBatch(obs, self.actions[indices], self.rewards[indices], self.discounts[indices], next_obs,
                                self.next_masks[indices])
        return batch, indices, weights

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities (e.g. |TD error|) of sampled transitions; no-op for a uniform replay."""
        if self.tree is None:
            return
        priorities = np.maximum(np.asarray(priorities, np.float64), 1e-6)
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.set(np.asarray(indices, np.int64), priorities**self.alpha)
