"""garage's episode data types: ``StepType``, ``EnvSpec`` and ``EpisodeBatch``, plus their safetensors wire form.

The data layer of rqrl's garage-compatible sampler (numpy and gymnasium only; no Redis, no torch).
``EpisodeBatch`` mirrors ``garage.EpisodeBatch`` (v2021.03): N whole episodes, S = sum(lengths) steps,
validated on construction with messages naming the field and both sizes. Observations may be dict
trees (gymnasium Dict spaces); infos are dicts of arrays, nested dicts allowed.

>>> import gymnasium, numpy as np
>>> spec = EnvSpec(gymnasium.spaces.Box(-1, 1, (2,)), gymnasium.spaces.Discrete(2), max_episode_length=3)
>>> batch = EpisodeBatch(spec, {}, np.zeros((3, 2)), np.ones((1, 2)), np.array([0, 1, 0]), np.ones(3), {}, {},
...                      np.array([StepType.FIRST, StepType.MID, StepType.TERMINAL]), np.array([3]))
>>> batch.next_observations[-1], batch.terminals.tolist()
(array([1., 1.]), [False, False, True])
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from rqrl.engine.codec import decode_arrays, encode_arrays
from rqrl.engine.compression import compress, decompress, worth_compressing
from rqrl.engine.frames import pack_series, unpack_series
from rqrl.engine.observations import Obs, flatten_obs, map_tree, unflatten_obs
from rqrl.errors import RecordError

Infos = dict[str, Any]
"""A dict of arrays with a leading batch axis, or of nested dicts of them."""

STEP_TYPE_DTYPE = np.uint8
"""The dtype ``EpisodeBatch`` stores step types in (compare with ``StepType`` members, which are ints)."""


class StepType(enum.IntEnum):
    """Where a step lies in its episode (garage's enum, same values)."""

    FIRST = 0
    MID = 1
    TERMINAL = 2
    TIMEOUT = 3

    @classmethod
    def get_step_type(cls, step_cnt: int, max_episode_length: int | None, done: bool,
                      truncated: bool = False) -> StepType:
        """The type of the ``step_cnt``-th step (1-based): TERMINAL if the env terminated (``done``), even on the
        last allowed step; TIMEOUT if it truncated or ``max_episode_length`` cut it; else FIRST or MID."""
        if step_cnt < 1:
            raise ValueError(f"Expect step_cnt to be >= 1, but got {step_cnt} instead. Did you forget to call "
                             f"`reset()`?")
        if done:
            return cls.TERMINAL
        if truncated or (max_episode_length is not None and step_cnt >= max_episode_length):
            return cls.TIMEOUT
        return cls.FIRST if step_cnt == 1 else cls.MID


@dataclass(frozen=True)
class EnvSpec:
    """What an EpisodeBatch needs to know of its env: its spaces and the longest episode (garage's EnvSpec)."""

    observation_space: gymnasium.Space[Any]
    action_space: gymnasium.Space[Any]
    max_episode_length: int | None = None


@dataclass(frozen=True, eq=False)  # arrays have no truth value: compare batches field by field
class EpisodeBatch:
    """N whole episodes, S = sum(lengths) steps, as garage's EpisodeBatch (field order and names kept).

    ``episode_infos`` (read back as ``episode_infos_by_episode``) holds arrays of N entries; observations,
    actions, rewards, step_types and the info dicts hold S; ``last_observations`` holds, per episode, the
    observation after its final action. Step types are stored as ``STEP_TYPE_DTYPE`` integers.
    """

    env_spec: EnvSpec
    episode_infos_by_episode: Infos
    observations: Obs
    last_observations: Obs
    actions: Obs
    rewards: np.ndarray
    env_infos: Infos
    agent_infos: Infos
    step_types: np.ndarray
    lengths: np.ndarray

    def __init__(self, env_spec: EnvSpec, episode_infos: Infos, observations: Obs, last_observations: Obs,
                 actions: Obs, rewards: np.ndarray, env_infos: Infos, agent_infos: Infos, step_types: np.ndarray,
                 lengths: np.ndarray) -> None:
        # garage's constructor argument is `episode_infos`; the field keeps its by-episode name
        for name, value in (("env_spec", env_spec), ("episode_infos_by_episode", episode_infos),
                            ("observations", observations), ("last_observations", last_observations),
                            ("actions", actions), ("rewards", rewards), ("env_infos", env_infos),
                            ("agent_infos", agent_infos), ("step_types", step_types), ("lengths", lengths)):
            object.__setattr__(self, name, value)
        self._validate()

    def _validate(self) -> None:
        lengths = self.lengths
        if not isinstance(lengths, np.ndarray) or lengths.ndim != 1:
            raise ValueError(f"lengths has shape {np.shape(lengths)} but must be a 1-D array of shape (N,)")
        if lengths.dtype.kind not in "iu":
            raise ValueError(f"lengths has dtype {lengths.dtype} but must be an integer array")
        if np.any(lengths < 1):
            raise ValueError(f"lengths must all be >= 1 (whole episodes), got {lengths.tolist()}")
        n_episodes, n_steps = len(lengths), int(lengths.sum())
        if not isinstance(self.env_spec, EnvSpec):
            raise ValueError(f"env_spec must be an rqrl EnvSpec, got {type(self.env_spec).__name__}")
        _check_infos("episode_infos", self.episode_infos_by_episode, n_episodes, "len(lengths)")
        _check_rows("last_observations", self.last_observations, n_episodes, "len(lengths)")
        _check_space("last_observations", self.last_observations, self.env_spec.observation_space)
        _check_rows("observations", self.observations, n_steps, "sum(lengths)")
        _check_space("observations", self.observations, self.env_spec.observation_space)
        _check_rows("actions", self.actions, n_steps, "sum(lengths)")
        _check_space("actions", self.actions, self.env_spec.action_space)
        for name in ("rewards", "step_types"):
            value = getattr(self, name)
            if not isinstance(value, np.ndarray):
                raise ValueError(f"{name} must be a numpy array, got {type(value).__name__}")
            if value.shape != (n_steps,):
                raise ValueError(f"{name} has shape {value.shape}, expected ({n_steps},) = (sum(lengths),)")
        _check_infos("env_infos", self.env_infos, n_steps, "sum(lengths)")
        _check_infos("agent_infos", self.agent_infos, n_steps, "sum(lengths)")
        object.__setattr__(self, "step_types", _as_step_types(self.step_types))

    # --- derived views -------------------------------------------------------------------------------

    @property
    def episode_infos(self) -> Infos:
        """Per-episode infos repeated to one entry per step (S, ...)."""
        return map_tree(lambda array: np.repeat(array, self.lengths, axis=0), self.episode_infos_by_episode)

    @property
    def terminals(self) -> np.ndarray:
        """(S,) bool: the steps where the env terminated (TIMEOUT steps are not terminals)."""
        return self.step_types == StepType.TERMINAL

    @property
    def next_observations(self) -> Obs:
        """(S, ...): each episode's observations shifted by one, ending with its last observation."""
        parts = []
        for index, (start, stop) in enumerate(self._ranges()):
            parts.append(_take(self.observations, slice(start + 1, stop)))
            parts.append(_take(self.last_observations, slice(index, index + 1)))
        return _concat(parts)

    @property
    def observations_list(self) -> list[Obs]:
        """One (T_i, ...) observation array (or dict) per episode."""
        return [_take(self.observations, slice(start, stop)) for start, stop in self._ranges()]

    @property
    def actions_list(self) -> list[Obs]:
        """One (T_i, ...) action array per episode."""
        return [_take(self.actions, slice(start, stop)) for start, stop in self._ranges()]

    @property
    def padded_observations(self) -> Obs:
        """(N, max_length, ...) observations, zero-padded after each episode's end."""
        return self._pad(self.observations)

    @property
    def padded_next_observations(self) -> Obs:
        """(N, max_length, ...) next observations, zero-padded."""
        return self._pad(self.next_observations)

    @property
    def padded_actions(self) -> Obs:
        """(N, max_length, ...) actions, zero-padded."""
        return self._pad(self.actions)

    @property
    def padded_rewards(self) -> np.ndarray:
        """(N, max_length) rewards, zero-padded."""
        return self._pad(self.rewards)

    @property
    def padded_step_types(self) -> np.ndarray:
        """(N, max_length) step types, zero-padded (0 is FIRST: mask with ``valids``)."""
        return self._pad(self.step_types)

    @property
    def padded_env_infos(self) -> Infos:
        """Env infos as (N, max_length, ...) arrays, zero-padded."""
        return self._pad(self.env_infos)

    @property
    def padded_agent_infos(self) -> Infos:
        """Agent infos as (N, max_length, ...) arrays, zero-padded."""
        return self._pad(self.agent_infos)

    @property
    def valids(self) -> np.ndarray:
        """(N, max_length) mask: 1 where a step exists, 0 in the padding (rewards' dtype, as garage)."""
        return self._pad(np.ones_like(self.rewards))

    def _ranges(self) -> Iterator[tuple[int, int]]:
        stops = np.cumsum(self.lengths)
        for start, stop in zip(stops - self.lengths, stops, strict=True):
            yield int(start), int(stop)

    def _pad(self, tree: Any) -> Any:
        longest = int(self.lengths.max())
        max_length = self.env_spec.max_episode_length
        if max_length is None:
            max_length = longest
        elif max_length < longest:
            warnings.warn(f"padding to env_spec.max_episode_length={max_length}, but an episode has {longest} "
                          f"steps: padding to {longest} instead", stacklevel=3)
            max_length = longest

        def pad(array: np.ndarray) -> np.ndarray:
            padded = np.zeros((len(self.lengths), max_length, *array.shape[1:]), dtype=array.dtype)
            for index, (start, stop) in enumerate(self._ranges()):
                padded[index, : stop - start] = array[start:stop]
            return padded

        return map_tree(pad, tree)

    # --- combining and splitting ---------------------------------------------------------------------

    @classmethod
    def concatenate(cls, *batches: EpisodeBatch) -> EpisodeBatch:
        """One batch holding the episodes of ``batches`` in order; their info keys must agree."""
        if not batches:
            raise ValueError("concatenate needs at least one EpisodeBatch, got none")
        first = batches[0]
        for field in ("episode_infos_by_episode", "env_infos", "agent_infos"):
            for index, batch in enumerate(batches[1:], start=1):
                if _key_paths(getattr(batch, field)) != _key_paths(getattr(first, field)):
                    raise ValueError(f"cannot concatenate: batch {index} has {field} keys "
                                     f"{sorted(_key_paths(getattr(batch, field)))}, batch 0 has "
                                     f"{sorted(_key_paths(getattr(first, field)))}")

        def joined(field: str) -> Any:
            return _concat([getattr(batch, field) for batch in batches])

        return cls(env_spec=first.env_spec, episode_infos=joined("episode_infos_by_episode"),
                   observations=joined("observations"), last_observations=joined("last_observations"),
                   actions=joined("actions"), rewards=joined("rewards"), env_infos=joined("env_infos"),
                   agent_infos=joined("agent_infos"), step_types=joined("step_types"), lengths=joined("lengths"))

    def split(self) -> list[EpisodeBatch]:
        """One single-episode batch per episode, in order."""
        batches = []
        for index, (start, stop) in enumerate(self._ranges()):
            steps, episode = slice(start, stop), slice(index, index + 1)
            batches.append(EpisodeBatch(
                env_spec=self.env_spec, episode_infos=_take(self.episode_infos_by_episode, episode),
                observations=_take(self.observations, steps),
                last_observations=_take(self.last_observations, episode), actions=_take(self.actions, steps),
                rewards=self.rewards[steps], env_infos=_take(self.env_infos, steps),
                agent_infos=_take(self.agent_infos, steps), step_types=self.step_types[steps],
                lengths=self.lengths[episode]))
        return batches

    def to_list(self) -> list[dict[str, Any]]:
        """One dict per episode: observations, next_observations, actions, rewards, env_infos, agent_infos,
        step_types (T_i rows each) and episode_infos (that episode's value of each key)."""
        episodes = []
        next_observations = self.next_observations
        for index, (start, stop) in enumerate(self._ranges()):
            steps = slice(start, stop)
            episodes.append({
                "episode_infos": _take(self.episode_infos_by_episode, index),
                "observations": _take(self.observations, steps),
                "next_observations": _take(next_observations, steps),
                "actions": _take(self.actions, steps),
                "rewards": self.rewards[steps],
                "env_infos": _take(self.env_infos, steps),
                "agent_infos": _take(self.agent_infos, steps),
                "step_types": self.step_types[steps],
            })
        return episodes

    @classmethod
    def from_list(cls, env_spec: EnvSpec, paths: Sequence[Mapping[str, Any]]) -> EpisodeBatch:
        """Inverse of to_list. A path may hold T+1 observations (the last is the last observation), or T with
        ``next_observations``; ``dones`` instead of ``step_types`` gives FIRST/MID, TERMINAL where done, and
        TIMEOUT on a last step that is not done (the episode was cut)."""
        if not paths:
            raise ValueError("from_list needs at least one path, got none")
        lengths = np.asarray([len(path["rewards"]) for path in paths], dtype=np.int64)
        observations, last_observations = [], []
        for path, length in zip(paths, lengths, strict=True):
            obs = path["observations"]
            if _first_dim(obs) == length + 1:
                observations.append(_take(obs, slice(0, length)))
                last_observations.append(_take(obs, slice(length, length + 1)))
            else:
                observations.append(obs)
                source = path["next_observations"] if path.get("next_observations") is not None else obs
                last_observations.append(_take(source, slice(length - 1, length)))
        step_types = [np.asarray(path["step_types"]) if "step_types" in path else _step_types_from_dones(
            path["dones"]) for path in paths]
        return cls(env_spec=env_spec,
                   episode_infos=_stack([path.get("episode_infos", {}) for path in paths]),
                   observations=_concat(observations), last_observations=_concat(last_observations),
                   actions=_concat([np.asarray(path["actions"]) for path in paths]),
                   rewards=np.concatenate([np.asarray(path["rewards"]) for path in paths]),
                   env_infos=_concat([path.get("env_infos", {}) for path in paths]),
                   agent_infos=_concat([path.get("agent_infos", {}) for path in paths]),
                   step_types=np.concatenate(step_types), lengths=lengths)


# --- the wire form: safetensors, no pickle ---------------------------------------------------------------

_FIELDS = ("observations", "last_observations", "actions", "rewards", "step_types", "lengths")
_INFO_FIELDS = ("episode_infos", "env_infos", "agent_infos")
EPISODES_FORMAT = "rqrl-episodes-1"


def encode_episodes(batch: EpisodeBatch, metadata: Mapping[str, str] | None = None) -> bytes:
    """``batch`` (without its env_spec, which both sides know) as one safetensors buffer; dict observations
    and infos are flattened to ``field/key/sub`` names. Frame stacks go as their unique frames
    (``rqrl.engine.frames``) and a batch with images is compressed (``rqrl.engine.compression``). Raises
    RecordError for values safetensors cannot hold (strings, objects)."""
    arrays: dict[str, np.ndarray] = {}
    infos = {"episode_infos": batch.episode_infos_by_episode, "env_infos": batch.env_infos,
             "agent_infos": batch.agent_infos}
    observations = flatten_obs(batch.observations, "observations")
    packed = pack_series(arrays, {name: leaf[:, None] for name, leaf in observations.items() if leaf.ndim >= 4})
    for name in _FIELDS:
        leaves = observations if name == "observations" else flatten_obs(getattr(batch, name), name)
        arrays.update({leaf: array for leaf, array in leaves.items() if leaf + "@frames" not in arrays})
    for name, info in infos.items():
        for key in info:
            arrays.update(flatten_obs(info[key], f"{name}/{key}"))
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise RecordError(f"{name} has dtype {array.dtype}, which safetensors cannot carry; keep infos and "
                              f"observations numeric (bool, int, float)")
    blob = encode_arrays(arrays, {**(metadata or {}), **packed, "format": EPISODES_FORMAT})
    return compress(blob) if worth_compressing(observations.values(), 1) else blob


def decode_episodes(blob: bytes, env_spec: EnvSpec) -> tuple[EpisodeBatch, dict[str, str]]:
    """Inverse of encode_episodes: the batch (validated against ``env_spec``) and the buffer's metadata."""
    arrays, metadata = decode_arrays(decompress(blob))
    for name in unpack_series(arrays, metadata):  # one series of all the batch's steps: [1, S, *obs]
        arrays[name] = arrays[name][0]
    if metadata.get("format") != EPISODES_FORMAT:
        raise RecordError(f"expected an episodes buffer of format {EPISODES_FORMAT!r}, got "
                          f"{metadata.get('format')!r}")
    fields: dict[str, Any] = {name: unflatten_obs(arrays, name) for name in _FIELDS}
    infos = {name: _unflatten_infos(arrays, name) for name in _INFO_FIELDS}
    try:
        batch = EpisodeBatch(env_spec=env_spec, episode_infos=infos["episode_infos"], env_infos=infos["env_infos"],
                             agent_infos=infos["agent_infos"], **fields)
    except ValueError as error:
        raise RecordError(f"episodes buffer does not make a valid EpisodeBatch: {error}") from error
    return batch, metadata


def _unflatten_infos(arrays: Mapping[str, np.ndarray], prefix: str) -> Infos:
    head = prefix + "/"
    keys = sorted({name[len(head):].split("/")[0] for name in arrays if name.startswith(head)})
    return {key: unflatten_obs(arrays, head + key) for key in keys}


# --- helpers -----------------------------------------------------------------------------------------------

def _take(tree: Any, index: Any) -> Any:
    return map_tree(lambda array: array[index], tree)


def _stack(trees: Sequence[Any]) -> Any:
    return map_tree(lambda *arrays: np.stack([np.asarray(array) for array in arrays]), *trees)


def _concat(trees: Sequence[Any]) -> Any:
    return map_tree(lambda *arrays: np.concatenate(arrays, axis=0), *trees)


def _first_dim(tree: Any) -> int:
    while isinstance(tree, Mapping):
        tree = next(iter(tree.values()))
    return len(tree)


def _key_paths(tree: Any, prefix: str = "") -> set[str]:
    if not isinstance(tree, Mapping):
        return {prefix}
    return set().union(*(_key_paths(value, f"{prefix}/{key}") for key, value in tree.items())) if tree else set()


def _leaves(name: str, tree: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _leaves(f"{name}[{key!r}]", value)
    else:
        yield name, tree


def _check_rows(name: str, tree: Any, expected: int, expected_name: str) -> None:
    for leaf_name, leaf in _leaves(name, tree):
        if not isinstance(leaf, np.ndarray):
            raise ValueError(f"{leaf_name} must be a numpy array (or a dict of them), got {type(leaf).__name__}")
        if leaf.ndim == 0 or len(leaf) != expected:
            raise ValueError(f"{leaf_name} has {len(leaf) if leaf.ndim else 0} entries along its first axis, but "
                             f"{expected_name} is {expected}")


def _check_infos(name: str, infos: Any, expected: int, expected_name: str) -> None:
    if not isinstance(infos, Mapping):
        raise ValueError(f"{name} must be a dict of arrays, got {type(infos).__name__}")
    _check_rows(name, infos, expected, expected_name)


def _check_space(name: str, tree: Any, space: gymnasium.Space[Any]) -> None:
    if isinstance(space, gymnasium.spaces.Dict):
        if not isinstance(tree, Mapping) or set(tree) != set(space.spaces):
            found = sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__
            raise ValueError(f"{name} has keys {found}, expected {sorted(space.spaces)} of {space}")
        for key, subspace in space.spaces.items():
            _check_space(f"{name}[{key!r}]", tree[key], subspace)
        return
    if isinstance(tree, Mapping):
        raise ValueError(f"{name} is a dict, but its space {space} is not a Dict space")
    if space.shape is None:
        return
    element_shape, expected = tuple(tree.shape[1:]), tuple(space.shape)
    if element_shape != expected and int(np.prod(element_shape)) != gymnasium.spaces.flatdim(space):
        raise ValueError(f"{name} has elements of shape {element_shape}, expected {expected} (or "
                         f"{gymnasium.spaces.flatdim(space)} flat values) for {space}")
    if isinstance(space, gymnasium.spaces.Box) and element_shape == expected and len(tree):
        if np.any(tree < space.low) or np.any(tree > space.high):
            warnings.warn(f"{name} has values outside {space}", stacklevel=4)


def _as_step_types(step_types: np.ndarray) -> np.ndarray:
    if step_types.dtype.kind not in "iuO":
        raise ValueError(f"step_types has dtype {step_types.dtype}, expected StepType values (integers)")
    values = np.asarray(step_types.tolist() if step_types.dtype.kind == "O" else step_types)
    if values.size and (values.dtype.kind not in "iu" or values.min() < 0 or values.max() > max(StepType)):
        raise ValueError(f"step_types must hold StepType values 0..{int(max(StepType))}, got "
                         f"{sorted(set(values.tolist()))[:8]}")
    return values.astype(STEP_TYPE_DTYPE)


def _step_types_from_dones(dones: Any) -> np.ndarray:
    dones = np.asarray(dones, dtype=bool)
    types = np.full(len(dones), StepType.MID, dtype=STEP_TYPE_DTYPE)
    types[0] = StepType.FIRST
    types[-1] = StepType.TIMEOUT
    types[dones] = StepType.TERMINAL
    return types
