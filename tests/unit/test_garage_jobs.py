"""A sampler job's lockstep turns: a group held back behind the call's other workers gives its process back
when the worker is asked to shut down, as it does when another job waits."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from rqrl.engine.jobs import set_worker_hooks
from rqrl.garage.jobs import LockstepTurns
from rqrl.garage.store import SAMPLES
from tests.unit.test_lockstep import built_workers


class _Counter:
    """Counts calls: a lease touch or a heartbeat."""

    def __init__(self) -> None:
        self.calls = 0

    def touch(self) -> None:
        self.calls += 1

    heartbeat = touch


@pytest.fixture
def stop_requested() -> Iterator[dict[str, bool]]:
    """The worker hooks a RolloutWorker installs, with the stop flag in the test's hands."""
    flag = {"stop": False}
    set_worker_hooks(lambda: flag["stop"], None)
    yield flag
    set_worker_hooks(None, None)


def held_back_turns() -> tuple[LockstepTurns, SimpleNamespace]:
    """Turns of a job whose only worker has pushed 5 episodes while another of the call's workers has pushed none:
    it waits, too far ahead to start its sixth."""
    workers = built_workers([0], 2, torch.nn.Linear(4, 2))
    slice_ = SimpleNamespace(jobs_waiting=lambda: False, heartbeat=_Counter().touch)
    job = SimpleNamespace(workers={0: workers[0]}, active=[0], members=[0], next_k={0: 5}, slice=slice_,
                          held=_Counter(), call=SimpleNamespace(mode=SAMPLES, count=10**6, agent_chains=[[], []]),
                          store=SimpleNamespace(call_over=lambda version: False,
                                                pace=lambda version: ({1: (0, 0)}, False)), version=1)
    turns = LockstepTurns(job, progress={1: (0, 0)})  # type: ignore[arg-type]
    return turns, job


def test_a_held_back_group_waits_for_the_others(stop_requested: dict[str, bool]) -> None:
    turns, job = held_back_turns()
    for _ in range(3):
        assert turns.turn() is None
    assert not turns.yielding and turns.waiting == [0] and job.held.calls == 3


def test_a_held_back_group_yields_when_its_worker_is_asked_to_stop(stop_requested: dict[str, bool]) -> None:
    turns, job = held_back_turns()
    assert turns.turn() is None and not turns.yielding
    stop_requested["stop"] = True
    assert turns.turn() is None
    assert turns.yielding and turns.waiting == [0]
