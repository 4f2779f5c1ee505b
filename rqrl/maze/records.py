"""Pure data: one actor's rollout, batches of rollouts for the learner, and their byte form.

A rollout is time-major ``[T, ...]`` numpy arrays; a batch stacks ``B`` rollouts into
``[T, B, ...]`` torch tensors on the learner's device. Dict observations are kept as dicts
(nested keys flattened with ``/`` on the wire).

On the wire records travel as group entries (``rqrl.maze.group_records``), safetensors buffers signed with
keyed BLAKE3 under the run's records key; the learner checks the tag before it parses anything, then every
field against the run's ``RecordSpec`` (``check_record`` and its group form).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import torch

from rqrl.engine.codec import MAX_ID
from rqrl.engine.observations import Obs, TensorObs, concat_to, flatten_obs, stack_to
from rqrl.errors import RecordError

STEP_FIELDS = ("actions", "rewards", "terminated", "truncated", "log_probs")


@dataclass(frozen=True, kw_only=True)
class RolloutRecord:
    """``T`` consecutive steps of one actor, as produced by one policy version.

    ``final_obs`` holds the last observation of each episode truncated inside the rollout
    (the value to bootstrap from), at the step indices in ``final_obs_steps``; ``next_obs`` is the
    observation after the last step. ``episode_returns``/``episode_lengths`` list the episodes
    that ended in this rollout by the env's own termination or truncation. ``continues_previous``
    says the first observation follows on from the ``next_obs`` of the actor's previous rollout
    (False after a reset, and after a fault re-ran the actor from an earlier rollout).
    """

    obs: Obs
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    log_probs: np.ndarray
    logits: np.ndarray | None
    next_obs: Obs
    final_obs: Obs
    final_obs_steps: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    policy_version: int
    actor_id: int
    rollout_id: int
    worker: str = ""
    continues_previous: bool = False

    def __post_init__(self) -> None:
        for name in (*STEP_FIELDS, "final_obs_steps", "episode_returns", "episode_lengths"):
            if np.ndim(getattr(self, name)) < 1:
                raise RecordError(f"expected {name} to be an array with a time axis, got a scalar")
        steps = len(self.rewards)
        for name in STEP_FIELDS:
            if len(getattr(self, name)) != steps:
                raise RecordError(f"expected {name} of length {steps} (rewards), got {len(getattr(self, name))}")
        if self.logits is not None and len(self.logits) != steps:
            raise RecordError(f"expected logits of length {steps}, got {len(self.logits)}")
        for path, array in flatten_obs(self.obs, "obs").items():
            if np.ndim(array) < 1 or len(array) != steps:
                raise RecordError(f"expected {path} of length {steps}, got {len(array)}")
        if len(self.final_obs_steps) != int(self.truncated.sum()):
            raise RecordError(
                f"expected one final_obs per truncated step ({int(self.truncated.sum())}), "
                f"got {len(self.final_obs_steps)}"
            )

    @classmethod
    def unchecked(cls, **fields: Any) -> RolloutRecord:
        """A record built without ``__post_init__``'s checks, for a caller that checked the same invariants over
        many records at once (``rqrl.maze.group_records``: every array of an entry, not each record's views)."""
        record = object.__new__(cls)
        record.__dict__.update(_UNCHECKED_DEFAULTS, **fields)
        return record

    @property
    def n_steps(self) -> int:
        return len(self.rewards)


_UNCHECKED_DEFAULTS = {item.name: item.default for item in dataclasses.fields(RolloutRecord)
                       if item.default is not dataclasses.MISSING}


RecordSignature: TypeAlias = dict[str, tuple[tuple[int, ...], str]]
"""Array name -> (per-step shape, dtype name), as record_signature gives it."""


def record_signature(record: RolloutRecord) -> RecordSignature:
    """Per-step shape and dtype of every array of a record: rollouts of one run must all agree."""
    arrays = {name: getattr(record, name) for name in STEP_FIELDS}
    if record.logits is not None:
        arrays["logits"] = record.logits
    arrays.update(flatten_obs(record.obs, "obs"))
    return {name: (tuple(np.shape(array)[1:]), _dtype_name(np.asarray(array).dtype)) for name, array in arrays.items()}


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    """str(dtype), remembered: numpy computes it in Python each time, and every record asks for ~7."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def differing_arrays(signature: RecordSignature, reference: RecordSignature) -> list[str]:
    """Names of the arrays whose shape or dtype differ between two record signatures."""
    return sorted(name for name in set(signature) | set(reference) if signature.get(name) != reference.get(name))


@dataclass(frozen=True, kw_only=True)
class RecordSpec:
    """What every rollout record of one run must look like, whoever made it.

    ``signature`` comes from the learner's own probe of the env and policy (the per-step shape and
    dtype of each array); None leaves the arrays' shapes and dtypes unchecked. ``action_bounds`` is
    ``[low, high)`` of a Discrete action space (None: actions' values are not checked).
    """

    n_steps: int
    n_actors: int
    signature: RecordSignature | None = None
    action_bounds: tuple[int, int] | None = None


def check_record(record: RolloutRecord, spec: RecordSpec) -> None:
    """Refuse (RecordError naming the field) a record that does not fit the run: length, actor id, id and
    version ranges, array shapes and dtypes, final observations, and values that would poison training."""
    if record.n_steps != spec.n_steps:
        raise RecordError(f"record has {record.n_steps} steps, this run's rollouts have {spec.n_steps}")
    if not 0 <= record.actor_id < spec.n_actors:
        raise RecordError(f"record names actor {record.actor_id}, this run has actors 0..{spec.n_actors - 1}")
    for name in ("rollout_id", "policy_version"):
        if not 0 <= getattr(record, name) < MAX_ID:
            raise RecordError(f"record's {name} {getattr(record, name)} is outside [0, 2**62)")
    check_signature(record, spec)
    _check_observations(record)
    _check_steps(record)
    _check_values(record, spec)


def check_signature(record: RolloutRecord, spec: RecordSpec) -> None:
    """RecordError naming the arrays whose per-step shape or dtype differ from the run's (none without a
    signature). The records of one group entry view the same arrays, so checking one checks them all."""
    if spec.signature is None:
        return
    signature = record_signature(record)
    if signature != spec.signature:
        different = differing_arrays(signature, spec.signature)
        raise RecordError(
            f"record's arrays {different} are {[signature.get(n) for n in different]} (per-step shape, dtype), "
            f"this run's are {[spec.signature.get(n) for n in different]}"
        )


def _check_observations(record: RolloutRecord) -> None:
    """next_obs is one observation and final_obs one per truncation, of the same arrays as obs."""
    obs = flatten_obs(record.obs, "obs")
    n_final = len(record.final_obs_steps)
    for prefix, leading in (("next_obs", ()), ("final_obs", (n_final,))):
        arrays = flatten_obs(getattr(record, prefix), "obs")  # named as obs's arrays, to compare
        if set(arrays) != set(obs):
            raise RecordError(f"record's {prefix} has arrays {sorted(arrays)}, its obs {sorted(obs)}")
        for name, array in arrays.items():
            expected = (*leading, *obs[name].shape[1:])
            if array.shape != expected or array.dtype != obs[name].dtype:
                raise RecordError(f"record's {prefix}{name[3:]} is {array.dtype}{list(array.shape)}, expected "
                                  f"{obs[name].dtype}{list(expected)}")


def _check_steps(record: RolloutRecord) -> None:
    """final_obs_steps are the truncated steps, in order; no step is both terminated and truncated."""
    steps, truncated = record.final_obs_steps, np.asarray(record.truncated, bool)
    if steps.ndim != 1 or steps.dtype.kind not in "iu":
        raise RecordError(f"record's final_obs_steps is {steps.dtype}{list(steps.shape)}, expected int64[k]")
    if len(steps) and (steps.min() < 0 or steps.max() >= record.n_steps or np.any(np.diff(steps) <= 0)):
        raise RecordError(f"record's final_obs_steps {steps.tolist()[:8]} are not increasing steps in "
                          f"[0, {record.n_steps})")
    if not np.array_equal(steps, np.flatnonzero(truncated)):
        raise RecordError(f"record's final_obs_steps {steps.tolist()[:8]} are not its truncated steps "
                          f"{np.flatnonzero(truncated).tolist()[:8]}")
    if (truncated & np.asarray(record.terminated, bool)).any():
        raise RecordError("record has steps both terminated and truncated")
    returns, lengths = record.episode_returns, record.episode_lengths
    if returns.ndim != 1 or lengths.ndim != 1 or len(returns) != len(lengths) or len(returns) > record.n_steps:
        raise RecordError(f"record's episode_returns {list(returns.shape)} and episode_lengths {list(lengths.shape)} "
                          f"are not two lists of at most {record.n_steps} episodes")


FINITE_FIELDS = ("rewards", "log_probs", "episode_returns", "episode_lengths")
OBSERVATIONS = ("obs", "next_obs", "final_obs")


def require_finite(name: str, array: np.ndarray) -> None:
    """RecordError unless ``array`` holds finite numbers only (what record and group checks refuse alike)."""
    if array.dtype.kind not in "biuf" or not np.isfinite(array).all():
        raise RecordError(f"record's {name} hold values that are not finite numbers")


def _check_values(record: RolloutRecord, spec: RecordSpec) -> None:
    """Values the learner would train on: finite rewards, log-probs and returns, no NaN logits, actions in range."""
    for name in FINITE_FIELDS:
        require_finite(name, getattr(record, name))
    if (record.episode_lengths < 1).any():
        raise RecordError("record's episode_lengths hold lengths below 1")
    if record.logits is not None and (record.logits.dtype.kind != "f" or np.isnan(record.logits).any()):
        raise RecordError("record's logits are NaN or not floats")
    for prefix in OBSERVATIONS:  # what the learner trains on, whatever the policy looked at
        for name, array in flatten_obs(getattr(record, prefix), prefix).items():
            if array.dtype.kind == "f":
                require_finite(name, array)
    if spec.action_bounds is not None:
        low, high = spec.action_bounds
        actions = record.actions
        if actions.dtype.kind not in "iu" or (actions.size and (actions.min() < low or actions.max() >= high)):
            raise RecordError(f"record's actions are not integers in [{low}, {high}) of the run's action space")


@dataclass(frozen=True, kw_only=True)
class BatchedRecord:
    """``B`` rollouts stacked time-major ``[T, B, ...]`` on the learner's device.

    ``final_obs[i]`` is the final observation of the episode truncated at
    ``(final_obs_index[i, 0], final_obs_index[i, 1])`` = (time step, batch column). ``worker`` names
    the worker that produced each column; ``episode_returns``/``episode_lengths`` are the episodes
    that ended inside these rollouts. ``continues_previous[b]`` is False where column b's first
    observation does not follow on from the actor's previous rollout: its first rollout, after a
    cut (marked ``truncated``), and after a fault re-ran its actor group elsewhere.
    """

    obs: TensorObs
    actions: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    log_probs: torch.Tensor
    logits: torch.Tensor | None
    next_obs: TensorObs
    final_obs: TensorObs
    final_obs_index: torch.Tensor
    policy_version: torch.Tensor
    actor_id: torch.Tensor
    rollout_id: torch.Tensor
    worker: tuple[str, ...] = ()
    episode_returns: torch.Tensor = field(repr=False)
    episode_lengths: torch.Tensor = field(repr=False)
    continues_previous: torch.Tensor | None = None

    @property
    def n_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def dones(self) -> torch.Tensor:
        """Maze's ``dones``: ``terminated | truncated`` ``[T, B]`` (a new tensor; keep the two apart to bootstrap
        on truncations, which a ``dones`` mask cannot tell from terminations)."""
        return self.terminated | self.truncated


class CollectedOutputs(NamedTuple):
    """What collect_outputs returns; unpacks like Maze's 4-tuple."""

    record: BatchedRecord
    queue_size_before: int
    queue_size_after: int
    dequeue_time: float


def batch_records(records: Sequence[RolloutRecord], device: torch.device | str) -> BatchedRecord:
    """Stack rollouts of equal length into one time-major batch on ``device``."""
    if not records:
        raise RecordError("cannot batch zero records")
    lengths = {record.n_steps for record in records}
    if len(lengths) != 1:
        raise RecordError(f"expected rollouts of one length, got lengths {sorted(lengths)}")

    def stack(name: str) -> torch.Tensor:
        return torch.from_numpy(np.stack([getattr(r, name) for r in records], axis=1)).to(device)

    final_steps = [r.final_obs_steps for r in records]
    final_columns = np.repeat(np.arange(len(records)), [len(steps) for steps in final_steps])
    final_index = np.stack([np.concatenate(final_steps).astype(np.int64, copy=False), final_columns], axis=1)
    has_logits = all(r.logits is not None for r in records)
    return BatchedRecord(
        obs=stack_to([r.obs for r in records], 1, device),
        actions=stack("actions"),
        rewards=stack("rewards"),
        terminated=stack("terminated"),
        truncated=stack("truncated"),
        log_probs=stack("log_probs"),
        logits=stack("logits") if has_logits else None,
        next_obs=stack_to([r.next_obs for r in records], 0, device),
        final_obs=concat_to([r.final_obs for r in records], device),
        final_obs_index=torch.from_numpy(final_index).to(device),
        policy_version=torch.tensor([r.policy_version for r in records], device=device),
        actor_id=torch.tensor([r.actor_id for r in records], device=device),
        rollout_id=torch.tensor([r.rollout_id for r in records], device=device),
        worker=tuple(r.worker for r in records),
        episode_returns=torch.from_numpy(np.concatenate([r.episode_returns for r in records])).to(device),
        episode_lengths=torch.from_numpy(np.concatenate([r.episode_lengths for r in records])).to(device),
        continues_previous=torch.tensor([r.continues_previous for r in records], dtype=torch.bool, device=device),
    )
