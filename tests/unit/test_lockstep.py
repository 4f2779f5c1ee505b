"""Lockstep: logical workers stepped together with one batched forward give exactly the episodes of one-at-a-time
rollouts, however they are grouped; what cannot be batched is refused; global RNG use is detected."""

from __future__ import annotations

import copy

import gymnasium
import numpy as np
import pytest
import torch

from rqrl import PolicyError, WorkerFactory
from rqrl.garage.episodes import EpisodeBatch
from rqrl.garage.lockstep import Lockstep, lockstep_ready
from rqrl.garage.worker import LogicalWorker
from tests import fixtures


def built_workers(numbers: list[int], n_workers: int, policy: torch.nn.Module, env_id: str = "CartPole-v1",
                  seed: int = 7, max_length: int = 60) -> list[LogicalWorker]:
    factory = WorkerFactory(seed=seed, max_episode_length=max_length, n_workers=n_workers)
    workers = []
    for w in numbers:
        worker = factory(w)
        worker.update_agent(copy.deepcopy(policy))  # each its own copy, as on rqrl workers
        worker.update_env(gymnasium.make(env_id))
        workers.append(worker)
    return workers


def unbatched(numbers: list[int], n_workers: int, policy: torch.nn.Module, episodes: int) -> dict[tuple[int, int],
                                                                                                   EpisodeBatch]:
    result = {}
    for worker in built_workers(numbers, n_workers, policy):
        for k in range(episodes):
            worker.reseed(k)
            result[worker.worker_number, k] = worker.rollout()
    return result


def batched(numbers: list[int], n_workers: int, policy: torch.nn.Module, episodes: int) -> dict[tuple[int, int],
                                                                                                 EpisodeBatch]:
    workers = built_workers(numbers, n_workers, policy)
    assert lockstep_ready(workers)
    group = Lockstep(workers)
    next_k = dict.fromkeys(numbers, 0)
    for worker in workers:
        worker.reseed(0)
        group.begin(worker)
    result = {}
    while group.running:
        for worker in group.step():
            w = worker.worker_number
            result[w, next_k[w]] = worker.collect_episode()
            next_k[w] += 1
            if next_k[w] < episodes:
                worker.reseed(next_k[w])
                group.begin(worker)
    assert group.globals_untouched()
    group.close()
    return result


def assert_identical(left: dict[tuple[int, int], EpisodeBatch], right: dict[tuple[int, int], EpisodeBatch]) -> None:
    assert left.keys() == right.keys()
    for key in left:
        a, b = left[key], right[key]
        assert a.lengths.tolist() == b.lengths.tolist(), key
        for name in ("observations", "actions", "rewards", "step_types", "last_observations"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{name} of {key}")
        np.testing.assert_array_equal(a.agent_infos["log_prob"], b.agent_infos["log_prob"], err_msg=str(key))


# lanes 3, 8, and 8 with workers sharing a lane; hidden 17 misaligns rows, where BLAS kernels vary most
@pytest.mark.parametrize(("n_workers", "hidden"), [(3, 16), (8, 64), (11, 17)])
def test_batched_and_unbatched_steps_give_identical_episodes_in_any_grouping(n_workers, hidden):
    torch.manual_seed(hidden)
    policy = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                 torch.nn.Tanh(), torch.nn.Linear(hidden, 2)).eval()
    everyone = list(range(n_workers))
    reference = unbatched(everyone, n_workers, policy, episodes=2)
    assert_identical(batched(everyone, n_workers, policy, episodes=2), reference)
    half = n_workers // 2  # the groups two processes would run
    split = {**batched(everyone[:half], n_workers, policy, 2), **batched(everyone[half:], n_workers, policy, 2)}
    assert_identical(split, reference)


def test_different_weights_garage_policies_dropout_and_dict_observations_are_not_batched():
    policy = fixtures.mlp_policy()
    assert lockstep_ready(built_workers([0, 1], 2, policy))
    other = built_workers([0, 1], 2, policy)
    with torch.no_grad():
        next(other[1].agent.module.parameters()).add_(1.0)
    assert not lockstep_ready(other)
    dropout = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    assert not lockstep_ready(built_workers([0, 1], 2, dropout))
    assert lockstep_ready(built_workers([0, 1], 2, dropout.eval()))
    garage = built_workers([0], 1, policy)
    garage[0].update_agent(fixtures_scripted())
    assert not lockstep_ready(garage)
    assert not lockstep_ready([])


def fixtures_scripted():
    from tests.unit.test_garage_worker import ScriptedPolicy

    return ScriptedPolicy()


class GlobalNoiseCartPole(gymnasium.Wrapper):
    """Draws from the global np.random at every step, as old gym envs do."""

    def step(self, action):
        np.random.random()
        return self.env.step(action)


def test_a_draw_from_a_global_rng_is_detected_and_the_globals_are_put_back():
    workers = built_workers([0, 1], 2, fixtures.mlp_policy())
    for worker in workers:
        worker.update_env(GlobalNoiseCartPole(gymnasium.make("CartPole-v1")))
    np.random.seed(5)
    expected = np.random.random()
    np.random.seed(5)
    group = Lockstep(workers)
    for worker in workers:
        group.begin(worker)
    assert group.globals_untouched()
    group.step()
    assert not group.globals_untouched()
    assert group.abandon() == [0, 1] and not group.running
    group.close()
    assert np.random.random() == expected
    assert workers[0].rollout().lengths[0] >= 1  # an abandoned worker starts afresh


def test_abandon_leaves_every_worker_between_episodes_even_one_finished_but_not_collected():
    workers = built_workers([0, 1, 2], 3, fixtures.mlp_policy(), max_length=3)
    workers[1].update_env(gymnasium.make("CartPole-v1", max_episode_steps=1))  # ends first
    group = Lockstep(workers)
    for worker in workers:
        group.begin(worker)
    assert [worker.worker_number for worker in group.step()] == [1]  # finished, not collected
    assert group.abandon() == [0, 2]
    for worker in workers:
        worker.update_agent(fixtures.mlp_policy(seed=1))  # allowed: between episodes
        assert len(worker.rollout().lengths) == 1


def test_nan_weights_are_refused_in_lockstep_as_one_by_one():
    policy = fixtures.mlp_policy()
    workers = built_workers([0, 1], 2, policy)
    group = Lockstep(workers)
    for worker in workers:
        worker.update_agent({key: value * float("nan") for key, value in policy.state_dict().items()})
        group.begin(worker)
    finished: list[LogicalWorker] = []
    while not finished:
        finished = group.step()
    with pytest.raises(PolicyError, match=r"log-prob nan at step 0 of an episode of logical worker"):
        finished[0].collect_episode()
