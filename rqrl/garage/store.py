"""The garage sampler's protocol in Redis, shared by the sampler (``rqrl.garage.sampler``) and its job
(``rqrl.garage.jobs``): calls, update chains, update blobs and the idempotent, version-fenced episode push.

Every ``obtain_*`` call is a *version* ``v``. The sampler writes the call's updates and its
``SamplerCall`` (mode, count, each logical worker's update chains) and moves ``version`` to ``v`` in
one MULTI/EXEC. A job pushes episode ``k`` of logical worker ``w`` with a Lua script that refuses it
unless ``version == v``, the call is not done and the job still holds its group's lease, and that
ignores a second push of the same ``(w, k)``: so no step of an earlier call is ever returned, and a
re-run of a killed job cannot deliver an episode twice.

An update *chain* lists the updates (``(version, scope, kind)``) that turn a fresh logical worker
into the current one, so a logical worker rebuilt on another process replays them: an agent chain
is the last policy object and the parameters sent after it; an env chain is the last env that
replaced the old one, then the updates stacked on it (a ``SetTaskUpdate`` supersedes the previous one).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import redis
import torch

from rqrl.engine.codec import (
    WEIGHTS_MAGIC,
    decode_arrays,
    decode_state_dict,
    dumps_object,
    encode_arrays,
    encode_state_dict,
    loads_object,
    sign,
    verify,
)
from rqrl.engine.keys import RunKeys
from rqrl.errors import RecordError, SignatureError
from rqrl.garage.worker import ExistingEnvUpdate, NewEnvUpdate, SetTaskUpdate

SAMPLES, EXACT = "samples", "exact"
"""The two call modes: obtain_samples (steps) and obtain_exact_episodes (episodes per worker)."""

AGENT, ENV = "agent", "env"
REPLACE, OVERRIDE, STACK = "replace", "override", "stack"
"""Chain entry kinds: starts the chain afresh; supersedes the previous entry of its kind; applies on top."""

ChainEntry = tuple[int, int, str]
"""(version, scope, kind): scope -1 is the update every worker got, else the worker's own."""

class EpisodePush(enum.IntEnum):
    """What the sampler's episode push script answers."""

    DUPLICATE = 0
    PUSHED = 1
    STALE = -1
    STOPPED = -2
    LEASE_LOST = -3

# KEYS: version, done:{v}, stopped, have:{v}, episodes:{v}, next:{v}, stale, lease:{group}
# ARGV: v, worker, episode index, episode length, blob, lease holder
_PUSH = """
if redis.call('EXISTS', KEYS[3]) == 1 then return -2 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[7])
  return -1
end
if redis.call('GET', KEYS[8]) ~= ARGV[6] then return -3 end
if redis.call('HSETNX', KEYS[4], ARGV[2] .. ':' .. ARGV[3], 1) == 0 then return 0 end
redis.call('RPUSH', KEYS[5], ARGV[5])
redis.call('HSET', KEYS[6], ARGV[2], tonumber(ARGV[3]) + 1)
redis.call('HINCRBY', KEYS[6], ARGV[2] .. ':steps', ARGV[4])
return 1
"""


# ---- update chains ----------------------------------------------------------------------------------------

def agent_kind(update: Any) -> str | None:
    """Parameters override the previous ones; any other object replaces the agent; None changes nothing."""
    if update is None:
        return None
    return OVERRIDE if isinstance(update, dict | tuple | np.ndarray) else REPLACE


def env_kind(update: Any) -> str | None:
    """An env, NewEnvUpdate or ExistingEnvUpdate replaces the env; a SetTaskUpdate overrides the previous
    task; any other EnvUpdate or callable is applied on top; None changes nothing."""
    if update is None:
        return None
    if isinstance(update, gymnasium.Env | NewEnvUpdate | ExistingEnvUpdate):
        return REPLACE
    return OVERRIDE if isinstance(update, SetTaskUpdate) else STACK


def extend_chain(chain: Sequence[ChainEntry], entry: ChainEntry) -> list[ChainEntry]:
    """``chain`` after ``entry``: a REPLACE starts afresh, an OVERRIDE drops the previous OVERRIDE."""
    kind = entry[2]
    if kind == REPLACE:
        return [entry]
    if kind == OVERRIDE:
        return [e for e in chain if e[2] != OVERRIDE] + [entry]
    return [*chain, entry]


def plan_chain(applied: Sequence[ChainEntry], target: Sequence[ChainEntry]) -> tuple[bool, list[ChainEntry]]:
    """How a logical worker that has ``applied`` reaches ``target``: ``(rebuild, entries to apply)``.
    Incremental when both start alike and what ``target`` dropped are superseded OVERRIDEs; else rebuild."""
    target = [tuple(e) for e in target]  # type: ignore[misc]
    applied = [tuple(e) for e in applied]  # type: ignore[misc]
    if not applied or not target or applied[0] != target[0]:
        return True, list(target)
    if any(entry[2] != OVERRIDE for entry in applied if entry not in target):
        return True, list(target)
    return False, [entry for entry in target if entry not in applied]


# ---- update blobs -----------------------------------------------------------------------------------------

_STATE_DICT, _ARRAYS, _PICKLE = b"T", b"N", b"P"


UPDATE_MAGIC = b"RQRLUPD2"
"""The envelope of an update blob: tagged under the run's weights key together with the key it is stored at."""
CALL_MAGIC = b"RQRLCAL2"
"""A call spec, tagged under the run's weights key, its version inside."""


def encode_update(value: Any, secret: str | bytes, weights_key: bytes, binding: str) -> bytes:
    """One update as bytes, bound to ``binding`` (the Redis key it is stored at: run, call, role and scope): a
    dict of tensors as safetensors and a dict, tuple or ndarray of numpy arrays as safetensors; anything else (a
    policy object, an env, an EnvUpdate, a callable) as cloudpickle signed with the secret. The whole is tagged
    under the run's weights key with ``binding``, so a blob copied to another call's key is refused."""
    return sign(binding.encode() + b"\n" + _encode_value(value, secret, weights_key), weights_key, UPDATE_MAGIC)


def _encode_value(value: Any, secret: str | bytes, weights_key: bytes) -> bytes:
    if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()) \
            and all(isinstance(k, str) for k in value):
        return _STATE_DICT + sign(encode_state_dict(value, {"kind": "dict"}), weights_key, WEIGHTS_MAGIC)
    arrays = _as_arrays(value)
    if arrays is not None:
        kind, named = arrays
        return _ARRAYS + sign(encode_arrays(named, {"kind": kind}), weights_key, WEIGHTS_MAGIC)
    return _PICKLE + dumps_object(value, secret)


def _as_arrays(value: Any) -> tuple[str, dict[str, np.ndarray]] | None:
    """(kind, named arrays) for an ndarray, a tuple of them or a dict of them (numeric), else None."""
    def numeric(array: Any) -> bool:
        return isinstance(array, np.ndarray) and array.dtype.kind in "biuf"

    if numeric(value):
        return "ndarray", {"0": value}
    if isinstance(value, tuple) and value and all(numeric(v) for v in value):
        return "tuple", {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict) and value and all(isinstance(k, str) and numeric(v) for k, v in value.items()):
        return "dict", dict(value)
    return None


def decode_update(blob: bytes, secret: str | bytes, weights_key: bytes, binding: str) -> Any:
    """Inverse of encode_update; SignatureError for an untagged or tampered blob or one made for another key
    (another call's update copied here), RecordError for junk."""
    bound, _, inner = verify(blob, weights_key, UPDATE_MAGIC).partition(b"\n")
    if bound != binding.encode():
        raise SignatureError(f"refusing the update at {binding}: it was signed for {bound[:200]!r} (copied from "
                             f"another call?)")
    return _decode_value(inner, secret, weights_key)


def _decode_value(blob: bytes, secret: str | bytes, weights_key: bytes) -> Any:
    tag, body = blob[:1], blob[1:]
    if tag == _PICKLE:
        return loads_object(body, secret)
    if tag == _STATE_DICT:
        tensors, _ = decode_state_dict(verify(body, weights_key, WEIGHTS_MAGIC))
        return dict(tensors)
    if tag == _ARRAYS:
        arrays, metadata = decode_arrays(verify(body, weights_key, WEIGHTS_MAGIC))
        kind = metadata.get("kind")
        if kind == "ndarray":
            return arrays["0"]
        if kind == "tuple":
            return tuple(arrays[str(i)] for i in range(len(arrays)))
        return dict(arrays)
    raise RecordError(f"an update blob starts with {tag!r}, not one of T, N, P: it is not rqrl's")


# ---- calls ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplerCall:
    """One obtain_* call as its jobs read it: the mode, its count (steps or episodes per worker), and each
    logical worker's agent and env chains."""

    mode: str
    count: int
    agent_chains: list[list[ChainEntry]]
    env_chains: list[list[ChainEntry]]

    def to_json(self) -> str:
        return json.dumps({"mode": self.mode, "count": self.count, "agent": self.agent_chains,
                           "env": self.env_chains})

    @classmethod
    def from_json(cls, raw: bytes | str, n_workers: int) -> SamplerCall:
        """The call, checked; RecordError if it is not what a sampler writes."""
        try:
            data = json.loads(raw)
            call = cls(mode=data["mode"], count=int(data["count"]),
                       agent_chains=[[(int(v), int(s), str(k)) for v, s, k in chain] for chain in data["agent"]],
                       env_chains=[[(int(v), int(s), str(k)) for v, s, k in chain] for chain in data["env"]])
        except (ValueError, KeyError, TypeError) as error:
            raise RecordError(f"a sampler call is not the JSON a sampler writes: {error}") from error
        if call.mode not in (SAMPLES, EXACT) or call.count < 1 or len(call.agent_chains) != n_workers \
                or len(call.env_chains) != n_workers:
            raise RecordError(f"a sampler call has mode {call.mode!r}, count {call.count} and chains for "
                              f"{len(call.agent_chains)}/{len(call.env_chains)} workers; expected {n_workers}")
        return call


class SamplerStore:
    """One sampler run's calls and episodes in Redis."""

    def __init__(self, connection: redis.Redis, keys: RunKeys):
        self.connection, self.keys = connection, keys
        self._push = connection.register_script(_PUSH)

    # -- the sampler's side --

    def begin(self, version: int, call: SamplerCall, blobs: Mapping[str, bytes], weights_key: bytes) -> None:
        """Write the call's update blobs and the call (signed under the run's weights key, with its version), move
        ``version`` to it and clear old error reports, in one transaction."""
        with self.connection.pipeline(transaction=True) as pipe:
            self._write_call(pipe, version, call, blobs, weights_key)
            pipe.delete(self.keys.errors)
            pipe.execute()

    def restore(self, version: int, call: SamplerCall, blobs: Mapping[str, bytes], weights_key: bytes,
                progress: Mapping[int, tuple[int, int]] | None) -> None:
        """Write call ``version`` again after Redis lost it (a restart without persistence): ``blobs`` (every
        update its chains use), the call and the version, in one transaction. With ``progress`` (the call is in
        flight: per logical worker, the episodes 0..k-1 the sampler holds and their steps) its jobs start at
        episode k and refuse the held ones as duplicates; without, the call is marked finished."""
        keys = self.keys
        with self.connection.pipeline(transaction=True) as pipe:
            self._write_call(pipe, version, call, blobs, weights_key)
            if progress is None:
                pipe.set(keys.sampler_done(version), 1)
            for worker, (k, steps) in (progress or {}).items():
                if k:
                    pipe.hset(keys.sampler_next(version), mapping={str(worker): k, f"{worker}:steps": steps})
                    pipe.hset(keys.sampler_have(version), mapping={f"{worker}:{j}": 1 for j in range(k)})
            pipe.execute()

    def _write_call(self, pipe: Any, version: int, call: SamplerCall, blobs: Mapping[str, bytes],
                    weights_key: bytes) -> None:
        """Queue the writes of the call's update blobs, its signed spec (its version inside) and the version."""
        signed_call = sign(json.dumps({"version": version, "call": json.loads(call.to_json())}).encode(),
                           weights_key, CALL_MAGIC)
        for key, blob in blobs.items():
            pipe.set(key, blob)
        pipe.set(self.keys.sampler_call(version), signed_call)
        pipe.set(self.keys.sampler_version, version)

    def forget(self, version: int, unused_blobs: Sequence[str]) -> int:
        """Delete what an earlier call left (and ``unused_blobs``); returns the episodes it dropped: those
        still queued, and those refused as stale since the last forget."""
        keys = self.keys
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.llen(keys.sampler_episodes(version))
            pipe.getdel(keys.sampler_stale)
            pipe.delete(keys.sampler_episodes(version), keys.sampler_have(version), keys.sampler_next(version),
                        keys.sampler_done(version), keys.sampler_call(version), *unused_blobs)
            queued, stale, _ = pipe.execute()
        return int(queued) + int(stale or 0)

    def finish(self, version: int) -> None:
        """The call has what it needs: its jobs drop their episodes in flight and stop."""
        self.connection.set(self.keys.sampler_done(version), 1)

    def pop(self, version: int, count: int, timeout: float) -> list[bytes]:
        """Up to ``count`` pushed episodes of ``version``, waiting up to ``timeout`` s for the first."""
        key = self.keys.sampler_episodes(version)
        popped = self.connection.lpop(key, count)
        if popped:
            return list(popped)  # type: ignore[arg-type]
        if timeout <= 0:
            return []
        first = self.connection.blpop([key], timeout=timeout)
        if first is None:
            return []
        rest = self.connection.lpop(key, count - 1) if count > 1 else None
        return [first[1], *(rest or [])]

    def progress(self, version: int) -> dict[int, tuple[int, int]]:
        """Per logical worker that pushed in ``version``: (next episode index, steps pushed)."""
        return _parse_progress(self.connection.hgetall(self.keys.sampler_next(version)))

    # -- the job's side --

    def current_version(self) -> int | None:
        value = self.connection.get(self.keys.sampler_version)
        try:
            return None if value is None else int(value)
        except ValueError:
            return None

    def call_over(self, version: int) -> bool:
        """Whether call ``version`` is over (finished or superseded), in one round trip."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.sampler_version)
            pipe.exists(self.keys.sampler_done(version))
            current, done = pipe.execute()
        return _over(version, current, done)

    def count_dropped(self, episodes: int) -> None:
        """Count ``episodes`` a job dropped unfinished when its call turned out over (the sampler adds them to
        ``dropped_episodes`` with those refused as stale)."""
        if episodes:
            self.connection.incrby(self.keys.sampler_stale, episodes)

    def pace(self, version: int) -> tuple[dict[int, tuple[int, int]], bool]:
        """``progress(version)`` and whether the call is over (superseded or finished), in one round trip."""
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.sampler_next(version))
            pipe.get(self.keys.sampler_version)
            pipe.exists(self.keys.sampler_done(version))
            raw, current, done = pipe.execute()
        return _parse_progress(raw), _over(version, current, done)

    def read_call(self, version: int, n_workers: int, weights_key: bytes) -> SamplerCall | None:
        """The call of ``version``, or None once the sampler forgot it; SignatureError for a call spec the sampler
        did not sign, or signed for another call, RecordError for one that does not parse."""
        raw = self.connection.get(self.keys.sampler_call(version))
        if raw is None:
            return None
        try:
            signed = json.loads(verify(raw if isinstance(raw, bytes) else raw.encode(), weights_key, CALL_MAGIC))
            if signed["version"] != version:
                raise SignatureError(f"refusing call {version}'s spec: it was signed for call {signed['version']!r}")
            return SamplerCall.from_json(json.dumps(signed["call"]), n_workers)
        except (ValueError, KeyError, TypeError) as error:
            raise RecordError(f"call {version}'s signed spec is not what a sampler writes: {error}") from error

    def read_blobs(self, keys: Sequence[str]) -> list[bytes | None]:
        return list(self.connection.mget(keys)) if keys else []  # type: ignore[arg-type]

    def push(self, version: int, group_id: int, worker: int, episode: int, length: int, blob: bytes,
             holder: str) -> EpisodePush:
        """Push one episode; PUSHED, DUPLICATE (a re-run's), STALE (the call is over), STOPPED or LEASE_LOST."""
        keys = self.keys
        return EpisodePush(self._push(
            keys=[keys.sampler_version, keys.sampler_done(version), keys.stopped, keys.sampler_have(version),
                  keys.sampler_episodes(version), keys.sampler_next(version), keys.sampler_stale,
                  keys.lease(group_id)],
            args=[version, worker, episode, length, blob, holder]))


def _parse_progress(raw: dict[Any, Any]) -> dict[int, tuple[int, int]]:
    counts: dict[int, list[int]] = {}
    for field, value in raw.items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        worker, _, what = name.partition(":")
        try:
            counts.setdefault(int(worker), [0, 0])[1 if what == "steps" else 0] = int(value)
        except ValueError:
            continue
    return {worker: (k, steps) for worker, (k, steps) in counts.items()}


def _over(version: int, current: bytes | str | None, done: int) -> bool:
    """A call is over once it is done or ``version`` moved on (or is gone: the run stopped)."""
    return bool(done) or current is None or current not in (str(version).encode(), str(version))
