"""Actors in the learner's own process, stepped by one ActorGroup: no Redis, no workers.

For debugging a learner step by step (like Sample Factory's serial mode) and as the
single-process baseline in benchmarks. It runs the very ``ActorGroup`` an RQ job runs, so seeds,
episode bookkeeping and env checks are the distributed ones: with the same seeds and weights a
serial batch equals the rollouts a distributed run delivers. Every rollout uses the latest
weights, so the policy lag is always 0, and the same seeds give the same run.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from typing import SupportsIndex

import torch

from rqrl.actors import DistributedActors
from rqrl.errors import ConfigError, RqrlError
from rqrl.policy import ActFunction, Policy, as_state_dict, check_state_dict, make_act_function, state_dict_of
from rqrl.records import CollectedOutputs, batch_records
from rqrl.rollout import ActorGroup, EnvFactory
from rqrl.run_config import check_seeds
from rqrl.stats import record_batch

WORKER_LABEL = "serial"


class SerialDistributedActors(DistributedActors):
    """All actors stepped together in this process; each collect_outputs returns ``n_actors`` rollouts."""

    def __init__(self, env_factory: EnvFactory, policy: Policy, n_rollout_steps: int, n_actors: int, batch_size: int,
                 actor_env_seeds: Iterable[SupportsIndex] | None = None,
                 actor_agent_seeds: Iterable[SupportsIndex] | None = None):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size)
        if batch_size != n_actors:
            raise ConfigError(
                f"SerialDistributedActors steps all actors at once: expected batch_size == n_actors "
                f"({n_actors}), got {batch_size}"
            )
        self.actor_env_seeds = check_seeds("actor_env_seeds", actor_env_seeds, n_actors, 0)
        self.actor_agent_seeds = check_seeds("actor_agent_seeds", actor_agent_seeds, n_actors, 1_000_000)
        self.actor_policy = copy.deepcopy(policy)
        self._policy_state = state_dict_of(policy)
        self.policy_version = 0
        self.group: ActorGroup | None = None
        self._act: ActFunction | None = None
        self._rollout_id = 0
        self._last_collect = time.monotonic()

    def start(self) -> None:
        """Build the envs: one ActorGroup of every actor, as one RQ job would step them."""
        self.group = ActorGroup(self.env_factory, list(range(self.n_actors)), self.actor_env_seeds,
                                self.actor_agent_seeds, self.n_rollout_steps)
        self._act = make_act_function(self.actor_policy, self.group.action_space)
        self._last_collect = time.monotonic()

    def stop(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def broadcast_updated_policy(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        state_dict = as_state_dict(state_dict)
        check_state_dict(self._policy_state, state_dict)
        self.actor_policy.load_state_dict(state_dict)
        self.policy_version += 1

    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        """Run every actor for one rollout with the latest weights; episodes go on across calls."""
        if self.group is None or self._act is None:
            raise RqrlError("call start() before collect_outputs()")
        if self.policy_version == 0:
            raise RqrlError("call broadcast_updated_policy() before collect_outputs()")
        started = time.perf_counter()
        records = self.group.run(self._act, self._rollout_id, self.policy_version, cut_at_end=False,
                                 worker=WORKER_LABEL)
        self._rollout_id += 1
        batch = batch_records(records, learner_device)
        now = time.monotonic()
        elapsed, self._last_collect = now - self._last_collect, now
        record_batch(self.epoch_stats, records, self.policy_version, elapsed, queue_size=0,
                     dequeue_time=time.perf_counter() - started)
        return CollectedOutputs(batch, 0, 0, time.perf_counter() - started)
