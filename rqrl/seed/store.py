"""What a SEED run keeps in Redis besides weights, and the signed messages its processes exchange.

The trainer stores the settings (JSON), the model factory and the environment factory (cloudpickled and
signed: they are code), then actor and server processes on any machine load them with the run's secret.
Requests, replies and transition messages are safetensors buffers (never pickle) signed under a key
derived from the secret and the run, so a Redis writer without the secret can neither answer for a server
nor poison the replay.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis
from torch import nn

from rqrl.engine.bounded_log import BoundedLog
from rqrl.engine.codec import (
    RECORD_MAGIC,
    decode_arrays,
    derive_key,
    dumps_object,
    encode_arrays,
    loads_object,
    sign,
    verify,
    weights_key,
)
from rqrl.engine.compression import compress, decompress, worth_compressing
from rqrl.engine.keys import DEFAULT_QUEUE, RunKeys
from rqrl.engine.run_config import SEED_KIND, RunConfig, split_actors
from rqrl.engine.run_store import RunStore, raise_stop_flag
from rqrl.errors import ConfigError, RecordError, RunStoppedError, SignatureError

EVENTS_KEPT = 1000
"""Newest events (thread deaths, ...) kept in Redis for the trainer to log."""


def _json_object(raw: bytes | str) -> dict[str, Any] | None:
    """The JSON object ``raw`` holds, or None."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def seal(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str], key: bytes) -> bytes:
    """Arrays and string metadata as a signed safetensors buffer, compressed when it holds images (uint8 arrays of
    rows of two or more axes: observations, requests and transitions of pixel envs)."""
    blob = encode_arrays(arrays, metadata)
    return sign(compress(blob) if worth_compressing(arrays.values(), 1) else blob, key, RECORD_MAGIC)


def unseal(blob: bytes, key: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Inverse of seal; SignatureError or RecordError for anything not sealed under ``key``."""
    return decode_arrays(decompress(verify(blob, key, RECORD_MAGIC)))



SETTINGS_MAGIC = b"RQRLSET2"
EVENT_MAGIC = b"RQRLEVT2"
_EVENT_FIELDS: dict[str, type] = {"kind": str, "actor": int, "thread": int, "error": str}
"""What an actor's event holds (``Actor`` reports a thread that died): anything else is refused."""
"""The magic of a run's signed settings (under ``SeedRun.settings_key``)."""
LEARNER_TIMEOUT = 60.0
"""Seconds after the trainer's last heartbeat that ``rqrl health --run`` calls it dead and ``rqrl stop`` cleans
the run up itself."""


@dataclass(frozen=True)
class SeedRecord:
    """What a SEED run's record says: its queue (None: local processes) and how many actors it runs."""

    queue_name: str | None
    actor_processes: int
    actor_threads: int

    def run_config(self, run_name: str, run_id: str) -> RunConfig:
        """The run record, with one group per actor process of ``actor_threads`` actors."""
        n_actors = self.actor_processes * self.actor_threads
        return RunConfig(
            run_name=run_name, run_id=run_id, queue_name=self.queue_name or DEFAULT_QUEUE, n_rollout_steps=1,
            n_actors=n_actors, batch_size=1, queue_bound=1, actor_env_seeds=[0] * n_actors,
            actor_agent_seeds=[0] * n_actors, actor_groups=split_actors(n_actors, self.actor_threads),
            extra={"kind": SEED_KIND, "actors": "jobs" if self.queue_name else "processes"})


@dataclass(frozen=True)
class SeedRun:
    """One SEED run's keys and message key in one Redis."""

    connection: redis.Redis
    keys: RunKeys
    secret: str | bytes
    run_id: str | None = None
    """This run's id (a fresh one per ``Trainer.start``): every key it signs with derives from it, so nothing
    an earlier run of the same name left in Redis verifies. None (tests of one piece) falls back to the name."""
    refusals: BoundedLog = field(default_factory=lambda: BoundedLog(logging.getLogger(__name__)), compare=False)
    """What this process refused of the run's keys: counted, and logged at a bounded rate."""

    @classmethod
    def attach(cls, connection: redis.Redis, keys: RunKeys, secret: str | bytes) -> SeedRun:
        """The run as its actor and server processes join it: its id read from the run record; RunStoppedError if
        the run is gone (or its record is no SEED run's)."""
        raw = connection.get(keys.config)
        try:
            config = RunConfig.from_json(raw) if raw is not None else None
        except RecordError:
            config = None
        if config is None or config.extra.get("kind") != SEED_KIND:
            raise RunStoppedError(f"run {keys.run_name!r} has no SEED run record in Redis: it ended or never started")
        return cls(connection, keys, secret, config.run_id)

    @property
    def key_id(self) -> str:
        return self.run_id or self.keys.run_name

    @functools.cached_property  # derived once: actors sign every message with it
    def message_key(self) -> bytes:
        return derive_key(self.secret, "seed-messages", self.key_id)

    @functools.cached_property
    def settings_key(self) -> bytes:
        return derive_key(self.secret, "seed-settings", self.key_id)

    @functools.cached_property
    def weights_key(self) -> bytes:
        return weights_key(self.secret, self.key_id)

    def write(self, settings: Mapping[str, Any], model_factory: Callable[[], nn.Module],
              environment: Callable[[], Any]) -> None:
        """Store settings, model factory and environment for the run's processes (ConfigError if unpicklable)."""
        try:
            model_blob = dumps_object(model_factory, self.secret)
            environment_blob = dumps_object(environment, self.secret)
        except Exception as error:
            raise ConfigError(
                f"cannot pickle the network or environment factory ({type(error).__name__}: {error}); define them "
                f"at module level or as closures over picklable values") from error
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.seed("model"), model_blob)
            pipe.set(self.keys.seed("environment"), environment_blob)
            pipe.delete(self.keys.stopped)  # the flag `rqrl stop` leaves a day (RunStore.stop)
            pipe.set(self.keys.seed("settings"), sign(json.dumps(dict(settings)).encode(), self.settings_key,
                                                      SETTINGS_MAGIC))
            pipe.execute()

    def settings(self) -> dict[str, Any]:
        """The run's settings, verified before they are read: SignatureError for settings a Redis writer without
        the secret rewrote, RecordError if there are none."""
        raw = self.connection.get(self.keys.seed("settings"))
        if not isinstance(raw, bytes):
            raise RecordError(f"run {self.keys.run_name!r} has no SEED settings in Redis: it ended or never started")
        settings = _json_object(verify(raw, self.settings_key, SETTINGS_MAGIC))
        if settings is None:
            raise RecordError(f"run {self.keys.run_name!r}'s signed SEED settings are no JSON object")
        return settings

    def load(self, name: str) -> Any:
        """The signed ``model`` or ``environment`` factory, verified before it is unpickled."""
        blob = self.connection.get(self.keys.seed(name))
        if not isinstance(blob, bytes):
            raise RecordError(f"run {self.keys.run_name!r} has no {name} factory in Redis: it ended or never started")
        return loads_object(blob, self.secret)

    def stopped(self) -> bool:
        """Whether the run's stop flag is set: by its trainer as it shuts down, or by ``rqrl stop RUN``."""
        return bool(self.connection.exists(self.keys.stopped))

    def stop(self) -> bool:
        """Set the run's stop flag; False when a full Redis refused it (the trainer then ends its processes and jobs
        itself, without waiting for them to see it)."""
        return raise_stop_flag(self.connection, self.keys)

    def record(self, config: SeedRecord) -> None:
        """The run's record that every family writes (``rqrl status``, ``health --run`` and ``stop`` read it)."""
        self.connection.set(self.keys.config, config.run_config(self.keys.run_name, self.key_id).to_json())

    def check_in(self, facts: Mapping[str, float]) -> bool:
        """The trainer's heartbeat, as every learner's (RunStore.check_in): its deadline LEARNER_TIMEOUT on, and its
        figures; returns whether the run's stop flag is set, in the same round trip."""
        _, stopped = RunStore(self.connection, self.keys, self.secret).check_in(LEARNER_TIMEOUT, facts)
        return stopped

    def report(self, kind: str, **fields: Any) -> None:
        """Append an event (JSON, signed with the run's message key) for the trainer to log; the list keeps the
        newest EVENTS_KEPT."""
        event = sign(json.dumps({"kind": kind, "time": time.time(), **fields}).encode(), self.message_key,
                     EVENT_MAGIC)
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.rpush(self.keys.seed("events"), event)
            pipe.ltrim(self.keys.seed("events"), -EVENTS_KEPT, -1)
            pipe.execute()

    def take_events(self) -> list[dict[str, Any]]:
        """Events reported since the last call, oldest first; what is not an event (junk a Redis writer planted,
        a key of the wrong type) is dropped, counted in ``junk`` and logged at a bounded rate."""
        key = self.keys.seed("events")
        try:
            with self.connection.pipeline(transaction=True) as pipe:
                pipe.lrange(key, 0, -1)
                pipe.delete(key)
                raw, _ = pipe.execute()
        except redis.ResponseError as error:  # WRONGTYPE: not a list; the trainer owns the key
            self.connection.delete(key)
            self.refuse(f"{key} was no list ({error}); deleted it")
            return []
        events = []
        for item in raw:
            event = self._event(item)
            if event is None:
                self.refuse(f"dropping an entry of {key} that is no event of this run's actors: {item!r:.80}")
            else:
                events.append(event)
        return events

    def _event(self, item: bytes) -> dict[str, Any] | None:
        """The event ``item`` holds if an actor of this run signed it and it has an event's fields, else None."""
        try:
            event = _json_object(verify(item, self.message_key, EVENT_MAGIC))
        except SignatureError:
            return None
        if event is None or any(not isinstance(event.get(name), kind) for name, kind in _EVENT_FIELDS.items()):
            return None
        return event

    def counters(self) -> dict[str, int]:
        """The run's counters: transitions pushed, pushes that found the list full, batches by trigger, ... (a
        value that is no integer is left out)."""
        try:
            raw = self.connection.hgetall(self.keys.seed("stats"))
        except redis.ResponseError as error:
            self.refuse(f"{self.keys.seed('stats')} is no hash ({error})")
            return {}
        counters = {}
        for key, value in raw.items():
            try:
                counters[key.decode() if isinstance(key, bytes) else str(key)] = int(value)
            except ValueError:
                self.refuse(f"dropping the counter {key!r} of {self.keys.seed('stats')}: {value!r:.60}")
        return counters

    def refuse(self, what: str) -> None:
        """Count and log (at a bounded rate) something in the run's keys that is not what rqrl wrote."""
        self.refusals.warning("run %s: %s", self.keys.run_name, what)

    @property
    def junk(self) -> int:
        """How many values of the run's keys this process refused."""
        return self.refusals.count

    def delete(self) -> None:
        """Delete every key of the run (seed keys and weights)."""
        names = list(self.connection.scan_iter(match=self.keys.pattern, count=1000))
        if names:
            self.connection.delete(*names)
