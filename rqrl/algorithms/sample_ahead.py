"""Sampling the next iteration while the learner trains on this one: a sampler's calls in a thread of their own.

A synchronous learner loop leaves the workers idle while it trains and itself idle while they sample. Here the
call for iteration k + 1 starts, with the weights the learner holds before its update k, as soon as batch k is in
hand: batch k + 1 is then one update old when the learner trains on it (a policy lag of 1). PPO's clipped
surrogate is taken against the log-probs the batch was sampled with (``agent_infos["log_prob"]``), so it stays a
trust region around the sampling policy.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


class SampleAhead:
    """``obtain_samples`` of a garage-style sampler, one call ahead of the learner (see the module's docstring)."""

    def __init__(self, sampler: Any, num_samples: int):
        self.sampler, self.num_samples = sampler, num_samples
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rqrl-sample-ahead")
        self._next: concurrent.futures.Future[Any] | None = None
        self.policy_lag = 0
        """Updates between the weights that sampled the last batch and the learner's when it got it."""

    def take(self, itr: int, weights: dict[str, torch.Tensor]) -> Any:
        """The batch for iteration ``itr`` (the call started last time, else one made now with ``weights``), and the
        call for ``itr + 1`` started with ``weights``, which the learner is about to update."""
        snapshot = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}
        if self._next is None:
            batch, self.policy_lag = self.sampler.obtain_samples(itr, self.num_samples, snapshot), 0
        else:
            batch, self.policy_lag = self._next.result(), 1
        self._next = self._pool.submit(self.sampler.obtain_samples, itr + 1, self.num_samples, snapshot)
        return batch

    def close(self) -> None:
        """Wait for the call in flight (its batch is dropped; its error, if any, only logged): the sampler may then
        shut down with no call in it."""
        if self._next is not None:
            try:
                self._next.result()
            except Exception as error:  # the run is ending; the learner's own error, if any, is the one to raise
                log.debug("the sampling call in flight at the end failed: %s", error)
            self._next = None
        self._pool.shutdown(wait=True)
