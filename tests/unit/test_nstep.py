"""The n-step collector: sums, gamma**k bootstraps, truncation versus termination, flushes."""

from __future__ import annotations

import numpy as np
import pytest

from rqrl.errors import ConfigError
from rqrl.seed.nstep import NStepCollector, stack


def run(collector, rewards, terminated_at=None, truncated_at=None):
    """Step obs 0, 1, 2, ... with the given rewards; returns every transition emitted, in order."""
    out = []
    for index, reward in enumerate(rewards):
        out += collector.step(np.array([index], np.float32), index % 2, None, reward,
                              np.array([index + 1], np.float32), None, terminated=index == terminated_at,
                              truncated=index == truncated_at)
    return out


def test_nothing_until_n_rewards_then_one_per_step_with_gamma_n():
    collector = NStepCollector(n=3, gamma=0.5)
    transitions = run(collector, [1.0, 2.0, 4.0, 8.0, 16.0])
    assert len(transitions) == 3
    first, second, third = transitions
    assert first.obs[0] == 0 and first.next_obs[0] == 3 and first.action == 0
    assert first.reward == pytest.approx(1 + 0.5 * 2 + 0.25 * 4)
    assert first.discount == pytest.approx(0.5**3)
    assert second.obs[0] == 1 and second.next_obs[0] == 4
    assert second.reward == pytest.approx(2 + 0.5 * 4 + 0.25 * 8)
    assert third.reward == pytest.approx(4 + 0.5 * 8 + 0.25 * 16)
    assert len(collector) == 2


def test_termination_flushes_partial_sums_without_bootstrap():
    collector = NStepCollector(n=3, gamma=0.5)
    transitions = run(collector, [1.0, 2.0, 4.0, 8.0], terminated_at=3)
    assert [t.obs[0] for t in transitions] == [0, 1, 2, 3]
    assert [t.reward for t in transitions[1:]] == pytest.approx([2 + 2 + 2, 4 + 4, 8])
    assert [t.discount for t in transitions] == [0.5**3, 0.0, 0.0, 0.0]
    assert all(t.next_obs[0] == 4 for t in transitions[1:])
    assert len(collector) == 0


def test_truncation_flushes_with_gamma_k_for_the_k_rewards_summed():
    collector = NStepCollector(n=3, gamma=0.5)
    transitions = run(collector, [1.0, 2.0, 4.0, 8.0], truncated_at=3)
    assert [t.discount for t in transitions] == pytest.approx([0.5**3, 0.5**3, 0.5**2, 0.5**1])
    assert transitions[-1].reward == 8 and transitions[-1].next_obs[0] == 4


def test_an_episode_shorter_than_n_is_flushed_whole():
    collector = NStepCollector(n=5, gamma=0.9)
    transitions = run(collector, [1.0, 1.0], terminated_at=1)
    assert [t.reward for t in transitions] == pytest.approx([1.9, 1.0])
    assert [t.discount for t in transitions] == [0.0, 0.0]


def test_n_equal_one_is_one_step_q_learning():
    transitions = run(NStepCollector(n=1, gamma=0.9), [3.0, 4.0])
    assert [t.reward for t in transitions] == [3.0, 4.0]
    assert [t.discount for t in transitions] == pytest.approx([0.9, 0.9])


def test_flush_bootstraps_what_is_pending_and_the_next_episode_starts_clean():
    collector = NStepCollector(n=3, gamma=0.5)
    run(collector, [1.0, 2.0])
    flushed = collector.flush()
    assert [t.discount for t in flushed] == pytest.approx([0.25, 0.5])
    assert collector.flush() == []
    assert run(collector, [1.0]) == []


def test_stack_fills_missing_masks_with_all_legal():
    transitions = run(NStepCollector(n=1, gamma=0.9), [1.0, 2.0])
    batch = stack(transitions, n_actions=3)
    assert batch.obs.shape == (2, 1) and batch.next_masks.all() and batch.next_masks.shape == (2, 3)
    assert batch.size == 2


@pytest.mark.parametrize(("n", "gamma"), [(0, 0.9), (2, 1.5)])
def test_bad_arguments(n, gamma):
    with pytest.raises(ConfigError):
        NStepCollector(n, gamma)


def test_stack_keeps_uint8_images_and_makes_the_rest_float32():
    frame = np.full((4, 84, 84), 255, np.uint8)
    [transition] = NStepCollector(n=1, gamma=0.9).step(frame, 1, None, 1.0, frame, None, False, False)
    images = stack([transition], n_actions=2)
    assert images.obs.dtype == images.next_obs.dtype == np.uint8 and int(images.obs.max()) == 255
    [transition] = NStepCollector(n=1, gamma=0.9).step(np.zeros(3), 1, None, 1.0, np.ones(3), None, False, False)
    vectors = stack([transition], n_actions=2)  # float64 observations travel as float32, as before
    assert vectors.obs.dtype == vectors.next_obs.dtype == np.float32
