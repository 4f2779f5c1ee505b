"""Versioned policy weights in Redis: write-once blobs per version plus a ``latest`` pointer.

Publishing writes ``weights:{v}`` (no TTL) and moves ``weights:latest`` to ``v`` in one
MULTI/EXEC, and lets the previous version expire ``ttl_seconds`` later. Readers GET the pointer, and
GET the blob it names only when the version moved: that blob lives on for ``ttl_seconds`` after the
next publish, so the second read finds it (and each blob names its version inside, so a read is never
torn). Two plain GETs, not one Lua call: a script that returns a blob copies it into Lua and out again,
21 ms of Redis's one thread per fetch of a 6.7 MB Nature CNN against 0.9 ms for a GET (BENCHMARKS.md).
Memory stays at about one blob per broadcast in the last ``ttl_seconds``.

Each blob is signed (keyed BLAKE3) under the run's weights key (``rqrl.engine.codec.weights_key``) and
names its version inside the signed part. Workers load only a blob that verifies, names the version
the pointer gives and is newer than the one they hold; anything else (forged weights, a forged or
rolled-back pointer, a missing blob) is refused and logged, and they keep the weights they have.
The learner counts its versions on from the newest one it can verify, never from the pointer alone.

A learner's store has its ``learner_token`` (``rqrl.engine.learner_token``): its publish reads the run's token
first and refuses (RunTakenOverError) once another learner resumed the run, so versions come from one learner. A
read, not a WATCH: the learner's ACL user has no WATCH, and a publish that slips in between costs at most one
version whose blob the new learner writes over.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis
import torch

from rqrl.engine.bounded_log import BoundedLog
from rqrl.engine.codec import MAX_ID, WEIGHTS_MAGIC, decode_state_dict, encode_state_dict, read_metadata, sign, verify
from rqrl.engine.keys import RunKeys
from rqrl.engine.learner_token import held_by_another, taken_over_error
from rqrl.engine.sent_commands import SentCommands
from rqrl.errors import RecordError, SignatureError

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 5.0
"""At most one refused-weights warning per this many seconds and process."""
_REFUSALS = BoundedLog(log, LOG_INTERVAL_SECONDS)
"""This process's refusals of weights, logged at a bounded rate (a Redis writer can repeat them at will)."""
Fetched = tuple[int, dict[str, torch.Tensor]]
"""A fetch's result: the version loaded and its state dict."""


class WeightStore:
    """Publish (learner) and fetch (workers) the weights of one run; ``key`` is its weights key."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, key: bytes, ttl_seconds: int = 10,
                 learner_token: str | None = None):
        self.connection = connection
        self.keys = keys
        self.key = key
        self.ttl_seconds = ttl_seconds
        self.learner_token = learner_token
        self._published: int | None = None
        self.refused = 0  # blobs or pointers fetch_if_newer refused

    def publish(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Store a new version and make it the latest; returns its number (1, 2, ...).

        One learner publishes per run; it counts on from last_published(). RunTakenOverError, with nothing
        written, once another learner holds the run.
        """
        if self.learner_token is not None and held_by_another(self.connection.get(self.keys.learner_token),
                                                              self.learner_token):
            raise taken_over_error(self.keys.run_name)
        previous = self.last_published()
        version = previous + 1
        blob = sign(encode_state_dict(state_dict, {"version": str(version)}), self.key, WEIGHTS_MAGIC)
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.weights(version), blob)
            pipe.set(self.keys.latest_version, version)
            if previous:
                pipe.expire(self.keys.weights(previous), self.ttl_seconds)
            pipe.execute()
        self._published = version
        return version

    def last_published(self) -> int:
        """The newest version this run published (0: none): what this store published, else the newest version
        in Redis whose blob verifies (read once). A forged ``latest`` pointer is never counted on from."""
        if self._published is None:
            self._published = self.latest_version() or self._newest_verified_blob()
        return self._published

    def latest_version(self) -> int | None:
        """The version the ``latest`` pointer names, if its blob verifies under this run's key and names it too."""
        pointer = self.connection.get(self.keys.latest_version)
        version = _parse_version(pointer) if isinstance(pointer, bytes) else None
        if version is None:
            return None
        blob = self.connection.get(self.keys.weights(version))
        return version if isinstance(blob, bytes) and self._verifies(blob, version) else None

    def _newest_verified_blob(self) -> int:
        """The highest version among the run's weights blobs that verify (0: none); the pointer did not verify."""
        newest = 0
        for name in self.connection.scan_iter(match=self.keys.weights_prefix + "*", count=1000):
            version = _parse_version(name.decode(errors="replace")[len(self.keys.weights_prefix):])
            if version is not None and version > newest:
                blob = self.connection.get(name)
                if isinstance(blob, bytes) and self._verifies(blob, version):
                    newest = version
        if newest:
            log.warning("run %s: the latest weights pointer does not name a verified blob; counting on from "
                        "version %d, the newest verified one", self.keys.run_name, newest)
        return newest

    def fetch_if_newer(self, held_version: int | None) -> Fetched | None:
        """``(version, state_dict)`` if a verified version newer than ``held_version`` is latest, else None
        (nothing new, or refused and logged: never raises for what Redis holds)."""
        return self.from_pointer(self.connection.get(self.keys.latest_version), held_version)

    def send_fetch(self, held_version: int | None) -> SentFetch:
        """Send ``fetch_if_newer``'s read of the pointer without waiting for the reply: a worker sends it once a
        rollout is stepped and reads it (``SentFetch.result``) once its push is on its way: the check costs no idle
        round trip (new weights cost a second one, for the blob)."""
        sent = SentCommands.send(self.connection, [("GET", self.keys.latest_version)])
        return SentFetch(self, held_version, sent)

    def from_pointer(self, pointer: bytes | str | None, held_version: int | None) -> Fetched | None:
        """The weights the ``latest`` pointer's value ``pointer`` names (as ``fetch_if_newer`` or a ``SentFetch``
        read it) if they are newer than ``held_version`` and verify, else None (refused and logged)."""
        if pointer is None:
            return None
        held = -1 if held_version is None else held_version
        try:
            version = self._newer_version(pointer, held)
            if version is None:
                return None
            blob = self.connection.get(self.keys.weights(version))
            if blob is None:  # the pointer moved on and this blob expired since (ttl_seconds): read it again
                again = self.connection.get(self.keys.latest_version)
                version = None if again is None else self._newer_version(again, held)
                if version is None:  # the run's weights are gone, or it names the version held
                    return None
                blob = self.connection.get(self.keys.weights(version))
            if not isinstance(blob, bytes):
                raise RecordError(f"weights version {version} is latest but its blob is missing")
            state_dict, _ = decode_state_dict(self._payload(blob, version))
        except (SignatureError, RecordError) as error:
            self._refuse(str(error))
            return None
        return version, state_dict

    @staticmethod
    def _newer_version(pointer: bytes | str, held: int) -> int | None:
        """The version ``pointer`` names if it is newer than ``held``; None if it is ``held``; RecordError if it is
        no version number or an older one."""
        version = _parse_version(pointer)
        if version is None:
            raise RecordError(f"the latest weights pointer {pointer!r:.40} is not a version number")
        if version == held:
            return None
        if version < held:
            raise RecordError(f"the latest weights pointer went back from version {held} to {version}")
        return version

    def _payload(self, blob: bytes, version: int) -> bytes:
        """The safetensors buffer of a blob signed under this run's key that names ``version``; SignatureError
        or RecordError otherwise (a signed blob of another version is a replay)."""
        try:
            payload = verify(blob, self.key, WEIGHTS_MAGIC)
        except SignatureError as error:
            raise SignatureError(f"weights version {version}: {error}") from error
        named = read_metadata(payload).get("version")
        if named != str(version):
            raise RecordError(f"weights blob says version {named!r}, pointer says {version}")
        return payload

    def _verifies(self, blob: bytes, version: int) -> bool:
        try:
            self._payload(blob, version)
        except (SignatureError, RecordError):
            return False
        return True

    def _refuse(self, reason: str) -> None:
        """Count and log (at most every LOG_INTERVAL_SECONDS) a refusal; the caller keeps its weights."""
        self.refused += 1
        _REFUSALS.warning("run %s: refusing weights from Redis, keeping the ones held: %s", self.keys.run_name,
                          reason)


class SentFetch:
    """A weights check sent ahead (``WeightStore.send_fetch``); ``result`` reads its reply."""

    def __init__(self, store: WeightStore, held_version: int | None, sent: SentCommands | None):
        self.store, self.held_version, self._sent = store, held_version, sent

    def result(self) -> Fetched | None:
        """What ``fetch_if_newer(held_version)`` gives; asked again the waiting way if the reply was lost or
        was an error (a pointer of the wrong type, say)."""
        replies = None if self._sent is None else self._sent.read(1)
        self._sent = None
        if replies is None or isinstance(replies[0], Exception):
            return self.store.fetch_if_newer(self.held_version)
        return self.store.from_pointer(replies[0], self.held_version)

    def abandon(self) -> None:
        """Close the connection without reading the reply."""
        if self._sent is not None:
            self._sent.abandon()
            self._sent = None


def _parse_version(value: bytes | str) -> int | None:
    """A version number from Redis: a decimal in [1, 2**62), else None."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    version = int(text)
    return version if 1 <= version < MAX_ID else None
