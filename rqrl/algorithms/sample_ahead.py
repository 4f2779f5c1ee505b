"""Sampling the next iteration while the learner trains on this one: a sampler's calls in a thread of their own.

A synchronous learner loop leaves the workers idle while it trains and itself idle while they sample. Here the
call for iteration k + 1 starts, with the weights the learner holds before its update k, as soon as batch k is in
hand: batch k + 1 is then one update old when the learner trains on it (a policy lag of 1). PPO's clipped
surrogate is taken against the log-probs the batch was sampled with (``agent_infos["log_prob"]``), so it stays a
trust region around the sampling policy.
"""

from __future__ import annotations

from typing import Any

import torch

from rqrl.engine.ahead import CallAhead


class SampleAhead:
    """``obtain_samples`` of a garage-style sampler, one call ahead of the learner (see the module's docstring)."""

    def __init__(self, sampler: Any, num_samples: int):
        self.sampler, self.num_samples = sampler, num_samples
        self._next: CallAhead[Any] = CallAhead("rqrl-sample-ahead", close_seconds=20.0)  # a whole iteration's call
        self.policy_lag = 0
        """Updates between the weights that sampled the last batch and the learner's when it got it."""

    def take(self, itr: int, weights: dict[str, torch.Tensor]) -> Any:
        """The batch for iteration ``itr`` (the call started last time, else one made now with ``weights``), and the
        call for ``itr + 1`` started with ``weights``, which the learner is about to update."""
        snapshot = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}
        if self._next.in_flight:
            batch, self.policy_lag = self._next.take(), 1
        else:
            batch, self.policy_lag = self.sampler.obtain_samples(itr, self.num_samples, snapshot), 0
        self._next.start(self.sampler.obtain_samples, itr + 1, self.num_samples, snapshot)
        return batch

    def close(self) -> None:
        """Wait up to 20 s for the call in flight (its batch is dropped; its error, if any, only logged), so the
        sampler shuts down with no call in it; a call that takes longer is left running (with a warning), and the
        shutdown, its jobs' 15 s wait included, still ends within the learner's 45 s watchdog."""
        self._next.close()
