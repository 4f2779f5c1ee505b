"""Several logical workers' episodes stepped together, with one batched policy forward per step.

The sampler's job (``rqrl.garage.jobs``) runs a group this way when its agents are ModuleAgents sampling in
numpy from the same weights (``lockstep_ready``): each step, one ``lanes``-row forward gives every running
worker's logits in its own row (``rqrl.garage.worker.LANES``), and each worker draws its action from its own
seeded numpy Generator, so every episode is bit-identical to the one ``LogicalWorker.rollout()`` gives, however
the workers are grouped. A worker that finishes an episode starts its next while the others go on.

Global RNGs: a rollout swaps each worker's private ``random``/``np.random``/torch global states in, which costs
more than a CartPole step, so a Lockstep does not; instead ``globals_untouched()`` says whether anything drew
from the process's global streams since it began, and the job falls back to rollouts (re-running the episodes
in flight) when something did. Envs that draw from their own ``np_random``, as gymnasium's do, never do.
Knows nothing of Redis. It drives a LogicalWorker's step machinery directly (``_start_episode``,
``_step_with``, ``_clear_episode``): the same code ``rollout()`` runs, without the RNG swaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
import torch

from rqrl.garage.worker import (
    LaneDistribution,
    LogicalWorker,
    ModuleAgent,
    global_rng_states,
    set_global_rng_states,
)

_TRAINING_SENSITIVE = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)


def lockstep_ready(workers: Sequence[LogicalWorker]) -> bool:
    """Whether ``workers`` (with their updates applied) can be stepped together: ModuleAgents that sample in
    numpy after a CPU forward, with equal weights and lanes, a module with no dropout or batch norm in training
    mode, and Box observation spaces."""
    if not workers:
        return False
    first = workers[0].agent
    if type(first) is not ModuleAgent:
        return False
    params = first.module.state_dict()
    for worker in workers:
        agent, env = worker.agent, worker.env
        if type(agent) is not ModuleAgent or env is None or agent.lanes != first.lanes \
                or not isinstance(env.observation_space, gymnasium.spaces.Box):
            return False
        agent.bind(env.action_space)
        if not agent.numpy_sampling or any(m.training and isinstance(m, _TRAINING_SENSITIVE)
                                           for m in agent.module.modules()):
            return False
        if agent is not first and not _equal_params(params, agent.module.state_dict()):
            return False
    return True


def _equal_params(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    return left.keys() == right.keys() and all(
        left[key].shape == right[key].shape and left[key].dtype == right[key].dtype and torch.equal(left[key],
                                                                                                    right[key])
        for key in left)


class Lockstep:
    """Steps the episodes of ``lockstep_ready`` workers together; see the module docstring."""

    def __init__(self, workers: Sequence[LogicalWorker]):
        self._agent: ModuleAgent = workers[0].agent
        self._workers = list(workers)
        self.running: dict[int, LogicalWorker] = {}
        self.current: int | None = None
        """The worker being started or stepped (named in a failure report)."""
        self._globals = global_rng_states()

    def begin(self, worker: LogicalWorker) -> None:
        """Start ``worker``'s next episode (reseed it first for a reproducible one)."""
        self.current = worker.worker_number
        worker._start_episode()
        self.running[worker.worker_number] = worker

    def step(self) -> list[LogicalWorker]:
        """One step of every running worker; returns those whose episode ended (in worker order), no longer
        running: ``collect_episode()`` them."""
        pending = sorted(self.running.values(), key=lambda worker: worker.worker_number)
        finished = []
        while pending:  # workers sharing a lane (more than ``lanes`` of them) go into separate forwards
            rows: dict[int, np.ndarray] = {}
            batch: list[LogicalWorker] = []
            later: list[LogicalWorker] = []
            for worker in pending:
                slot = worker.agent.slot
                (later if slot in rows else batch).append(worker)
                rows.setdefault(slot, worker._prev_obs)
            lanes = LaneDistribution(self._agent.lane_logits(rows))
            for worker in batch:
                self.current = worker.worker_number
                if worker._step_with(*worker.agent.sample(lanes)):
                    finished.append(worker)
                    del self.running[worker.worker_number]
            pending = later
        return sorted(finished, key=lambda worker: worker.worker_number)

    def globals_untouched(self) -> bool:
        """Whether the process's global RNG streams are as they were when this Lockstep began."""
        return _same_states(self._globals, global_rng_states())

    def abandon(self) -> list[int]:
        """Drop the episodes in flight and those finished but not collected; returns the running workers'
        numbers. Every worker is left between episodes, ready for updates."""
        dropped = sorted(self.running)
        for worker in self._workers:
            worker._clear_episode()
        self.running.clear()
        return dropped

    def close(self) -> None:
        """Put the process's global RNG streams back as they were when this Lockstep began."""
        if not self.globals_untouched():
            set_global_rng_states(self._globals)


def _same_states(left: tuple[Any, Any, torch.Tensor], right: tuple[Any, Any, torch.Tensor]) -> bool:
    (random_left, numpy_left, torch_left), (random_right, numpy_right, torch_right) = left, right
    return random_left == random_right and torch.equal(torch_left, torch_right) and len(numpy_left) == len(
        numpy_right) and all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                             for a, b in zip(numpy_left, numpy_right, strict=True))
