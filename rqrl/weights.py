"""Versioned policy weights in Redis: write-once blobs per version plus a ``latest`` pointer.

Publishing writes ``weights:{v}`` (no TTL) and moves ``weights:latest`` to ``v`` in one
MULTI/EXEC, and lets the previous version expire a few seconds later (readers never need it: they
fetch version and blob in one Lua call, so a read is never torn). Workers fetch the blob only when
the version moved. Memory stays at about one blob per broadcast in the last ``ttl_seconds``.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis
import torch

from rqrl.codec import decode_state_dict, encode_state_dict
from rqrl.errors import RecordError
from rqrl.keys import RunKeys

# KEYS[1] = latest pointer; ARGV[1] = weights key prefix, ARGV[2] = version the caller holds
_FETCH_IF_NEWER = """
local version = redis.call('GET', KEYS[1])
if not version then return {} end
if version == ARGV[2] then return {version} end
return {version, redis.call('GET', ARGV[1] .. version)}
"""


class WeightStore:
    """Publish and fetch the weights of one run."""

    def __init__(self, connection: redis.Redis, keys: RunKeys, ttl_seconds: int = 10):
        self.connection = connection
        self.keys = keys
        self.ttl_seconds = ttl_seconds
        self._fetch = connection.register_script(_FETCH_IF_NEWER)
        self._published: int | None = None

    def publish(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Store a new version and make it the latest; returns its number (1, 2, ...).

        One learner publishes per run; it reads the latest version once, then counts on.
        """
        if self._published is None:
            self._published = self.latest_version() or 0
        previous = self._published or None
        version = self._published + 1
        blob = encode_state_dict(state_dict, {"version": str(version)})
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.weights(version), blob)
            pipe.set(self.keys.latest_version, version)
            if previous is not None:
                pipe.expire(self.keys.weights(previous), self.ttl_seconds)
            pipe.execute()
        self._published = version
        return version

    def latest_version(self) -> int | None:
        value = self.connection.get(self.keys.latest_version)
        return int(value) if value is not None else None

    def fetch_if_newer(self, held_version: int | None) -> tuple[int, dict[str, torch.Tensor]] | None:
        """``(version, state_dict)`` if a version other than ``held_version`` is latest, else None."""
        held = -1 if held_version is None else held_version
        reply = self._fetch(keys=[self.keys.latest_version], args=[self.keys.weights_prefix, held])
        if len(reply) < 2:
            return None
        version, blob = int(reply[0]), reply[1]
        if blob is None:
            raise RecordError(f"weights version {version} is latest but its blob is missing")
        state_dict, metadata = decode_state_dict(blob)
        if metadata.get("version") != str(version):
            raise RecordError(f"weights blob says version {metadata.get('version')!r}, pointer says {version}")
        return version, state_dict
