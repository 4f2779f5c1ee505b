"""Distributed trainer, based on the SEED architecture: actors only step envs, a few inference servers
hold the model and answer observation requests in batches, transitions stream to the learner's replay.
Everything travels through Redis, so actors and servers on other machines can join the same run.

``Trainer(agent, config, environment).start(duration)`` blocks for ``duration`` seconds plus the shutdown
(stopping the processes, at most ``config.shutdown_timeout`` s, normally well under one second) and returns
with none of its processes, threads or Redis keys left. Training runs in the caller's process, so
``agent`` holds the trained weights afterwards.

>>> from rqrl.seed.agent import Agent, AgentConfig
>>> agent = Agent(AgentConfig(state_shape=(4,), action_space_size=2), network)  # doctest: +SKIP
>>> Trainer(agent, Config(minimum_buffer_size=500), lambda: gymnasium.make("CartPole-v1")).start(60)  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import multiprocessing.process
import os
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import redis

from rqrl.engine.codec import secret_from_environment
from rqrl.engine.connection import DEFAULT_OUTAGE_SECONDS, connect, first_contact
from rqrl.engine.devices import check_device
from rqrl.engine.keys import RunKeys
from rqrl.engine.local_workers import multiprocessing_context
from rqrl.engine.memory import keep_freed_memory
from rqrl.engine.process import stop_processes
from rqrl.engine.progress import StepRates
from rqrl.engine.run_store import run_exists_error
from rqrl.engine.screen import MAX_ENTRY_BYTES, screened_lpop
from rqrl.engine.server import EmbeddedRedis, redis_errors_naming
from rqrl.engine.teardown import tearing_down
from rqrl.engine.weights import WeightStore
from rqrl.errors import ConfigError, ProcessesDiedError, RecordError, SignatureError
from rqrl.seed.actor import decode_transitions, env_misfit, run_actor_process
from rqrl.seed.agent import Agent, AgentConfig, build_model
from rqrl.seed.config import Config, batch_that_fills, batch_warning, check_against_replay
from rqrl.seed.inference import run_server_process
from rqrl.seed.jobs import JobFleet
from rqrl.seed.store import LEARNER_TIMEOUT, SeedRecord, SeedRun

log = logging.getLogger(__name__)

SUPERVISE_SECONDS = 0.2
START_FAILURES = 5
"""Deaths of one actor or server process, or of each thread of an actor process, before any transition arrived
after which start() raises."""
DROP_CHECK_SECONDS = 2.0
"""How often the learner looks for dead actor and server processes and for reported thread deaths."""
UNTOLD_STOP_SECONDS = 2.0
"""How long the shutdown waits for processes and jobs a full Redis kept from seeing the stop flag (SIGTERM, then
SIGKILL; a job loses its lease with the run's keys)."""
RECEIVE_MESSAGES = 256
"""Most transition messages the learner pops between two train steps."""


@dataclass
class TrainerStats:
    """What a ``start()`` did; kept on the trainer after it returns."""

    transitions_received: int = 0
    messages_rejected: int = 0
    train_steps: int = 0
    weights_version: int = 0
    episodes: int = 0
    transitions_dropped: int = 0
    """Transitions the actors dropped because the list was full (Config.drop_when_full), as last read."""
    recent_returns: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=100))
    restarts: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    """The run's Redis counters at the end: pushed (transitions), full_waits, batches_full, batches_delay, ..."""

    @property
    def mean_return(self) -> float | None:
        """Mean return of the last 100 episodes, None before the first."""
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else None


class Trainer:
    """SEED trainer: ``start(duration)`` runs actors and inference servers as processes and trains ``agent``."""

    def __init__(self, agent: Agent, config: Config, environment: Callable[[], gymnasium.Env], *,
                 on_progress: Callable[[Trainer], None] | None = None, progress_seconds: float = 1.0):
        """``on_progress(trainer)`` runs in the learner's thread every ``progress_seconds`` during ``start()``: it
        may read ``stats``, save the agent's weights, or call ``stop()`` (e.g. once solved)."""
        if not callable(environment):
            raise ConfigError(f"expected environment to be a zero-argument callable returning a gymnasium env, got "
                              f"{environment!r}")
        check_against_replay(config, agent.config.replay_capacity)
        if config.queue_name is None:  # servers on workers elsewhere have devices this machine cannot see
            check_device("inference_device", config.inference_device)
        check_environment(environment, agent.config)
        self.agent, self.config, self.environment = agent, config, environment
        self.on_progress, self.progress_seconds = on_progress, progress_seconds
        self.stats = TrainerStats()
        self._rates = StepRates()  # transitions received at each heartbeat
        self.processes: dict[str, multiprocessing.process.BaseProcess] = {}
        self.run_name: str | None = None
        self._restart_after: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._thread_deaths: collections.Counter[tuple[Any, Any]] = collections.Counter()  # (actor, thread) index
        self._launcher: Callable[[str], None] | None = None
        self.fleet: JobFleet | None = None  # the actor and server jobs, with Config.queue_name
        self.started_pids: list[int] = []  # every process the last start() started, replacements included
        self._stop = threading.Event()
        self.stopped_from_outside = False  # the last start() ended on `rqrl stop RUN` (the run's stop flag)
        self._embedded: EmbeddedRedis | None = None  # the running start()'s own Redis, if it started one
        self.redis_url: str | None = None
        """The Redis of the last start() (an embedded one's URL while it runs)."""
        self._last_sequence: dict[str, int] = {}
        """Sender (an actor thread) -> the newest message number taken from it: older or repeated ones are replays."""
        self._said_unscreened = False  # warned once that this Redis user cannot screen messages for size

    def stop(self) -> None:
        """Make a running ``start()`` (in another thread) end now, as if its duration had passed."""
        self._stop.set()

    def start(self, duration: float) -> None:
        """Start training, and block until completed (``duration`` seconds plus the shutdown)."""
        try:
            self._start(duration)
        except redis.RedisError as error:  # an outage past its window, a refusal: rqrl's error, naming the URL
            with redis_errors_naming(self._embedded, self.redis_url, DEFAULT_OUTAGE_SECONDS):
                raise error

    def _start(self, duration: float) -> None:
        if not (isinstance(duration, (int, float)) and math.isfinite(duration) and duration > 0):
            raise ConfigError(f"expected duration > 0 seconds, got {duration!r}")
        deadline = time.monotonic() + duration
        if (warning := batch_warning(self.config)) is not None:
            log.warning("%s", warning)
        keep_freed_memory()  # the trainer's buffers per message and batch: no page faults (rqrl.engine.memory)
        config = self.config
        self._stop.clear()
        self.stopped_from_outside = False
        self.started_pids = []
        self._failures.clear()
        self._thread_deaths.clear()
        self._restart_after.clear()
        self.stats = TrainerStats()
        self._rates = StepRates()
        self._last_sequence = {}
        # REDIS_URL, the ecosystem's convention, where no redis_url is given; with it, RQRL_SECRET signs the run
        environment_url = os.environ.get("REDIS_URL") if config.redis_url is None else None
        given_url = config.redis_url or environment_url
        if config.queue_name is not None and not given_url:
            raise ConfigError(f"queue_name={config.queue_name!r} needs a Redis the workers share: redis_url=, or "
                              f"REDIS_URL set (it was unset when start() ran)")
        embedded = EmbeddedRedis(config.redis_server).start() if not given_url else None
        url = embedded.url if embedded is not None else str(given_url)
        self.redis_url = url
        if config.connection is None and embedded is None:
            first_contact(url)
        connection = config.connection if config.connection is not None else connect(url)
        if embedded is not None and config.connection is None:  # one that exited never comes back: no outage wait
            embedded.give_up_once_exited(connection)
        self._embedded = embedded
        secret = config.secret or (secrets.token_hex(32) if embedded is not None else None)
        if not secret and environment_url:
            secret = secret_from_environment()
        run: SeedRun | None = None
        try:
            if not secret:
                raise ConfigError("an external Redis needs secret= to sign the environment and network factories that "
                                  "actor and server processes unpickle, or, with Redis from REDIS_URL, RQRL_SECRET "
                                  "set (the workers' RQRL_SECRET)")
            self.run_name = config.run_name or f"seed-{uuid.uuid4().hex[:8]}"
            run = SeedRun(connection, RunKeys(self.run_name), secret, uuid.uuid4().hex)
            if connection.exists(run.keys.seed("settings"), run.keys.config):
                run = None
                raise run_exists_error(connection, RunKeys(self.run_name), can_take_over=False)
            run.write(self._settings(), functools.partial(build_model, self.agent.config, self.agent.network_factory),
                      self.environment)
            run.record(SeedRecord(config.queue_name, config.actor_processes, config.actor_threads))
            run.check_in(self._facts())
            weights = WeightStore(connection, run.keys, run.weights_key)
            self.stats.weights_version = weights.publish(self.agent.model_instance.state_dict())
            # workers' jobs (queue_name) fork nothing here: no forkserver for them
            context = multiprocessing_context(config.start_method) if config.queue_name is None else None

            def launch(name: str) -> None:
                assert context is not None, "local processes are launched only without queue_name"
                kind, index = name.split("-")
                target = run_server_process if kind == "server" else run_actor_process
                process = context.Process(target=target, args=(url, self.run_name, secret, int(index), os.getpid()),
                                          name=f"rqrl-seed-{name}", daemon=False)
                process.start()
                self.processes[name] = process
                self.started_pids.append(int(process.pid or 0))

            if config.queue_name is not None:
                self.fleet = JobFleet(connection, config.queue_name, run.keys, config.actor_processes)
                self._launcher = self.fleet.launch
            else:
                self._launcher = launch
            for index in range(config.inference_servers):
                self._launcher(f"server-{index}")
            for index in range(config.actor_processes):
                self._launcher(f"actor-{index}")
            self._learn(run, weights, deadline)
        finally:
            self._shutdown(run, embedded, connection if config.connection is None else None)

    def _settings(self) -> dict[str, Any]:
        agent_config = self.agent.config
        return {**self.config.process_settings(), "inference_batchsize": batch_that_fills(self.config),
                "n_actions": agent_config.action_space_size, "state_shape": list(agent_config.state_shape),
                "gamma": agent_config.discount_factor}

    def _learn(self, run: SeedRun, weights: WeightStore, deadline: float) -> None:
        """Receive transitions, train, publish weights and supervise the processes until ``deadline``."""
        config, agent = self.config, self.agent
        train_interval = 1.0 / config.max_train_frequency if config.max_train_frequency > 0 else 0.0
        now = time.monotonic()
        next_train, next_broadcast, next_check = now, now + config.broadcast_period, now + SUPERVISE_SECONDS
        next_progress, next_drop_check = now + self.progress_seconds, now + DROP_CHECK_SECONDS
        while (now := time.monotonic()) < deadline and not self._stop.is_set():
            received = self._receive(run, RECEIVE_MESSAGES)
            trained = False
            if agent.buffer_size() >= config.minimum_buffer_size and now >= next_train and self._may_train():
                agent.train_step()
                self.stats.train_steps += 1
                next_train = now + train_interval
                trained = True
            if now >= next_broadcast:
                self.stats.weights_version = weights.publish(agent.model_instance.state_dict())
                next_broadcast = now + config.broadcast_period
            if now >= next_check:
                # the heartbeat answers whether the stop flag is set: by `rqrl stop RUN` (this trainer sets it only
                # once it shuts down)
                if run.check_in(self._facts()):
                    log.warning("run %s was stopped from outside this trainer (rqrl stop)", run.keys.run_name)
                    self.stopped_from_outside = True
                    break
                self._supervise(run)
                next_check = now + SUPERVISE_SECONDS
            if config.drop_when_full and now >= next_drop_check:
                self._report_drops(run)
                next_drop_check = now + DROP_CHECK_SECONDS
            if self.on_progress is not None and now >= next_progress:
                self.on_progress(self)
                next_progress = now + self.progress_seconds
            if not received and not trained:
                time.sleep(max(0.0, min(0.005, deadline - time.monotonic())))

    def _facts(self) -> dict[str, float]:
        """What ``rqrl status`` shows of this trainer, in the field names IMPALA's learner uses where they mean the
        same: env steps are the transitions received (one per actor step), steps/s over 10 s and 60 s from the
        second heartbeat on."""
        stats = self.stats
        facts = {"beat": time.time(), "learner_timeout": LEARNER_TIMEOUT, "policy_version": stats.weights_version,
                 "env_steps": stats.transitions_received, "train_steps": stats.train_steps,
                 "episodes": stats.episodes, "records_rejected": stats.messages_rejected}
        self._rates.add(time.monotonic(), stats.transitions_received)
        return {**facts, **self._rates.facts()}

    def _may_train(self) -> bool:
        """Whether one more train step keeps the samples trained on within replay_ratio per transition received."""
        ratio = self.config.replay_ratio
        return ratio <= 0 or ((self.stats.train_steps + 1) * self.agent.config.batch_size
                              <= ratio * self.stats.transitions_received)

    def _report_drops(self, run: SeedRun) -> None:
        """Log the transitions actors dropped since the last look (only with Config.drop_when_full)."""
        dropped = run.counters().get("transitions_dropped", 0)
        if dropped > self.stats.transitions_dropped:
            log.warning("run %s: actors dropped %d transitions (%d in all) because the transition list was full: "
                        "the learner falls behind them (drop_when_full=True; raise transition_queue_size or "
                        "max_train_frequency, or set drop_when_full=False to make actors wait)", run.keys.run_name,
                        dropped - self.stats.transitions_dropped, dropped)
            self.stats.transitions_dropped = dropped

    def _receive(self, run: SeedRun, limit: int) -> int:
        """Pop up to ``limit`` transition messages into the replay; returns how many were popped."""
        try:
            blobs, oversized = screened_lpop(run.connection, run.keys.seed("transitions"), run.keys.scratch, limit)
        except redis.ResponseError as error:
            if "WRONGTYPE" not in str(error):  # a refused right, say: the list is the actors', never delete it then
                raise
            run.connection.delete(run.keys.seed("transitions"))  # not a list: the trainer owns the key
            run.refuse(f"{run.keys.seed('transitions')} was no list ({error}); deleted it")
            return 0
        if oversized < 0 and not self._said_unscreened:
            self._said_unscreened = True
            log.warning("run %s: the trainer could not screen its transition messages for size (its Redis user "
                        "lacks EVAL, MEMORY USAGE, SORT or LSET, or Redis is full), so an oversized one would be "
                        "read whole; grant them (docs/redis-security.md)", run.keys.run_name)
        for _ in range(max(oversized, 0)):
            self.stats.messages_rejected += 1
            run.refuse(f"a transition message over {MAX_ENTRY_BYTES / 2**20:.0f} MB was dropped in Redis, unread")
        for blob in blobs:
            try:
                message = decode_transitions(blob if isinstance(blob, bytes) else b"", run.message_key)
            except (SignatureError, RecordError, KeyError, TypeError, ValueError) as error:
                self.stats.messages_rejected += 1
                run.refuse(f"dropping a transition message that is not ours: {error}")
                continue
            if message.sequence <= self._last_sequence.get(message.sender, -1):
                self.stats.messages_rejected += 1
                run.refuse(f"dropping a replayed transition message ({message.sender} #{message.sequence})")
                continue
            self._last_sequence[message.sender] = message.sequence
            batch, returns = message.batch, message.episode_returns
            self.agent.observe(batch, frames=message.frames)
            self.stats.transitions_received += batch.size
            self.stats.episodes += len(returns)
            self.stats.recent_returns.extend(float(value) for value in returns)
        return len(blobs)

    def _supervise(self, run: SeedRun) -> None:
        """Log reported thread deaths; replace dead processes (with a growing pause if one keeps dying)."""
        for event in run.take_events():
            message = (f"actor {event.get('actor')} replaced its thread {event.get('thread')}, which died: "
                       f"{str(event.get('error', '')).strip().splitlines()[-1:]}")
            log.warning("%s\n%s", message, event.get("error", ""))
            self.stats.restarts.append(message)
            self._give_up_on_threads(run, event)
        now = time.monotonic()
        dead = [(name, f"(pid {process.pid}), which {_exit_cause(process.exitcode)}")
                for name, process in self.processes.items() if not process.is_alive()]
        if self.fleet is not None:
            dead += [(name, f"(a job), which {cause}") for name, cause in self.fleet.dead()]
        for name, cause in dead:
            if now < self._restart_after.get(name, 0.0):
                continue
            if name in self.processes:
                self.processes[name].join(0)
            failures = self._failures.get(name, 0) + 1
            self._failures[name] = failures
            if failures >= START_FAILURES and self.stats.transitions_received == 0:
                raise ProcessesDiedError(
                    f"run {run.keys.run_name}: {name} {cause}, {failures} times before the first transition arrived; "
                    f"the trainer gives up. Usual causes: a script that starts the trainer outside `if __name__ == "
                    f"'__main__':` (each new process runs it again while importing it), or an environment or network "
                    f"factory that raises in a fresh process; the processes' stderr above says which")
            self._restart_after[name] = now + min(5.0, 0.1 * 2 ** min(failures, 10))
            message = f"restarted {name} {cause}"
            log.warning("run %s: %s", run.keys.run_name, message)
            self.stats.restarts.append(message)
            if self._launcher is not None:
                self._launcher(name)

    def _give_up_on_threads(self, run: SeedRun, death: dict[str, Any]) -> None:
        """ProcessesDiedError once every thread of an actor process has died START_FAILURES times before any
        transition arrived: its env or the agent fails every time (an env id misspelt, an action space the agent
        does not fit), and replacing them again would not change that. An env that fails now and then leaves some
        thread that gets through, and the run goes on."""
        actor, thread = death.get("actor"), death.get("thread")
        self._thread_deaths[actor, thread] += 1
        name = f"actor {actor}'s thread {thread}"
        threads = [self._thread_deaths[actor, index] for index in range(self.config.actor_threads)]
        if min(threads) >= START_FAILURES and self.stats.transitions_received == 0:
            last = str(death.get("error", "")).strip().splitlines()[-1:] or ["no error"]
            raise ProcessesDiedError(
                f"run {run.keys.run_name}: every thread of actor {actor} died {START_FAILURES} times or more before "
                f"the first transition arrived, {name} last with {last[0]}; the trainer gives up. Check the "
                f"environment factory (does it make the env in a fresh process?) and that the agent fits the env's "
                f"spaces (action_space_size, state_shape); the whole traceback is logged above")

    def _shutdown(self, run: SeedRun | None, embedded: EmbeddedRedis | None, own_connection: Any) -> None:
        """Stop the processes, take in the transitions still queued, delete the run's keys; a Redis that is gone
        costs a few seconds and a warning (``rqrl.engine.teardown``), and the processes stop all the same."""
        try:
            if run is not None:
                with tearing_down(run.connection, self.redis_url, run.keys.run_name, embedded=embedded is not None):
                    self._tear_down(run)
        finally:
            stop_processes(list(self.processes.values()), self.config.shutdown_timeout)
            self.processes.clear()
            self.fleet, self._launcher = None, None
            if own_connection is not None:
                own_connection.close()
            if embedded is not None:
                embedded.stop()

    def _tear_down(self, run: SeedRun) -> None:
        """The run's part in Redis: its stop flag, its jobs, the transitions still queued, its keys."""
        told = run.stop()  # first: the processes and jobs see it and end on their own
        wait = self.config.shutdown_timeout if told else min(self.config.shutdown_timeout, UNTOLD_STOP_SECONDS)
        stop_processes(list(self.processes.values()), wait)
        self.processes.clear()
        if self.fleet is not None:
            self.fleet.stop(wait)
        while self._receive(run, 10_000):
            pass
        self.stats.counters = run.counters()
        self.stats.transitions_dropped = self.stats.counters.get("transitions_dropped", 0)
        run.delete()


def check_environment(environment: Callable[[], gymnasium.Env], agent_config: AgentConfig) -> None:
    """ConfigError if an env of ``environment`` does not fit the agent (action_space_size, state_shape), before any
    process starts. An env this process cannot make or reset is left to the actors, which report why with the
    traceback (a worker of ``queue_name`` may have what the learner lacks)."""
    try:
        env = environment()
    except Exception as error:
        log.debug("could not make the environment in the learner to check its spaces: %r", error)
        return
    try:
        obs, _ = env.reset()
        misfit = env_misfit(env, obs, agent_config.action_space_size, agent_config.state_shape)
    except Exception as error:
        log.debug("could not reset the environment in the learner to check its spaces: %r", error)
        return
    finally:
        with contextlib.suppress(Exception):  # not an env at all, or one whose close fails: the actors say so
            env.close()
    if misfit is not None:
        raise ConfigError(misfit)


def _exit_cause(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
