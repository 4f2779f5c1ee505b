"""SampleAhead: the next iteration's sampling call runs while the learner trains, with the weights it held."""

from __future__ import annotations

import threading

import pytest
import torch

from rqrl.algorithms.sample_ahead import SampleAhead


class RecordingSampler:
    """Returns, as its batch, the iteration and the weight it was called with; call ``itr`` waits for ``gate``."""

    def __init__(self, fail_from: int | None = None):
        self.calls: list[tuple[int, float]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_from = fail_from

    def obtain_samples(self, itr, num_samples, agent_update):
        if itr > 0:  # the calls made ahead wait for the gate
            self.gate.wait(10)
        self.calls.append((itr, float(agent_update["w"])))
        if self.fail_from is not None and itr >= self.fail_from:
            raise RuntimeError(f"call {itr} failed")
        return itr, float(agent_update["w"])


def test_each_batch_was_sampled_by_the_weights_before_the_previous_update():
    sampler, weights = RecordingSampler(), {"w": torch.zeros(())}
    ahead = SampleAhead(sampler, 100)
    batches = []
    for update in range(4):
        batches.append(ahead.take(update, weights))
        assert ahead.policy_lag == (0 if update == 0 else 1)
        weights["w"] += 1.0  # the learner's update, in place as an optimizer's
    ahead.close()
    assert batches == [(0, 0.0), (1, 0.0), (2, 1.0), (3, 2.0)]  # each from a snapshot, never the live tensor
    assert sampler.calls[-1] == (4, 3.0), "the call in flight at the end ran to its end before close returned"


def test_the_next_call_runs_while_the_learner_trains():
    sampler = RecordingSampler()
    sampler.gate.clear()  # call 1 waits: the learner goes on meanwhile
    ahead = SampleAhead(sampler, 100)
    ahead.take(0, {"w": torch.zeros(())})
    assert ahead._next.in_flight and sampler.calls == [(0, 0.0)]  # call 1 started, still waiting
    sampler.gate.set()
    assert ahead.take(1, {"w": torch.ones(())}) == (1, 0.0)
    ahead.close()


def test_a_failed_call_raises_in_the_learner_and_one_in_flight_at_close_is_only_logged():
    ahead = SampleAhead(RecordingSampler(fail_from=1), 100)
    ahead.take(0, {"w": torch.zeros(())})
    with pytest.raises(RuntimeError, match="call 1 failed"):
        ahead.take(1, {"w": torch.zeros(())})
    ahead.close()  # call 2 failed too: nothing raised
