"""garage's ``MultiprocessingSampler`` on rqrl's Redis and RQ workers (also exported as ``RQSampler``).

``n_workers`` logical garage workers run as RQ jobs on any number of ``rqrl worker`` processes, on
any number of machines: a garage user changes one import. Every ``obtain_*`` call is a new version;
every step it returns was sampled under that call's updates (``rqrl.garage.store`` fences the
pushes), episodes in flight from an earlier call are dropped and counted (``dropped_episodes``).

``obtain_samples`` returns the shortest round-robin prefix ``(worker 0, episode 0), (1, 0), ...,
(n-1, 0), (0, 1), ...`` of whole episodes holding at least ``num_samples`` steps: with a seed, the same
episodes on any number of worker processes. ``obtain_exact_episodes`` returns ``n`` episodes per worker
in worker order. Failures never hang: a worker's exception arrives as ActorFailedError with its
traceback, no live worker as NoWorkersError, a killed worker's logical workers re-run elsewhere.

>>> import gymnasium, torch
>>> policy = torch.nn.Linear(4, 2)      # a module giving logits, or a garage policy
>>> with RQSampler(policy, gymnasium.make("CartPole-v1"), max_episode_length=200, n_workers=4,
...                seed=0, progress=False) as sampler:  # doctest: +SKIP
...     batch = sampler.obtain_samples(0, 1000, policy.state_dict())
...     int(batch.lengths.sum()) >= 1000
True
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import gymnasium
import redis
from rq import Queue
from rq.job import Job

from rqrl.engine.codec import RECORD_MAGIC, records_key, verify, weights_key
from rqrl.engine.connection import connect, first_contact, redis_errors
from rqrl.engine.keys import RunKeys
from rqrl.engine.local_workers import LocalWorkers, local_worker_prefix
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.options import DEFAULTS, RunOptions, choose_options, resolve_workers, run_secret
from rqrl.engine.progress import StepRates
from rqrl.engine.rq_safety import rollout_queue
from rqrl.engine.run_config import SAMPLER_KIND, RunConfig, split_actors
from rqrl.engine.run_store import RunStore
from rqrl.engine.supervisor import Supervisor, live_worker_names
from rqrl.engine.teardown import tearing_down
from rqrl.engine.timings import protocol_timings
from rqrl.errors import CollectTimeoutError, RecordError, RunStoppedError, SignatureError
from rqrl.garage.episodes import EnvSpec, EpisodeBatch, decode_episodes
from rqrl.garage.jobs import enqueue_sampler_group
from rqrl.garage.store import (
    AGENT,
    ENV,
    EXACT,
    SAMPLES,
    ChainEntry,
    SamplerCall,
    SamplerStore,
    agent_kind,
    encode_update,
    env_kind,
    extend_chain,
)
from rqrl.garage.worker import WorkerFactory, check_env_update

log = logging.getLogger(__name__)

NOT_GIVEN: Any = object()
"""The default of ``agents``/``envs``: told apart from None, which garage allows."""
_POP_BATCH = 256


@dataclasses.dataclass(frozen=True)
class _SamplerRun:
    """What a started sampler holds: its Redis, local workers, the run's record and its stores."""

    redis_url: str | None
    secret: str | bytes
    local: LocalWorkers
    connection: redis.Redis
    config: RunConfig
    keys: RunKeys
    run_store: RunStore
    store: SamplerStore
    rq_queue: Queue
    records_key: bytes
    weights_key: bytes
    supervisor: Supervisor


class MultiprocessingSampler:
    """garage's sampler API on RQ workers; see the module docstring and README ("garage's sampler").

    Call forms: ``(worker_factory, agents, envs)`` (garage 2020.x, the seed page) and ``(agents, envs, *,
    worker_factory=None, max_episode_length=None, is_tf_worker=False, seed=None, n_workers=None,
    worker_class=None, worker_args=None)`` (garage 2021.03). rqrl's options, keyword-only: the fields of
    ``rqrl.engine.options.RunOptions`` one by one or as ``options=`` (``redis_url``, else REDIS_URL, else an
    embedded Redis; an injected ``connection``; ``run_name``; ``queue_name``; ``n_local_workers``;
    ``collect_timeout`` (seconds without a new episode); ``no_worker_timeout``; ``secret``; ...),
    ``workers_per_job`` (logical workers one job runs round robin; default: spread evenly over the local
    workers, else 1), ``progress`` (a tqdm bar per call) and ``return_extras`` (``obtain_samples`` also returns
    the whole episodes of the call that arrived past its prefix, as garage returns its overshoot, rather than
    dropping them: more data for the same sampling, but the episode set is no longer fixed by the seed alone).
    Redis, workers and jobs start at the first
    ``obtain_*`` call (or ``start_worker()``) and stop at ``shutdown_worker()``.
    """

    def __init__(self, *args: Any, agents: Any = NOT_GIVEN, envs: Any = NOT_GIVEN,
                 worker_factory: WorkerFactory | None = None, max_episode_length: int | None = None,
                 is_tf_worker: bool = False, seed: int | None = None, n_workers: int | None = None,
                 worker_class: type | None = None, worker_args: dict[str, Any] | None = None,
                 redis_url: str | None = None, connection: redis.Redis | None = None, run_name: str | None = None,
                 queue_name: str = DEFAULTS.queue_name, n_local_workers: int | None = None,
                 workers_per_job: int | None = None, start_method: str | None = None,
                 collect_timeout: float = DEFAULTS.collect_timeout,
                 no_worker_timeout: float = DEFAULTS.no_worker_timeout,
                 min_job_seconds: float = DEFAULTS.min_job_seconds, max_job_seconds: float = DEFAULTS.max_job_seconds,
                 secret: str | bytes | None = None, hang_seconds: float = DEFAULTS.hang_seconds,
                 redis_outage_seconds: float = DEFAULTS.redis_outage_seconds, worker_redis_url: str | None = None,
                 redis_server: str | None = None, options: RunOptions | None = None, progress: bool = True,
                 return_extras: bool = False):
        factory, agents, envs = call_form(args, agents, envs, worker_factory)
        factory = factory_or_parameters(factory, max_episode_length=max_episode_length, is_tf_worker=is_tf_worker,
                                        seed=seed, n_workers=n_workers, worker_class=worker_class,
                                        worker_args=worker_args)
        self._factory: WorkerFactory = factory
        self._agents, self._envs = agents, envs
        self.options = choose_options(options, RunOptions(
            redis_url=redis_url, run_name=run_name, queue_name=queue_name, n_local_workers=n_local_workers,
            actors_per_job=workers_per_job, start_method=start_method, collect_timeout=collect_timeout,
            no_worker_timeout=no_worker_timeout, min_job_seconds=min_job_seconds, max_job_seconds=max_job_seconds,
            secret=secret, hang_seconds=hang_seconds, redis_outage_seconds=redis_outage_seconds,
            worker_redis_url=worker_redis_url, redis_server=redis_server))
        self.progress = progress
        self.return_extras = return_extras
        self._injected = connection
        self.total_env_steps = 0
        self.dropped_episodes = 0
        """Episodes sampled but never returned: in flight when their call ended, or past what it needed."""
        self.groups_rerun = 0
        """Groups of logical workers re-enqueued because their worker process died or hung."""
        self.records_rejected = 0
        """Episode entries refused: unsigned, tampered, malformed, or of another call."""
        self.runs_restored = 0
        """Times Redis had lost the run (a restart without persistence) and the sampler stored it again."""
        self._rates = StepRates()  # total_env_steps at each heartbeat (rqrl status)
        # validated now, sent at the first call (version 0)
        self._initial = (self._messages(AGENT, agents), self._messages(ENV, envs))
        self._started = False
        self._run: _SamplerRun | None = None
        self._reset_calls()

    @classmethod
    def from_worker_factory(cls, worker_factory: WorkerFactory, agents: Any, envs: Any) -> Self:
        """Construct this sampler (garage's classmethod)."""
        return cls(worker_factory, agents, envs)

    @property
    def n_workers(self) -> int:
        return self._factory.n_workers

    # ---- garage's API ----------------------------------------------------------------------------------------

    def start_worker(self) -> None:
        """Start Redis (if embedded), local workers and the run now instead of at the first call."""
        if not self._started:
            with self._redis_errors():
                self._start()

    def obtain_samples(self, itr: int, num_samples: int, agent_update: Any, env_update: Any = None) -> EpisodeBatch:
        """Whole episodes, all under this call's updates, with at least ``num_samples`` steps in all: the
        shortest round-robin prefix over the logical workers (``itr`` is ignored, as in garage), then, with
        ``return_extras``, the call's other episodes that had arrived (in round-robin order)."""
        check_count("num_samples", num_samples)
        return self._obtain(SAMPLES, num_samples, agent_update, env_update)

    def obtain_exact_episodes(self, n_eps_per_worker: int, agent_update: Any, env_update: Any = None) -> EpisodeBatch:
        """Exactly ``n_eps_per_worker`` episodes of every logical worker, in worker order (all of worker 0's,
        then worker 1's, ...), each worker's in the order it ran them."""
        check_count("n_eps_per_worker", n_eps_per_worker)
        return self._obtain(EXACT, n_eps_per_worker, agent_update, env_update)

    def shutdown_worker(self) -> None:
        """Stop the jobs and local workers, delete every key and job of the run, stop an embedded Redis. A Redis
        that is gone costs it a few seconds and a warning of what was left there, not an error."""
        if not self._started:
            return
        embedded = self._local.server is not None
        try:
            with self._redis_errors(), tearing_down(self._connection, self.redis_url, self.keys.run_name,
                                                    embedded=embedded):
                self._run_store.stop(self._rq_queue, protocol_timings().stop_wait)
        finally:
            self._local.stop_workers(protocol_timings().stop_wait)
            self._started = False
            if embedded:
                self._connection.close()
                self._local.stop_redis()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown_worker()

    def __getstate__(self) -> dict[str, Any]:
        """garage's state (factory, agents, envs) and rqrl's options less the run name: unpickling starts a
        fresh run (on the same redis_url, else REDIS_URL, else an embedded Redis)."""
        return {"factory": self._factory, "agents": self._agents, "envs": self._envs,
                "options": dataclasses.replace(self.options, run_name=None), "progress": self.progress,
                "return_extras": self.return_extras}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["factory"], state["agents"], state["envs"],  # type: ignore[misc]
                      options=state["options"], progress=state["progress"],
                      return_extras=state.get("return_extras", False))

    # ---- set-up ---------------------------------------------------------------------------------------------

    def _messages(self, role: str, value: Any) -> list[Any]:
        """One message per worker (garage's spreading rule); env messages are type-checked here."""
        messages = self._factory.prepare_worker_messages(value)
        if role == ENV:
            for message in messages:
                check_env_update(message)
        return messages

    def _redis_errors(self) -> Any:
        # the first call starts the run inside this block: name the URL it is given until it has one
        url = self.redis_url or self.options.redis_url
        if self._run is not None:  # one whose embedded Redis exited says so
            return self._run.local.redis_errors(url, self.options.redis_outage_seconds)
        return redis_errors(url, self.options.redis_outage_seconds)

    def _start(self) -> None:
        keep_freed_memory()  # the learner's buffers per episode: no page faults (rqrl.engine.memory)
        options = self.options
        url = options.redis_url
        if url is None and self._injected is None:
            url = os.environ.get("REDIS_URL")
        embedded = self._injected is None and not url
        secret = run_secret(options, embedded, redis_from_environment=options.redis_url is None and bool(url))
        resolved = resolve_workers(options, self.n_workers, embedded, bool(url))
        assert resolved.actors_per_job is not None and resolved.n_local_workers is not None
        local = LocalWorkers(options.start_method, options.redis_server)
        if embedded:
            url = local.start_redis()
        elif self._injected is None:
            first_contact(url or "")
        connection = self._injected if self._injected is not None else connect(url or "", options.redis_outage_seconds)
        local.give_up_once_redis_exited(connection)  # an embedded one that exited never comes back
        config = RunConfig(
            run_name=options.run_name or f"sampler-{uuid.uuid4().hex[:8]}", run_id=uuid.uuid4().hex,
            queue_name=options.queue_name, n_rollout_steps=self._factory._max_episode_length,
            n_actors=self.n_workers, batch_size=1, queue_bound=1, actor_env_seeds=[0] * self.n_workers,
            actor_agent_seeds=[0] * self.n_workers, actor_groups=split_actors(self.n_workers, resolved.actors_per_job),
            min_job_seconds=options.min_job_seconds, max_job_seconds=options.max_job_seconds,
            hang_seconds=options.hang_seconds, extra={"kind": SAMPLER_KIND})
        keys = RunKeys(config.run_name)
        rq_queue = rollout_queue(options.queue_name, connection)
        self._run = _SamplerRun(
            redis_url=url, secret=secret, local=local, connection=connection, config=config, keys=keys,
            run_store=RunStore(connection, keys, secret), store=SamplerStore(connection, keys), rq_queue=rq_queue,
            records_key=records_key(secret, config.run_id), weights_key=weights_key(secret, config.run_id),
            supervisor=Supervisor(connection, config, rq_queue))
        self._reset_calls()
        try:
            self._run_store.open(config, self._factory, None, resume=False)
            self._started = True
            if resolved.n_local_workers:
                worker_url = options.worker_redis_url or url
                assert worker_url, "resolve_workers refuses local workers without a URL"
                local.start_workers(resolved.n_local_workers, worker_url, options.queue_name, config.run_name, secret)
        except BaseException:
            if self._started:
                self.shutdown_worker()
            local.stop_workers(protocol_timings().stop_wait)
            local.stop_redis()
            raise

    def _reset_calls(self) -> None:
        """No call made yet: version 0, no update chains, no env spec."""
        self._version = 0
        self._last_check_in = -float("inf")
        self._agent_chains: list[list[ChainEntry]] = [[] for _ in range(self.n_workers)]
        self._env_chains: list[list[ChainEntry]] = [[] for _ in range(self.n_workers)]
        self._blobs: dict[str, bytes] = {}
        """The update blobs the current chains use: written again if Redis loses them."""
        self._call: SamplerCall | None = None
        self._received: dict[tuple[int, int], EpisodeBatch] | None = None
        """The episodes the call in flight holds so far; None between calls."""
        self._env_spec: EnvSpec | None = None

    def _started_run(self) -> _SamplerRun:
        if self._run is None:
            raise RunStoppedError("this sampler has not started: call start_worker() or obtain_samples() first")
        return self._run

    @property
    def redis_url(self) -> str | None:
        """The Redis URL of the run (an embedded server's once started); None before the sampler starts."""
        return self._run.redis_url if self._run is not None else None

    @property
    def config(self) -> RunConfig:
        """The run's record in Redis (RunStoppedError before the sampler starts)."""
        return self._started_run().config

    @property
    def keys(self) -> RunKeys:
        return self._started_run().keys

    @property
    def _secret(self) -> str | bytes:
        return self._started_run().secret

    @property
    def _local(self) -> LocalWorkers:
        return self._started_run().local

    @property
    def _connection(self) -> redis.Redis:
        return self._started_run().connection

    @property
    def _run_store(self) -> RunStore:
        return self._started_run().run_store

    @property
    def _store(self) -> SamplerStore:
        return self._started_run().store

    @property
    def _rq_queue(self) -> Queue:
        return self._started_run().rq_queue

    @property
    def _records_key(self) -> bytes:
        return self._started_run().records_key

    @property
    def _weights_key(self) -> bytes:
        return self._started_run().weights_key

    @property
    def _supervisor(self) -> Supervisor:
        return self._started_run().supervisor

    # ---- one call -------------------------------------------------------------------------------------------

    def _obtain(self, mode: str, count: int, agent_update: Any, env_update: Any) -> EpisodeBatch:
        agent_messages, env_messages = self._messages(AGENT, agent_update), self._messages(ENV, env_update)
        with self._redis_errors():
            if not self._started:
                self._start()
            else:
                self._check_in(force=True)  # a Redis restarted since the last call lost the run: store it again
            version = self._begin(mode, count, agent_messages, env_messages, type(agent_update) is list,
                                  type(env_update) is list)
            try:
                batch = self._collect(version, mode, count)
            finally:
                self._store.finish(version)
        self.total_env_steps += int(batch.lengths.sum())
        return batch

    def _begin(self, mode: str, count: int, agent_messages: list[Any], env_messages: list[Any], agent_spread: bool,
               env_spread: bool) -> int:
        """Write the call's updates and chains, move the version, forget the last call, enqueue every group."""
        version = self._version + 1
        agent_chains = [list(chain) for chain in self._agent_chains]
        env_chains = [list(chain) for chain in self._env_chains]
        blobs: dict[str, bytes] = {}
        if version == 1:  # the constructor's agents and envs, as version 0
            initial_agents, initial_envs = self._initial
            self._add_update(blobs, agent_chains, AGENT, 0, initial_agents, type(self._agents) is list)
            self._add_update(blobs, env_chains, ENV, 0, initial_envs, type(self._envs) is list)
        self._add_update(blobs, agent_chains, AGENT, version, agent_messages, agent_spread)
        self._add_update(blobs, env_chains, ENV, version, env_messages, env_spread)
        call = SamplerCall(mode=mode, count=count, agent_chains=agent_chains, env_chains=env_chains)
        self._store.begin(version, call, blobs, self._weights_key)
        self._version, self._agent_chains, self._env_chains, self._call = version, agent_chains, env_chains, call
        self._blobs.update(blobs)
        used = {self.keys.sampler_update(v, role, scope) for role, chains in ((AGENT, agent_chains), (ENV, env_chains))
                for chain in chains for v, scope, _ in chain}
        unused = set(self._blobs) - used
        self._blobs = {key: blob for key, blob in self._blobs.items() if key in used}
        if version > 1 or unused:
            self.dropped_episodes += self._store.forget(version - 1, sorted(unused))
        self._remove_queued_jobs(version)
        for group_id in range(len(self.config.actor_groups)):
            enqueue_sampler_group(self._connection, self.config, group_id, version)
        return version

    def _remove_queued_jobs(self, version: int) -> None:
        """Take the run's jobs of earlier calls (continuations, re-runs) out of the queue: they would only
        start, see the call is over and return."""
        current = f"_v{version}_"
        for job_id in self._rq_queue.get_job_ids():
            if job_id.startswith(self.keys.job_id_prefix) and current not in job_id:
                self._rq_queue.remove(job_id)
                self._connection.delete(Job.key_for(job_id))

    def _add_update(self, blobs: dict[str, bytes], chains: list[list[ChainEntry]], role: str, version: int,
                    messages: list[Any], spread: bool) -> None:
        """Encode one call's agent or env messages into ``blobs`` (once if not ``spread``) and extend each
        worker's chain with its message (None: no change)."""
        kind_of = agent_kind if role == AGENT else env_kind
        for worker, message in enumerate(messages):
            kind = kind_of(message)
            if kind is None:
                continue
            scope = worker if spread else -1
            key = self.keys.sampler_update(version, role, scope)
            if key not in blobs:
                blobs[key] = encode_update(message, self._secret, self._weights_key, key)
            chains[worker] = extend_chain(chains[worker], (version, scope, kind))
        if role == ENV:
            self._learn_env_spec(messages)

    def _learn_env_spec(self, env_messages: list[Any]) -> None:
        """The spaces episodes are decoded against: from the first env or env update, then from any env sent."""
        for message in env_messages:
            if message is not None and (self._env_spec is None or isinstance(message, gymnasium.Env)):
                self._env_spec = _env_spec(message, self._factory._max_episode_length)
                return

    def _collect(self, version: int, mode: str, count: int) -> EpisodeBatch:
        """Pop the call's episodes until it has what it needs, re-running groups whose process died and raising
        what workers report; returns them in the mode's order."""
        episodes: dict[tuple[int, int], EpisodeBatch] = {}
        self._received = episodes
        try:
            chosen = self._collect_into(episodes, version, mode, count)
        finally:
            self._received = None
        self.dropped_episodes += len(episodes) - len(chosen)
        return EpisodeBatch.concatenate(*(episodes[key] for key in chosen))

    def _collect_into(self, episodes: dict[tuple[int, int], EpisodeBatch], version: int, mode: str,
                      count: int) -> list[tuple[int, int]]:
        """``_collect``'s loop: fills ``episodes`` and returns the keys the call returns, in order."""
        order = _Order(mode, count, self.n_workers)
        last_arrival = time.monotonic()
        no_worker_since: float | None = None
        with self._progress_bar(mode, count) as bar:
            while not order.complete(episodes):
                if self._check_in():  # the call starts afresh in a restarted Redis: its clock too
                    last_arrival, no_worker_since = time.monotonic(), None
                self._supervisor.raise_actor_failures(throttled=True)
                self._supervisor.check_sidelined_workers(throttled=True)
                self.groups_rerun += len(self._supervisor.rerun_orphaned_groups(
                    rerun=lambda group_id: self._rerun(group_id, version, mode, count)))
                popped = self._store.pop(version, _POP_BATCH, timeout=0.25)
                now = time.monotonic()
                for blob in popped:
                    self._receive(blob, version, count if mode == EXACT else None, episodes, bar)
                if popped:
                    last_arrival, no_worker_since = now, None
                    continue
                self._raise_if_local_workers_died()
                if self._supervisor.workers_alive() == 0:
                    self._local.raise_if_all_died()
                    no_worker_since = no_worker_since or now
                    if now - no_worker_since > self.options.no_worker_timeout:
                        raise self._supervisor.no_workers_error(self.options.no_worker_timeout)
                else:
                    no_worker_since = None
                if now - last_arrival > self.options.collect_timeout:
                    raise CollectTimeoutError(
                        f"no episode arrived for {self.options.collect_timeout:.0f} s ({len(episodes)} so far) with "
                        f"{self._supervisor.workers_alive()} worker(s) alive; raise collect_timeout for longer "
                        f"episodes, or check the workers' logs")
            chosen = order.chosen(episodes)
            if self.return_extras and mode == SAMPLES:
                chosen += self._extras(version, set(chosen), episodes, bar)
        return chosen

    def _raise_if_local_workers_died(self) -> None:
        """NoWorkersError at once when every local worker process exited and no other worker listens on the
        queue: a killed worker's last heartbeat keeps it counted as alive for ``liveness`` seconds (20 s)."""
        local = self._local
        if not local.processes or any(process.is_alive() for process in local.processes):
            return
        local_prefix = local_worker_prefix(self.config.run_name)
        live = live_worker_names(self._connection, self._rq_queue, self.config.timings.liveness)
        if all(name.startswith(local_prefix) for name in live):
            local.raise_if_all_died()

    def _extras(self, version: int, prefix: set[tuple[int, int]], episodes: dict[tuple[int, int], EpisodeBatch],
                bar: Any) -> list[tuple[int, int]]:
        """The call's episodes past its prefix, in round-robin order: those popped, and those queued now."""
        for blob in self._store.pop(version, _POP_BATCH, timeout=0):
            self._receive(blob, version, None, episodes, bar)
        return sorted((key for key in episodes if key not in prefix), key=lambda key: (key[1], key[0]))

    @property
    def sidelined_workers(self) -> dict[str, str]:
        """Workers that could not run this sampler's jobs (a wrong RQRL_SECRET, agent or env code that does not
        import there) and hand them back, by name, with the reason (see docs/service.md)."""
        supervisor = getattr(self, "_supervisor", None)
        return {name: report["error"] for name, report in supervisor.sidelined.items()} if supervisor else {}

    def _check_in(self, force: bool = False) -> bool:
        """At most once a second (unless ``force``): move the learner's heartbeat deadline on (``rqrl status``,
        ``rqrl stop`` and the workers tell a live sampler from a dead one by it); store the run again if Redis
        lost it (returns True then); RunStoppedError if ``rqrl stop`` stopped the run."""
        now = time.monotonic()
        if not force and now - self._last_check_in < 1.0:
            return False
        self._last_check_in = now
        exists, stopped = self._run_store.check_in(self.options.learner_timeout, self._heartbeat_facts(now))
        if stopped:  # also a run `rqrl stop` removed while this sampler trained between calls: not stored again
            raise RunStoppedError(f"run {self.config.run_name!r} was stopped from outside this sampler (rqrl stop)")
        if not exists:
            self._reseed()
            return True
        return False

    def _heartbeat_facts(self, now: float) -> dict[str, float]:
        """What ``rqrl status`` shows of this sampler, in the field names IMPALA's learner uses where they mean the
        same: the env steps its calls returned, steps/s over 10 s and 60 s (from its second heartbeat on), its call
        (version; the steps of a call count from the next call's first heartbeat), entries rejected."""
        facts = {"beat": time.time(), "learner_timeout": self.options.learner_timeout,
                 "env_steps": float(self.total_env_steps), "sampler_version": float(self._version),
                 "records_rejected": float(self.records_rejected)}
        self._rates.add(now, self.total_env_steps)
        return {**facts, **self._rates.facts()}

    def _reseed(self) -> None:
        """Redis lost the run (restarted without persistence): store it again with the current call's updates;
        a call in flight goes on, its jobs enqueued afresh to run the episodes this sampler does not hold yet."""
        self._run_store.restore(self.config, self._factory, None, {})
        self.runs_restored += 1
        call, received = self._call, self._received
        if call is None:  # no call made yet: the first one writes all it needs
            return
        progress = None if received is None else _contiguous_progress(received, self.n_workers)
        self._store.restore(self._version, call, self._blobs, self._weights_key, progress)
        if progress is not None:
            for group_id in range(len(self.config.actor_groups)):
                self._rerun(group_id, self._version, call.mode, call.count)
            log.warning("run %s: call %d goes on in the restarted Redis with the %d episode(s) it holds; its workers "
                        "re-run the others", self.config.run_name, self._version, len(received or {}))

    def _receive(self, blob: bytes, version: int, limit: int | None, episodes: dict[tuple[int, int], EpisodeBatch],
                 bar: Any) -> None:
        """Verify and decode one pushed episode into ``episodes``; reject (and count) what is not this call's."""
        try:
            payload = verify(blob, self._records_key, RECORD_MAGIC)
            assert self._env_spec is not None, "_begin found the env spec"
            batch, metadata = decode_episodes(payload, self._env_spec)
            key = (int(metadata["worker"]), int(metadata["episode"]))
            if int(metadata["version"]) != version or not 0 <= key[0] < self.n_workers or key[1] < 0 \
                    or (limit is not None and key[1] >= limit) or len(batch.lengths) != 1:
                raise RecordError(f"episode {metadata} does not belong to call {version}")
        except (SignatureError, RecordError, KeyError, ValueError) as error:
            self.records_rejected += 1
            log.warning("rejected an episode entry of run %s: %s", self.config.run_name, error)
            return
        if key not in episodes:
            episodes[key] = batch
            bar.update(int(batch.lengths[0]) if limit is None else 1)

    def _rerun(self, group_id: int, version: int, mode: str, count: int) -> bool:
        """Re-enqueue a group whose job is gone, unless all its logical workers met their quota."""
        progress = self._store.progress(version)
        members = self.config.actor_groups[group_id]
        index = 0 if mode == EXACT else 1
        if all(progress.get(w, (0, 0))[index] >= count for w in members):
            return False
        enqueue_sampler_group(self._connection, self.config, group_id, version)
        return True

    @contextmanager
    def _progress_bar(self, mode: str, count: int) -> Iterator[Any]:
        if not self.progress:
            yield _NoBar()
            return
        from tqdm import tqdm

        total, unit = (count, "step") if mode == SAMPLES else (count * self.n_workers, "episode")
        # disable=None: a live bar on a terminal only, never carriage-return fragments in a file or a pipe
        with tqdm(total=total, unit=unit, desc="Sampling", leave=False, dynamic_ncols=True, disable=None) as bar:
            yield _ClampedBar(bar)


RQSampler = MultiprocessingSampler
"""rqrl's name for the same class."""


class _NoBar:
    def update(self, n: int) -> None:
        """No progress display."""


class _ClampedBar:
    """A tqdm bar that stops at its total: a call's last episodes may bring more steps than it needs."""

    def __init__(self, bar: Any):
        self.bar = bar

    def update(self, n: int) -> None:
        self.bar.update(max(0, min(n, self.bar.total - self.bar.n)))


class _Order:
    """Which episodes a call returns: the shortest round-robin prefix holding ``count`` steps (samples), or
    episodes 0..count-1 of every worker in worker order (exact)."""

    def __init__(self, mode: str, count: int, n_workers: int):
        self.mode, self.count, self.n_workers = mode, count, n_workers
        self._cursor = 0  # samples: position in the round robin of the next episode to add
        self._steps = 0

    def complete(self, episodes: dict[tuple[int, int], EpisodeBatch]) -> bool:
        if self.mode == EXACT:
            return len(episodes) >= self.count * self.n_workers
        while self._steps < self.count:
            key = divmod(self._cursor, self.n_workers)[::-1]
            batch = episodes.get((key[0], key[1]))
            if batch is None:
                return False
            self._steps += int(batch.lengths[0])
            self._cursor += 1
        return True

    def chosen(self, episodes: dict[tuple[int, int], EpisodeBatch]) -> list[tuple[int, int]]:
        if self.mode == EXACT:
            return [(w, k) for w in range(self.n_workers) for k in range(self.count)]
        return [(position % self.n_workers, position // self.n_workers) for position in range(self._cursor)]


def factory_or_parameters(factory: WorkerFactory | None, *, max_episode_length: int | None,
                          **parameters: Any) -> WorkerFactory:
    """The given WorkerFactory, else one built from garage's keyword parameters (which need max_episode_length)."""
    if factory is not None:
        return factory
    if max_episode_length is None:
        raise TypeError("Must construct a sampler from WorkerFactory or parameters (at least max_episode_length)")
    return WorkerFactory(max_episode_length=max_episode_length, **parameters)


def call_form(args: tuple[Any, ...], agents: Any, envs: Any,
               worker_factory: WorkerFactory | None) -> tuple[WorkerFactory | None, Any, Any]:
    """(factory, agents, envs) from either call form: ``(worker_factory, agents, envs)`` or ``(agents, envs)``."""
    positional = list(args)
    if positional and isinstance(positional[0], WorkerFactory):
        if worker_factory is not None:
            raise TypeError("got a WorkerFactory both as the first argument and as worker_factory=")
        worker_factory = positional.pop(0)
    if len(positional) > 2:
        raise TypeError(f"expected (worker_factory, agents, envs) or (agents, envs), got {len(args)} positional "
                        f"arguments")
    for name, value in zip(("agents", "envs"), positional, strict=False):
        if (agents if name == "agents" else envs) is not NOT_GIVEN:
            raise TypeError(f"got {name} both positionally and as {name}=")
        if name == "agents":
            agents = value
        else:
            envs = value
    missing = [name for name, value in (("agents", agents), ("envs", envs)) if value is NOT_GIVEN]
    if missing:
        raise TypeError(f"MultiprocessingSampler() missing {missing}: pass (agents, envs) or "
                        f"(worker_factory, agents, envs)")
    if worker_factory is not None and not isinstance(worker_factory, WorkerFactory):
        raise TypeError(f"expected worker_factory to be an rqrl.WorkerFactory, got {type(worker_factory).__name__}")
    return worker_factory, agents, envs


def check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected {name} >= 1 (an int), got {value!r}")


def _contiguous_progress(episodes: dict[tuple[int, int], EpisodeBatch], n_workers: int) -> dict[int, tuple[int, int]]:
    """Per logical worker: (k, steps) of its episodes 0..k-1 held without a gap, where its re-run starts."""
    progress = {}
    for worker in range(n_workers):
        held = steps = 0
        while (batch := episodes.get((worker, held))) is not None:
            held, steps = held + 1, steps + int(batch.lengths.sum())
        progress[worker] = (held, steps)
    return progress


def _env_spec(env_message: Any, max_episode_length: int) -> EnvSpec:
    """The spaces episodes are checked against, from an env or an env update (applied once here, to an
    absent env, to see its env's spaces)."""
    env = env_message if isinstance(env_message, gymnasium.Env) else env_message(None)
    try:
        return EnvSpec(env.observation_space, env.action_space, max_episode_length)
    finally:
        if env is not env_message and not _keeps(env_message, env):
            env.close()


def _keeps(update: Any, env: Any) -> bool:
    """Whether ``update`` returned an env it holds (ExistingEnvUpdate): that one is not closed."""
    return getattr(update, "_env", None) is env
