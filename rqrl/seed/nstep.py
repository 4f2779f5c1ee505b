"""n-step transitions of one env: sums of up to n discounted rewards, each with the discount its
bootstrap needs (``gamma**k`` for the k rewards actually summed, 0 after a termination).

The source collector bootstraps every transition with ``gamma`` instead of ``gamma**n`` and treats a
truncation (time limit, ``max_environment_steps``) as a termination; here a truncated episode's
transitions bootstrap from its last observation and only a terminated one's do not.

>>> collector = NStepCollector(n=2, gamma=0.5)
>>> collector.step(np.zeros(1), 0, None, 1.0, np.ones(1), None, terminated=False, truncated=False)
[]
>>> [t.reward for t in collector.step(np.ones(1), 1, None, 2.0, np.full(1, 2.0), None, False, False)]
[2.0]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from rqrl.errors import ConfigError


class Transition(NamedTuple):
    """One n-step transition: ``reward`` is the discounted sum, ``discount`` multiplies the bootstrap value
    of ``next_obs`` (``gamma**k``, or 0 after a termination); ``next_mask`` is its legal actions (None: all)."""

    obs: np.ndarray
    action: int
    reward: float
    discount: float
    next_obs: np.ndarray
    next_mask: np.ndarray | None


class TransitionBatch(NamedTuple):
    """Transitions stacked along a first axis: what travels to the learner and what the replay stores."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    discounts: np.ndarray
    next_obs: np.ndarray
    next_masks: np.ndarray

    @property
    def size(self) -> int:
        """Number of transitions (``len()`` of a NamedTuple counts its fields)."""
        return int(self.actions.shape[0])

    def uneven_lengths(self) -> dict[str, int] | None:
        """Each field's length where they differ (a field holds one row per transition), else None."""
        lengths = {name: len(field) for name, field in self._asdict().items()}
        return lengths if len(set(lengths.values())) > 1 else None


def obs_array(obs: Any) -> np.ndarray:
    """An observation as SEED sends and stores it: uint8 as it is (images: a quarter of float32's bytes on the wire
    and in the replay; networks still get float32, see Agent.train_step and InferenceServer), anything else float32.

    >>> obs_array([0.5, 1.0]).dtype, obs_array(np.zeros((4, 84, 84), np.uint8)).dtype
    (dtype('float32'), dtype('uint8'))
    """
    array = np.asarray(obs)
    return array if array.dtype == np.uint8 else array.astype(np.float32, copy=False)


def stack(transitions: Sequence[Transition], n_actions: int) -> TransitionBatch:
    """Stack transitions into a batch; a missing mask means every action is legal."""
    masks = [np.ones(n_actions, bool) if t.next_mask is None else np.asarray(t.next_mask, bool)
             for t in transitions]
    return TransitionBatch(
        obs=np.stack([obs_array(t.obs) for t in transitions]),
        actions=np.asarray([t.action for t in transitions], np.int64),
        rewards=np.asarray([t.reward for t in transitions], np.float32),
        discounts=np.asarray([t.discount for t in transitions], np.float32),
        next_obs=np.stack([obs_array(t.next_obs) for t in transitions]),
        next_masks=np.stack(masks),
    )


class NStepCollector:
    """Turns one env's steps into n-step transitions; call ``step`` after every env step."""

    def __init__(self, n: int, gamma: float):
        if not (isinstance(n, int) and n >= 1):
            raise ConfigError(f"expected n >= 1, got {n!r}")
        if not 0 <= gamma <= 1:
            raise ConfigError(f"expected 0 <= gamma <= 1, got {gamma!r}")
        self.n, self.gamma = n, gamma
        self._pending: deque[tuple[np.ndarray, int, float]] = deque()
        self._last: tuple[np.ndarray, np.ndarray | None] | None = None

    def __len__(self) -> int:
        """Steps waiting for enough rewards (fewer than n)."""
        return len(self._pending)

    def step(self, obs: np.ndarray, action: int, mask: np.ndarray | None, reward: float, next_obs: np.ndarray,
             next_mask: np.ndarray | None, terminated: bool, truncated: bool) -> list[Transition]:
        """Record one step (``mask``: legal actions at ``obs``, unused but for symmetry); returns the transitions
        it completes: the oldest pending one once n rewards are in, and every pending one at an episode's end."""
        del mask
        self._pending.append((np.asarray(obs), int(action), float(reward)))
        self._last = (np.asarray(next_obs), None if next_mask is None else np.asarray(next_mask, bool))
        if terminated or truncated:
            return self._flush(bootstrap=not terminated)
        if len(self._pending) == self.n:
            return [self._emit(bootstrap=True)]
        return []

    def flush(self) -> list[Transition]:
        """Every pending step as a transition bootstrapped from the last observation (the env is abandoned
        mid-episode, e.g. at shutdown); the collector is then empty."""
        return self._flush(bootstrap=True) if self._pending else []

    def clear(self) -> None:
        """Forget the pending steps (a new episode starts without flushing)."""
        self._pending.clear()
        self._last = None

    def _flush(self, bootstrap: bool) -> list[Transition]:
        transitions = [self._emit(bootstrap) for _ in range(len(self._pending))]
        self.clear()
        return transitions

    def _emit(self, bootstrap: bool) -> Transition:
        """The oldest pending step with the discounted sum of all pending rewards (k of them)."""
        assert self._last is not None
        rewards = [reward for _, _, reward in self._pending]
        total = sum(reward * self.gamma**index for index, reward in enumerate(rewards))
        obs, action, _ = self._pending.popleft()
        next_obs, next_mask = self._last
        discount = self.gamma ** len(rewards) if bootstrap else 0.0
        return Transition(obs, action, float(total), float(discount), next_obs, next_mask)
