"""Actors in the learner's own process, stepped by one ActorGroup: no Redis, no workers.

For debugging a learner step by step (like Sample Factory's serial mode) and as the
single-process baseline in benchmarks. It runs the very ``ActorGroup`` an RQ job runs, so seeds,
episode bookkeeping and env checks are the distributed ones: with the same seeds and weights a
serial batch equals the rollouts a distributed run delivers. Every rollout uses the latest
weights, so the policy lag is always 0, and the same seeds give the same run.

Like Maze's ``SequentialDistributedActors``, ``batch_size`` need not equal ``n_actors``: a batch is
filled with rollouts taken round-robin over the actors, going on where the previous batch stopped.
When ``batch_size`` is a multiple of ``n_actors`` every actor steps in one group (one batched policy
call per step; a distributed run with ``actors_per_job=n_actors`` delivers the same rollouts);
otherwise each actor steps in a group of its own (as with ``actors_per_job=1``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from typing import Any, SupportsIndex

from rqrl.engine.policy import (
    ActFunction,
    Policy,
    check_state_dict,
    make_act_function,
    select_policy_state,
    state_dict_of,
)
from rqrl.engine.run_config import check_seeds
from rqrl.errors import RqrlError
from rqrl.maze.actors import DistributedActors
from rqrl.maze.records import CollectedOutputs, RolloutRecord, batch_records
from rqrl.maze.rollout import ActorGroup, EnvFactory
from rqrl.maze.stats import record_batch

WORKER_LABEL = "serial"


class SerialDistributedActors(DistributedActors):
    """The actors stepped in this process; each collect_outputs returns ``batch_size`` rollouts taken
    round-robin over the actors (see the module docstring)."""

    def __init__(self, env_factory: EnvFactory, policy: Policy, n_rollout_steps: int, n_actors: int, batch_size: int,
                 actor_env_seeds: Iterable[SupportsIndex] | None = None,
                 actor_agent_seeds: Iterable[SupportsIndex] | None = None):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size)
        self.actor_env_seeds = check_seeds("actor_env_seeds", actor_env_seeds, n_actors, 0)
        self.actor_agent_seeds = check_seeds("actor_agent_seeds", actor_agent_seeds, n_actors, 1_000_000)
        self.actor_policy = copy.deepcopy(policy)
        self._policy_state = state_dict_of(policy)
        self.policy_version = 0
        self.groups: list[ActorGroup] = []
        self._act: ActFunction | None = None
        self._rollout_ids: list[int] = []  # the next rollout id of each group
        self._next_group = 0  # where the round-robin goes on
        self._last_collect = time.monotonic()

    @property
    def group(self) -> ActorGroup | None:
        """The group of every actor when batch_size is a multiple of n_actors (else actor 0's); None when stopped."""
        return self.groups[0] if self.groups else None

    def start(self) -> None:
        """Build the envs: one ActorGroup of every actor, as one RQ job would step them, or one per actor
        when batches do not take every actor's rollouts alike."""
        actor_groups = ([list(range(self.n_actors))] if self.batch_size % self.n_actors == 0
                        else [[actor] for actor in range(self.n_actors)])
        self.groups = [ActorGroup(self.env_factory, actors, [self.actor_env_seeds[a] for a in actors],
                                  [self.actor_agent_seeds[a] for a in actors], self.n_rollout_steps)
                       for actors in actor_groups]
        self._rollout_ids = [0] * len(self.groups)
        self._next_group = 0
        self._act = make_act_function(self.actor_policy, self.groups[0].action_space)
        self._last_collect = time.monotonic()

    def stop(self) -> None:
        for group in self.groups:
            group.close()
        self.groups = []

    def broadcast_updated_policy(self, state_dict: Mapping[str, Any]) -> None:
        state_dict = select_policy_state(self._policy_state, state_dict)  # drops a critic's keys, etc.
        check_state_dict(self._policy_state, state_dict)
        self.actor_policy.load_state_dict(state_dict)
        self.policy_version += 1

    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        """Run ``batch_size`` rollouts round-robin over the actors with the latest weights; episodes go on
        across calls."""
        if not self.groups or self._act is None:
            raise RqrlError("call start() before collect_outputs()")
        if self.policy_version == 0:
            raise RqrlError("call broadcast_updated_policy() before collect_outputs()")
        started = time.perf_counter()
        records: list[RolloutRecord] = []
        while len(records) < self.batch_size:
            index = self._next_group
            records += self.groups[index].run(self._act, self._rollout_ids[index], self.policy_version,
                                              cut_at_end=False, worker=WORKER_LABEL)
            self._rollout_ids[index] += 1
            self._next_group = (index + 1) % len(self.groups)
        batch = batch_records(records, learner_device)
        now = time.monotonic()
        elapsed, self._last_collect = now - self._last_collect, now
        record_batch(self.epoch_stats, records, self.policy_version, elapsed, queue_size=0,
                     dequeue_time=time.perf_counter() - started)
        return CollectedOutputs(batch, 0, 0, time.perf_counter() - started)
