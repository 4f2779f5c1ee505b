"""``LocalSampler``: the garage sampler's logical workers in the caller's process, for debugging and as a baseline.

Same call forms, methods and ordering rules as ``MultiprocessingSampler``, no Redis and no workers: each
call applies its updates to every logical worker (each owning its own copy of a policy object, as on rqrl
workers), reseeds episode ``k`` of call ``v`` the way the sampler's job does, and runs episodes round robin.
So with a seed it returns exactly the episodes ``RQSampler`` returns, on any number of processes.

>>> import gymnasium, torch
>>> policy = torch.nn.Linear(4, 2)
>>> sampler = LocalSampler(policy, gymnasium.make("CartPole-v1"), max_episode_length=50, n_workers=2, seed=0)
>>> int(sampler.obtain_samples(0, 100, policy.state_dict()).lengths.sum()) >= 100
True
"""

from __future__ import annotations

from typing import Any, Self

import cloudpickle

from rqrl.garage.episodes import EpisodeBatch
from rqrl.garage.sampler import NOT_GIVEN, call_form, check_count, factory_or_parameters
from rqrl.garage.worker import LogicalWorker, WorkerFactory, check_env_update


class LocalSampler:
    """garage's sampler API in one process; see the module docstring."""

    def __init__(self, *args: Any, agents: Any = NOT_GIVEN, envs: Any = NOT_GIVEN,
                 worker_factory: WorkerFactory | None = None, max_episode_length: int | None = None,
                 is_tf_worker: bool = False, seed: int | None = None, n_workers: int | None = None,
                 worker_class: type | None = None, worker_args: dict[str, Any] | None = None):
        factory, agents, envs = call_form(args, agents, envs, worker_factory)
        factory = factory_or_parameters(factory, max_episode_length=max_episode_length, is_tf_worker=is_tf_worker,
                                        seed=seed, n_workers=n_workers, worker_class=worker_class,
                                        worker_args=worker_args)
        self._factory = factory
        self._workers: list[LogicalWorker] = [factory(w) for w in range(factory.n_workers)]
        self._version = 0
        self.total_env_steps = 0
        self._update(agents, envs)

    @classmethod
    def from_worker_factory(cls, worker_factory: WorkerFactory, agents: Any, envs: Any) -> Self:
        """Construct this sampler (garage's classmethod)."""
        return cls(worker_factory, agents, envs)

    def start_worker(self) -> None:
        """Nothing to start (garage's deprecated method)."""

    def obtain_samples(self, itr: int, num_samples: int, agent_update: Any, env_update: Any = None) -> EpisodeBatch:
        """The shortest round-robin prefix of whole episodes with at least ``num_samples`` steps."""
        check_count("num_samples", num_samples)
        self._update(agent_update, env_update)
        episodes, steps, k = [], 0, 0
        while steps < num_samples:
            for w in range(len(self._workers)):
                episodes.append(self._rollout(w, k))
                steps += int(episodes[-1].lengths.sum())
                if steps >= num_samples:
                    break
            k += 1
        return self._done(episodes)

    def obtain_exact_episodes(self, n_eps_per_worker: int, agent_update: Any, env_update: Any = None) -> EpisodeBatch:
        """``n_eps_per_worker`` episodes of every worker, in worker order."""
        check_count("n_eps_per_worker", n_eps_per_worker)
        self._update(agent_update, env_update)
        return self._done([self._rollout(w, k) for w in range(len(self._workers)) for k in range(n_eps_per_worker)])

    def shutdown_worker(self) -> None:
        """Close every worker's env."""
        for worker in self._workers:
            worker.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown_worker()

    def _update(self, agent_update: Any, env_update: Any) -> None:
        """A new call: each worker gets its message, copied as sending it to a worker would (so no two workers
        share an env or a policy object)."""
        agents = self._factory.prepare_worker_messages(agent_update)
        envs = self._factory.prepare_worker_messages(env_update)
        for message in envs:
            check_env_update(message)
        self._version += 1
        for worker, agent, env in zip(self._workers, agents, envs, strict=True):
            worker.update_env(_copy(env))
            worker.update_agent(_copy(agent))

    def _rollout(self, w: int, k: int) -> EpisodeBatch:
        worker = self._workers[w]
        if worker.seed is not None:
            worker.reseed(((self._version - 2) << 32) | k)  # the constructor's update counts as a call here
        return worker.rollout()

    def _done(self, episodes: list[EpisodeBatch]) -> EpisodeBatch:
        batch = EpisodeBatch.concatenate(*episodes)
        self.total_env_steps += int(batch.lengths.sum())
        return batch


def _copy(message: Any) -> Any:
    return None if message is None else cloudpickle.loads(cloudpickle.dumps(message))
