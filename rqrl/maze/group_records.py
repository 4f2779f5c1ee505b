"""One actor group's rollouts of one rollout id as one queue entry: encoded, signed and checked once per group.

A worker's ``ActorGroup`` yields one rollout per actor for the same rollout id and policy version. Sent as
one safetensors buffer (every per-actor array with a leading actor axis; the arrays whose length varies per
actor, final observations and finished episodes, concatenated with per-actor counts), a group costs one
header, one tag, one Redis value and one numpy pass per array instead of one of each per actor: the
per-rollout cost that kept ``collect_outputs`` below the machine's limit with many envs per worker. Workers
encode the group straight from its ``[T, n]`` buffers (``RolloutSteps``, ``encode_steps_group``); the same
bytes as ``encode_group`` makes of its records.

Every queue entry is a group (``rqrl.rollouts.v1``, of one rollout or more); ``decode_signed_entry`` reads it
after the tag check, and never unpickles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rqrl.engine.codec import MAX_ID, RECORD_MAGIC, ArrayParts, decode_arrays, encode_arrays, sign, verified_view
from rqrl.engine.compression import compress, decompress, worth_compressing
from rqrl.engine.frames import pack_series, unpack_series
from rqrl.engine.observations import Obs, empty_like_batch, flatten_obs, select, stack_obs, unflatten_obs
from rqrl.errors import RecordError
from rqrl.maze.records import (
    FINITE_FIELDS,
    OBSERVATIONS,
    STEP_FIELDS,
    RecordSpec,
    RolloutRecord,
    check_signature,
    require_finite,
)

GROUP_FORMAT = "rqrl.rollouts.v1"
ENTRY_BYTES = 1 << 20
"""A group's rollouts go in entries of about this many bytes at most (one rollout alone if it is larger):
Redis spends 3-4x more CPU per byte on a 14-59 MB value than on a 1 MB one (measured; its reply buffers and
query buffer handle a large value in many small pieces)."""
_PER_ACTOR = ("actor_ids", "continues_previous", "final_obs_counts", "episode_counts")
_CONCATENATED = ("final_obs_steps", "episode_returns", "episode_lengths")


class DecodedEntry(NamedTuple):
    """The rollouts of one queue entry, and why their content does not fit the run (None: it fits).

    The content is judged once for the whole entry, but applied per record after the learner's id checks,
    which must see every tagged record (see ``rqrl.maze.inbox``)."""

    records: list[RolloutRecord]
    problem: RecordError | None


def encode_group(records: Sequence[RolloutRecord], run_id: str) -> bytes:
    """One buffer for the rollouts one ``ActorGroup.run`` returned (same rollout id, version, worker, length)."""
    first = records[0]
    if any((r.rollout_id, r.policy_version, r.worker, r.n_steps) != (first.rollout_id, first.policy_version,
                                                                      first.worker, first.n_steps) for r in records):
        raise ValueError("a group entry holds rollouts of one rollout id, policy version, worker and length")
    count = len(records)
    arrays: dict[str, np.ndarray | ArrayParts] = {}

    def stacked(name: str, parts: list[np.ndarray]) -> None:
        arrays[name] = ArrayParts((count, *np.shape(parts[0])), parts)

    def joined(name: str, parts: list[np.ndarray]) -> None:
        arrays[name] = ArrayParts((sum(len(part) for part in parts), *np.shape(parts[0])[1:]), parts)

    for name in STEP_FIELDS:
        stacked(name, [getattr(r, name) for r in records])
    if first.logits is not None:
        stacked("logits", [r.logits for r in records])  # type: ignore[misc]
    flat = {prefix: [flatten_obs(getattr(r, prefix), prefix) for r in records]
            for prefix in ("obs", "next_obs", "final_obs")}
    for name in flat["obs"][0]:
        stacked(name, [leaves[name] for leaves in flat["obs"]])
    for name in flat["next_obs"][0]:
        stacked(name, [leaves[name] for leaves in flat["next_obs"]])
    for name in flat["final_obs"][0]:
        joined(name, [leaves[name] for leaves in flat["final_obs"]])
    for name in _CONCATENATED:
        joined(name, [getattr(r, name) for r in records])
    return _encode_with_actors(arrays, [r.actor_id for r in records], [r.continues_previous for r in records],
                               [len(r.final_obs_steps) for r in records], [len(r.episode_returns) for r in records],
                               first.policy_version, first.rollout_id, first.worker, run_id)


def _encode_with_actors(arrays: dict[str, np.ndarray | ArrayParts], actor_ids: Sequence[int],
                        continues_previous: Sequence[bool], final_obs_counts: Sequence[int],
                        episode_counts: Sequence[int], policy_version: int, rollout_id: int, worker: str,
                        run_id: str, extra_metadata: dict[str, str] | None = None) -> bytes:
    """``arrays`` with the per-actor arrays and the metadata every group entry ends with, encoded."""
    arrays["actor_ids"] = np.array(actor_ids, np.int64)
    arrays["continues_previous"] = np.array(continues_previous, bool)
    arrays["final_obs_counts"] = np.array(final_obs_counts, np.int64)
    arrays["episode_counts"] = np.array(episode_counts, np.int64)
    metadata = {"format": GROUP_FORMAT, "run_id": run_id, "policy_version": str(policy_version),
                "rollout_id": str(rollout_id), "worker": worker, **(extra_metadata or {})}
    return encode_arrays(arrays, metadata)


@dataclass
class RolloutSteps:
    """What stepping ``n`` envs for ``T`` steps collected, before it is split into one record per actor.

    ``obs`` is ``[T + 1, n, ...]`` (row ``T``: the observations after the last step);
    ``actions``/``log_probs``/``logits``/``rewards``/``terminated``/``truncated`` are ``[T, n, ...]``;
    ``final_obs[i]`` lists ``(step, obs)`` of env i's truncations and ``episodes[i]`` its finished
    ``(return, length)``.
    """

    obs: Obs
    actions: np.ndarray
    log_probs: np.ndarray
    logits: np.ndarray | None
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: list[list[tuple[int, Obs]]]
    episodes: list[list[tuple[float, int]]]

    def actors(self, start: int, stop: int) -> RolloutSteps:
        """Envs ``start`` to ``stop`` (excluded) of the group: views of the same buffers."""
        return RolloutSteps(
            obs=select(self.obs, (slice(None), slice(start, stop))), actions=self.actions[:, start:stop],
            log_probs=self.log_probs[:, start:stop],
            logits=None if self.logits is None else self.logits[:, start:stop], rewards=self.rewards[:, start:stop],
            terminated=self.terminated[:, start:stop], truncated=self.truncated[:, start:stop],
            final_obs=self.final_obs[start:stop], episodes=self.episodes[start:stop])

    def records(self, actor_ids: Sequence[int], policy_version: int, rollout_id: int, worker: str,
                continues_previous: bool) -> list[RolloutRecord]:
        return [self.record(index, actor_id, policy_version, rollout_id, worker, continues_previous)
                for index, actor_id in enumerate(actor_ids)]

    def record(self, index: int, actor_id: int, policy_version: int, rollout_id: int, worker: str,
               continues_previous: bool) -> RolloutRecord:
        """Env ``index``'s rollout as a record (its arrays copied out of the ``[T, n]`` buffers)."""
        n_steps = len(self.rewards)
        return RolloutRecord(
            obs=select(self.obs, (slice(0, n_steps), index)),
            actions=self.actions[:, index].copy(),
            rewards=self.rewards[:, index].copy(),
            terminated=self.terminated[:, index].copy(),
            truncated=self.truncated[:, index].copy(),
            log_probs=self.log_probs[:, index].copy(),
            logits=self.logits[:, index].copy() if self.logits is not None else None,
            next_obs=select(self.obs, (n_steps, index)),
            final_obs=(stack_obs([o for _, o in self.final_obs[index]]) if self.final_obs[index]
                       else empty_like_batch(select(self.obs, (n_steps, index)))),
            final_obs_steps=np.array([s for s, _ in self.final_obs[index]], dtype=np.int64),
            episode_returns=np.array([r for r, _ in self.episodes[index]], dtype=np.float64),
            episode_lengths=np.array([n for _, n in self.episodes[index]], dtype=np.int64),
            policy_version=policy_version,
            actor_id=actor_id,
            rollout_id=rollout_id,
            worker=worker,
            continues_previous=continues_previous,
        )


def encode_steps_group(steps: RolloutSteps, actor_ids: Sequence[int], continues_previous: Sequence[bool],
                       policy_version: int, rollout_id: int, worker: str, run_id: str) -> bytes:
    """The buffer ``encode_group`` makes of the group's records, made straight from its ``[T, n]`` buffers: one
    numpy copy per array instead of one record per actor (a worker's cost per rollout). Frame stacks go as their
    unique frames (``rqrl.engine.frames``) and entries with images are compressed (``rqrl.engine.compression``):
    then the bytes differ from ``encode_group``'s, and decode to the same records."""
    n_steps = len(steps.rewards)
    arrays: dict[str, np.ndarray | ArrayParts] = {name: _actor_major(getattr(steps, name)) for name in STEP_FIELDS}
    if steps.logits is not None:
        arrays["logits"] = _actor_major(steps.logits)
    obs = flatten_obs(steps.obs, "obs")
    # an image leaf's T + 1 observations per actor go as one series of unique frames (next_obs is its last step)
    packed = pack_series(arrays, {name: leaf for name, leaf in obs.items() if leaf.ndim >= 5})
    plain = {name: leaf for name, leaf in obs.items() if name + "@frames" not in arrays}
    arrays.update({name: _actor_major(leaf[:n_steps]) for name, leaf in plain.items()})
    arrays.update({"next_obs" + name[3:]: leaf[n_steps] for name, leaf in plain.items()})
    final_names = {name: "final_obs" + name[3:] for name in obs}
    finals = [final for per_actor in steps.final_obs for _, final in per_actor]
    if finals:  # in the observations' order; leaves an env added or dropped go as they are, for the learner to refuse
        final_leaves = flatten_obs(stack_obs(finals), "final_obs")
        arrays.update({final: final_leaves[final] for final in final_names.values() if final in final_leaves})
        arrays.update(final_leaves)
    else:
        arrays.update({final_names[name]: np.zeros((0, *leaf.shape[2:]), leaf.dtype) for name, leaf in obs.items()})
    arrays["final_obs_steps"] = np.array([step for per_actor in steps.final_obs for step, _ in per_actor], np.int64)
    arrays["episode_returns"] = np.array([ret for per_actor in steps.episodes for ret, _ in per_actor], np.float64)
    arrays["episode_lengths"] = np.array([length for per_actor in steps.episodes for _, length in per_actor],
                                         np.int64)
    blob = _encode_with_actors(arrays, actor_ids, continues_previous, [len(finals) for finals in steps.final_obs],
                               [len(episodes) for episodes in steps.episodes], policy_version, rollout_id, worker,
                               run_id, packed)
    return compress(blob) if worth_compressing(obs.values(), 2) else blob


def _actor_major(array: np.ndarray) -> np.ndarray:
    """``[T, n, ...]`` as a contiguous ``[n, T, ...]``: each actor's steps back to back, as the entry lays them."""
    return np.ascontiguousarray(np.swapaxes(array, 0, 1))


def records_per_entry(record: RolloutRecord, entry_bytes: int = ENTRY_BYTES) -> int:
    """How many of a group's rollouts go in one entry: as many as fit ``entry_bytes``, at least one. Counted from
    the arrays whose size is fixed for the run (not final observations or episodes), so every rollout of a group
    is cut the same way and each part keeps its own stream of rollout ids."""
    fixed = [getattr(record, name) for name in STEP_FIELDS] + ([record.logits] if record.logits is not None else [])
    size = sum(array.nbytes for array in fixed)
    size += sum(_sent_bytes(leaf) for leaf in flatten_obs(record.obs, "obs").values())
    size += sum(leaf.nbytes for leaf in flatten_obs(record.next_obs, "next_obs").values())
    return max(1, entry_bytes // max(1, size))


def _sent_bytes(steps: np.ndarray) -> int:
    """About what one rollout's observations of a leaf ``[T, ...]`` weigh in an entry: a frame stack (uint8, a
    first or last axis of 2-32 frames) goes about one frame per step (``rqrl.engine.frames``), anything else
    whole. A guess from the shape, the same for every rollout of the run, so its groups are cut one way."""
    if steps.dtype != np.uint8 or steps.ndim < 4:
        return int(steps.nbytes)
    depth = max((size for size in (steps.shape[1], steps.shape[-1]) if 2 <= size <= 32), default=1)
    return int(steps.nbytes) // depth


def entry_stream(group_id: int, part: int) -> int | str:
    """The queue stream of part ``part`` of a group's entries: the group's id for the first, ``"{group}.{part}"``
    for the others (each part has its own marker of rollout ids pushed)."""
    return group_id if part == 0 else f"{group_id}.{part}"


def encode_signed_group(records: Sequence[RolloutRecord], run_id: str, key: bytes) -> bytes:
    """encode_group, tagged with keyed BLAKE3 under the run's records key (``rqrl.engine.codec.records_key``)."""
    return sign(encode_group(records, run_id), key, RECORD_MAGIC)


def encode_signed_steps(steps: RolloutSteps, actor_ids: Sequence[int], continues_previous: Sequence[bool],
                        policy_version: int, rollout_id: int, worker: str, run_id: str, key: bytes) -> bytes:
    """encode_steps_group, tagged with keyed BLAKE3 under the run's records key (as ``encode_signed_group``)."""
    return sign(encode_steps_group(steps, actor_ids, continues_previous, policy_version, rollout_id, worker, run_id),
                key, RECORD_MAGIC)


def decode_signed_entry(blob: bytes, run_id: str, key: bytes, spec: RecordSpec) -> DecodedEntry:
    """The rollouts of a queue entry of either format; SignatureError before anything is parsed if it was not
    tagged under ``key``, RecordError if it cannot be read as rollouts of this run at all."""
    arrays, metadata = _decode(verified_view(blob, key, RECORD_MAGIC))
    records = _split(arrays, _group_metadata(metadata, run_id))
    try:
        _check_group(arrays, records, spec)
    except RecordError as error:
        return DecodedEntry(records, error)
    return DecodedEntry(records, None)


def decode_group(blob: bytes | memoryview, run_id: str) -> list[RolloutRecord]:
    """The rollouts of an unsigned entry ``encode_group`` made, each checked as RolloutRecord checks it; RecordError
    for anything else. (The learner reads signed entries: ``decode_signed_entry``.)"""
    arrays, metadata = _decode(blob)
    records = _split(arrays, _group_metadata(metadata, run_id))
    try:
        return [dataclasses.replace(record) for record in records]  # the constructor's checks, per record
    except (ValueError, TypeError, IndexError) as error:
        raise RecordError(f"group entry holds a malformed rollout: {error}") from error


def _decode(payload: bytes | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """An entry's arrays and metadata, decompressed and with its packed observation series rebuilt (each as the
    actors' ``obs`` and ``next_obs``)."""
    arrays, metadata = decode_arrays(decompress(payload))
    for name in unpack_series(arrays, metadata, views=True):  # batch_records copies them into the batch
        series = arrays.pop(name)
        if series.ndim < 2 or series.shape[1] < 2:
            raise RecordError(f"group entry's packed {name} is {list(series.shape)}, expected [actors, steps + 1, ...]")
        arrays[name], arrays["next_obs" + name[3:]] = series[:, :-1], series[:, -1]
    return arrays, metadata


def _group_metadata(metadata: dict[str, str], run_id: str) -> dict[str, str]:
    """``metadata`` if it is a group entry's of run ``run_id``, else RecordError."""
    if metadata.get("format") != GROUP_FORMAT:
        raise RecordError(f"expected a {GROUP_FORMAT} entry, got format {metadata.get('format')!r}")
    if metadata.get("run_id") != run_id:
        raise RecordError(f"entry belongs to run {metadata.get('run_id')!r}, not to this run {run_id!r}")
    return metadata


def _counts(arrays: dict[str, np.ndarray], name: str, total_of: str, actors: int) -> np.ndarray:
    """Per-actor counts that must be whole numbers adding up to the length of ``total_of``."""
    counts = arrays[name]
    if counts.shape != (actors,) or counts.dtype.kind not in "iu" or (counts < 0).any():
        raise RecordError(f"group entry's {name} is {counts.dtype}{list(counts.shape)}, expected {actors} counts")
    if int(counts.sum()) != len(arrays[total_of]):
        raise RecordError(f"group entry's {name} add up to {int(counts.sum())}, its {total_of} has "
                          f"{len(arrays[total_of])}")
    return np.concatenate([[0], np.cumsum(counts)])


def _split(arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> list[RolloutRecord]:
    """One record per actor, viewing the entry's arrays (no copy); RecordError if the layout is inconsistent."""
    try:
        actor_ids = arrays["actor_ids"]
        actors = len(actor_ids)
        if actor_ids.ndim != 1 or actors == 0 or actor_ids.dtype.kind not in "iu":
            raise RecordError(f"group entry's actor_ids is {actor_ids.dtype}{list(actor_ids.shape)}")
        per_actor = [name for name in arrays if name not in _CONCATENATED and name not in _PER_ACTOR
                     and not name.startswith("final_obs")]
        for name in (*per_actor, "continues_previous"):
            if arrays[name].ndim < 1 or len(arrays[name]) != actors:
                raise RecordError(f"group entry's {name} has {list(arrays[name].shape)[:1]} rows, "
                                  f"expected one per actor ({actors})")
        _check_step_axes(arrays, per_actor)
        finals = _counts(arrays, "final_obs_counts", "final_obs_steps", actors)
        episodes = _counts(arrays, "episode_counts", "episode_returns", actors)
        final_names = [name for name in arrays if name.startswith("final_obs/") or name == "final_obs"]
        for name in final_names:
            if len(arrays[name]) != len(arrays["final_obs_steps"]):
                raise RecordError(f"group entry's {name} has {len(arrays[name])} rows, its final_obs_steps "
                                  f"{len(arrays['final_obs_steps'])}")
        policy_version, rollout_id = int(metadata["policy_version"]), int(metadata["rollout_id"])
        worker = metadata.get("worker", "")
        continues = arrays["continues_previous"].astype(bool).tolist()
        rows = {name: list(arrays[name]) for name in per_actor}  # each actor's view of every per-actor array
        finals, episodes = finals.tolist(), episodes.tolist()
        plain_obs = all(name in arrays for name in ("obs", "next_obs", "final_obs"))  # no tree to rebuild
        records = []
        for index, actor_id in enumerate(actor_ids.tolist()):
            row = {name: values[index] for name, values in rows.items()}
            final = slice(finals[index], finals[index + 1])
            row.update({name: arrays[name][final] for name in (*final_names, "final_obs_steps")})
            episode = slice(episodes[index], episodes[index + 1])
            # every invariant RolloutRecord.__post_init__ checks was checked above, or is by _check_group, for the
            # whole entry's arrays at once
            records.append(RolloutRecord.unchecked(
                **{name: row[name] for name in STEP_FIELDS}, logits=row.get("logits"),
                obs=row["obs"] if plain_obs else unflatten_obs(row, "obs"),
                next_obs=row["next_obs"] if plain_obs else unflatten_obs(row, "next_obs"),
                final_obs=row["final_obs"] if plain_obs else unflatten_obs(row, "final_obs"),
                final_obs_steps=row["final_obs_steps"],
                episode_returns=arrays["episode_returns"][episode], episode_lengths=arrays["episode_lengths"][episode],
                policy_version=policy_version, actor_id=actor_id, rollout_id=rollout_id, worker=worker,
                continues_previous=continues[index]))
        return records
    except (KeyError, ValueError, TypeError, IndexError) as error:
        raise RecordError(f"group entry is missing or has a malformed field: {error}") from error


def _check_step_axes(arrays: dict[str, np.ndarray], per_actor: list[str]) -> None:
    """Every per-step array (actions, rewards, ..., logits, observations) has the same number of steps per actor:
    what RolloutRecord checks of each record, checked once for the entry."""
    for name in STEP_FIELDS:
        if name not in arrays:
            raise RecordError(f"group entry has no {name}")
    steps = arrays["rewards"].shape[1] if arrays["rewards"].ndim >= 2 else None
    for name in per_actor:
        if name in STEP_FIELDS or name == "logits" or name == "obs" or name.startswith("obs/"):
            if steps is None or arrays[name].ndim < 2 or arrays[name].shape[1] != steps:
                raise RecordError(f"group entry's {name} is {list(arrays[name].shape)}, expected [actors, steps, ...] "
                                  f"with the steps of its rewards {list(arrays['rewards'].shape)}")


def _check_group(arrays: dict[str, np.ndarray], records: list[RolloutRecord], spec: RecordSpec) -> None:
    """``check_record`` for every record of the entry at once, one numpy pass per array (RecordError naming the
    field). What differs per record (ids, duplicates, versions) is the inbox's to check."""
    first, actor_ids = records[0], arrays["actor_ids"]
    if first.n_steps != spec.n_steps:
        raise RecordError(f"record has {first.n_steps} steps, this run's rollouts have {spec.n_steps}")
    if actor_ids.min() < 0 or actor_ids.max() >= spec.n_actors or len(np.unique(actor_ids)) != len(actor_ids):
        raise RecordError(f"group entry names actors {actor_ids.tolist()[:8]}, this run has distinct actors "
                          f"0..{spec.n_actors - 1}")
    for name in ("rollout_id", "policy_version"):
        if not 0 <= getattr(first, name) < MAX_ID:
            raise RecordError(f"record's {name} {getattr(first, name)} is outside [0, 2**62)")
    check_signature(first, spec)
    _check_observations(arrays)
    _check_steps(arrays)
    _check_values(arrays, spec)


def _check_observations(arrays: dict[str, np.ndarray]) -> None:
    """next_obs is one observation per actor and final_obs one per truncation, of the same arrays as obs."""
    obs = {name: array for name, array in arrays.items() if name == "obs" or name.startswith("obs/")}
    for prefix, rows in (("next_obs", len(arrays["actor_ids"])), ("final_obs", len(arrays["final_obs_steps"]))):
        leaves = {"obs" + name[len(prefix):]: array for name, array in arrays.items()
                  if name == prefix or name.startswith(prefix + "/")}
        if set(leaves) != set(obs):
            raise RecordError(f"record's {prefix} has arrays {sorted(leaves)}, its obs {sorted(obs)}")
        for name, array in leaves.items():
            expected = (rows, *obs[name].shape[2:])
            if array.shape != expected or array.dtype != obs[name].dtype:
                raise RecordError(f"record's {prefix}{name[3:]} is {array.dtype}{list(array.shape)}, expected "
                                  f"{obs[name].dtype}{list(expected)}")


def _check_steps(arrays: dict[str, np.ndarray]) -> None:
    """Each actor's final_obs_steps are its truncated steps, in order; no step is both terminated and truncated."""
    steps, truncated, terminated = arrays["final_obs_steps"], arrays["truncated"], arrays["terminated"]
    if steps.ndim != 1 or steps.dtype.kind not in "iu":
        raise RecordError(f"record's final_obs_steps is {steps.dtype}{list(steps.shape)}, expected int64[k]")
    if truncated.ndim != 2 or terminated.shape != truncated.shape:
        raise RecordError(f"record's terminated {list(terminated.shape)} and truncated {list(truncated.shape)} are "
                          f"not [actors, steps]")
    truncated = truncated.astype(bool, copy=False)
    rows, columns = np.nonzero(truncated)  # row-major: each actor's truncated steps in order
    counts = np.bincount(rows, minlength=len(truncated))
    if not np.array_equal(counts, arrays["final_obs_counts"]) or not np.array_equal(columns, steps):
        raise RecordError(f"record's final_obs_steps {steps.tolist()[:8]} are not its truncated steps "
                          f"{columns.tolist()[:8]}")
    if (truncated & terminated.astype(bool, copy=False)).any():
        raise RecordError("record has steps both terminated and truncated")
    returns, lengths = arrays["episode_returns"], arrays["episode_lengths"]
    if returns.ndim != 1 or lengths.ndim != 1 or len(returns) != len(lengths) or (
            arrays["episode_counts"] > truncated.shape[1]).any():
        raise RecordError(f"record's episode_returns {list(returns.shape)} and episode_lengths {list(lengths.shape)} "
                          f"are not two lists of at most {truncated.shape[1]} episodes per actor")


def _check_values(arrays: dict[str, np.ndarray], spec: RecordSpec) -> None:
    """Values the learner would train on: finite rewards, log-probs and returns, no NaN logits, actions in range."""
    for name in FINITE_FIELDS:
        require_finite(name, arrays[name])
    if (arrays["episode_lengths"] < 1).any():
        raise RecordError("record's episode_lengths hold lengths below 1")
    logits = arrays.get("logits")
    if logits is not None and (logits.dtype.kind != "f" or np.isnan(logits).any()):
        raise RecordError("record's logits are NaN or not floats")
    for name, array in arrays.items():  # observations the learner trains on (a policy that ignores them would not)
        if array.dtype.kind == "f" and name.split("/")[0] in OBSERVATIONS:
            require_finite(name, array)
    if spec.action_bounds is not None:
        low, high = spec.action_bounds
        actions = arrays["actions"]
        if actions.dtype.kind not in "iu" or (actions.size and (actions.min() < low or actions.max() >= high)):
            raise RecordError(f"record's actions are not integers in [{low}, {high}) of the run's action space")
