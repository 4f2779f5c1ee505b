"""EpisodeBatch, StepType and EnvSpec (garage's _dtypes, tests/garage/test_dtypes.py's intent) and the
safetensors wire form of episodes."""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from rqrl import EnvSpec, EpisodeBatch, RecordError, StepType
from rqrl.engine.codec import encode_arrays
from rqrl.engine.observations import map_tree
from rqrl.garage.episodes import STEP_TYPE_DTYPE, decode_episodes, encode_episodes

BOX_SPEC = EnvSpec(spaces.Box(-10, 10, (3,), np.float32), spaces.Discrete(4), max_episode_length=6)
DICT_SPEC = EnvSpec(spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float32), "goal": spaces.Discrete(5)}),
                    spaces.Box(-1, 1, (2,), np.float32), max_episode_length=None)


def step_types_for(lengths: list[int], last: StepType = StepType.TERMINAL) -> np.ndarray:
    types = []
    for length in lengths:
        types += [StepType.FIRST] + [StepType.MID] * (length - 1)
        types[-1] = last
    return np.array(types, dtype=STEP_TYPE_DTYPE)


def box_batch(lengths: list[int], /, offset: float = 0.0, **overrides: Any) -> EpisodeBatch:
    """Observation row i of the batch is [i, i, i] + offset; last observations are 100 + episode index."""
    n_steps, n_episodes = sum(lengths), len(lengths)
    fields: dict[str, Any] = dict(
        env_spec=BOX_SPEC,
        episode_infos={"task": np.arange(n_episodes) + offset},
        observations=np.repeat(np.arange(n_steps, dtype=np.float32)[:, None] / 10 + offset, 3, axis=1),
        last_observations=np.full((n_episodes, 3), 9.0, np.float32) - np.arange(n_episodes)[:, None],
        actions=np.arange(n_steps) % 4,
        rewards=np.arange(n_steps, dtype=np.float64) + offset,
        env_infos={"speed": np.arange(n_steps) * 2.0, "nested": {"flag": np.arange(n_steps) % 2 == 0}},
        agent_infos={"log_prob": -np.arange(n_steps, dtype=np.float32)},
        step_types=step_types_for(lengths),
        lengths=np.array(lengths, dtype=np.int64),
    )
    fields.update(overrides)
    return EpisodeBatch(**fields)


def dict_batch(lengths: list[int]) -> EpisodeBatch:
    n_steps, n_episodes = sum(lengths), len(lengths)
    return EpisodeBatch(
        env_spec=DICT_SPEC, episode_infos={},
        observations={"pos": np.arange(2 * n_steps, dtype=np.float32).reshape(n_steps, 2) / 10,
                      "goal": np.arange(n_steps) % 5},
        last_observations={"pos": np.ones((n_episodes, 2), np.float32), "goal": np.arange(n_episodes) % 5},
        actions=np.zeros((n_steps, 2), np.float32), rewards=np.ones(n_steps),
        env_infos={}, agent_infos={"mean": {"x": np.zeros((n_steps, 2), np.float32)}},
        step_types=step_types_for(lengths, StepType.TIMEOUT), lengths=np.array(lengths))


def assert_batches_equal(left: EpisodeBatch, right: EpisodeBatch) -> None:
    for field in ("episode_infos_by_episode", "observations", "last_observations", "actions", "rewards", "env_infos",
                  "agent_infos", "step_types", "lengths"):
        a, b = getattr(left, field), getattr(right, field)
        assert _key_paths(a) == _key_paths(b), field
        map_tree(lambda x, y, field=field: np.testing.assert_array_equal(x, y, err_msg=field), a, b)
    assert left.env_spec == right.env_spec


def _key_paths(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict):
        return sorted(path for key, value in tree.items() for path in _key_paths(value, f"{prefix}/{key}"))
    return [prefix]


# --- StepType -----------------------------------------------------------------------------------------------

def test_step_type_values_are_garages():
    assert [(member.name, int(member)) for member in StepType] == [
        ("FIRST", 0), ("MID", 1), ("TERMINAL", 2), ("TIMEOUT", 3)]


@pytest.mark.parametrize(("step_cnt", "max_length", "done", "truncated", "expected"), [
    (1, 5, False, False, StepType.FIRST),
    (2, 5, False, False, StepType.MID),
    (5, 5, False, False, StepType.TIMEOUT),  # the limit cut it
    (5, 5, True, False, StepType.TERMINAL),  # terminated on the last allowed step: TERMINAL (the rule)
    (3, 5, True, False, StepType.TERMINAL),
    (3, 5, False, True, StepType.TIMEOUT),  # the env truncated
    (1, 5, True, False, StepType.TERMINAL),  # a one-step episode is just TERMINAL
    (1, 1, False, False, StepType.TIMEOUT),
    (7, None, False, False, StepType.MID),
])
def test_get_step_type(step_cnt, max_length, done, truncated, expected):
    assert StepType.get_step_type(step_cnt, max_length, done, truncated) is expected


def test_get_step_type_refuses_step_zero():
    with pytest.raises(ValueError, match="step_cnt to be >= 1, but got 0"):
        StepType.get_step_type(0, 5, False)


# --- construction and validation ------------------------------------------------------------------------------

def test_valid_batch_keeps_its_fields_and_is_frozen():
    batch = box_batch([2, 3])
    assert batch.lengths.tolist() == [2, 3]
    assert batch.step_types.dtype == STEP_TYPE_DTYPE
    assert batch.step_types.tolist() == [0, 2, 0, 1, 2]
    assert batch.episode_infos_by_episode["task"].tolist() == [0, 1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.rewards = np.zeros(5)  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(batch)).rewards.tolist() == batch.rewards.tolist()
    assert batch == batch and batch != box_batch([2, 3])  # identity: == never compares arrays


def test_step_types_as_a_stepType_object_array_are_accepted():
    batch = box_batch([2], step_types=np.asarray([StepType.FIRST, StepType.TIMEOUT], dtype=object))
    assert batch.step_types.tolist() == [0, 3] and batch.step_types.dtype == STEP_TYPE_DTYPE


@pytest.mark.parametrize(("overrides", "message"), [
    ({"observations": np.zeros((4, 3), np.float32)}, r"observations has 4 entries .* sum\(lengths\) is 5"),
    ({"actions": np.zeros(6, np.int64)}, r"actions has 6 entries .* sum\(lengths\) is 5"),
    ({"rewards": np.zeros(4)}, r"rewards has shape \(4,\), expected \(5,\)"),
    ({"rewards": np.zeros((5, 2))}, r"rewards has shape \(5, 2\), expected \(5,\)"),
    ({"rewards": [0.0] * 5}, "rewards must be a numpy array, got list"),
    ({"step_types": np.zeros(3, np.uint8)}, r"step_types has shape \(3,\), expected \(5,\)"),
    ({"step_types": np.zeros(5)}, "step_types has dtype float64"),
    ({"step_types": np.full(5, 7)}, r"StepType values 0..3, got \[7\]"),
    ({"lengths": np.array([[2, 3]])}, r"lengths has shape \(1, 2\)"),
    ({"lengths": np.array([2.0, 3.0])}, "lengths has dtype float64"),
    ({"lengths": np.array([2, 4])}, r"observations has 5 entries .* sum\(lengths\) is 6"),
    ({"lengths": np.array([5, 0])}, r"lengths must all be >= 1"),
    ({"last_observations": np.zeros((3, 3), np.float32)}, r"last_observations has 3 entries .* len\(lengths\) is 2"),
    ({"last_observations": [[0, 0, 0]] * 2}, "last_observations must be a numpy array"),
    ({"episode_infos": {"task": np.zeros(5)}}, r"episode_infos\['task'\] has 5 entries .* len\(lengths\) is 2"),
    ({"episode_infos": {"task": [1, 2]}}, r"episode_infos\['task'\] must be a numpy array"),
    ({"env_infos": {"speed": np.zeros(4)}}, r"env_infos\['speed'\] has 4 entries .* sum\(lengths\) is 5"),
    ({"env_infos": {"nested": {"flag": np.zeros(2)}}}, r"env_infos\['nested'\]\['flag'\] has 2 entries"),
    ({"agent_infos": {"log_prob": 3.0}}, r"agent_infos\['log_prob'\] must be a numpy array .* got float"),
    ({"agent_infos": [1]}, "agent_infos must be a dict"),
    ({"observations": np.zeros((5, 4), np.float32)}, r"observations has elements of shape \(4,\), expected \(3,\)"),
    ({"actions": np.zeros((5, 3))}, r"actions has elements of shape \(3,\), expected \(\)"),
    ({"env_spec": "CartPole-v1"}, "env_spec must be an rqrl EnvSpec"),
])
def test_validation_names_the_field_and_both_sizes(overrides, message):
    with pytest.raises(ValueError, match=message):
        box_batch([2, 3], **overrides)


def test_one_hot_discrete_actions_are_accepted_as_flat_values():
    batch = box_batch([2], actions=np.eye(4)[[0, 3]])
    assert batch.actions.shape == (2, 4)


def test_dict_observations_must_have_the_space_keys():
    good = dict_batch([2])
    with pytest.raises(ValueError, match=r"observations has keys \['pos'\], expected \['goal', 'pos'\]"):
        EpisodeBatch(DICT_SPEC, {}, {"pos": good.observations["pos"]}, good.last_observations, good.actions,
                     good.rewards, {}, {}, good.step_types, good.lengths)


def test_observations_outside_the_space_warn_but_pass():
    with pytest.warns(UserWarning, match="observations has values outside Box"):
        box_batch([2], observations=np.full((2, 3), 50.0, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        box_batch([2])


# --- derived views -------------------------------------------------------------------------------------------

def test_next_observations_shift_each_episode_and_end_with_its_last_observation():
    batch = box_batch([2, 3])
    expected = np.concatenate([batch.observations[1:2], batch.last_observations[0:1], batch.observations[3:5],
                               batch.last_observations[1:2]])
    np.testing.assert_array_equal(batch.next_observations, expected)


def test_episode_infos_repeat_per_step_and_terminals_mark_terminal_steps():
    batch = box_batch([2, 3], step_types=np.array([0, 3, 0, 1, 2], np.uint8))
    assert batch.episode_infos["task"].tolist() == [0, 0, 1, 1, 1]
    assert batch.terminals.tolist() == [False, False, False, False, True]


def test_lists_split_observations_and_actions_by_episode():
    batch = box_batch([2, 3])
    assert [len(obs) for obs in batch.observations_list] == [2, 3]
    np.testing.assert_array_equal(batch.observations_list[1], batch.observations[2:])
    assert [actions.tolist() for actions in batch.actions_list] == [[0, 1], [2, 3, 0]]


def test_padded_views_pad_to_max_episode_length_with_zeros():
    batch = box_batch([2, 3])  # BOX_SPEC.max_episode_length == 6
    assert batch.padded_observations.shape == (2, 6, 3)
    np.testing.assert_array_equal(batch.padded_observations[1, :3], batch.observations[2:])
    assert not batch.padded_observations[0, 2:].any()
    assert batch.padded_rewards.tolist() == [[0, 1, 0, 0, 0, 0], [2, 3, 4, 0, 0, 0]]
    assert batch.valids.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert batch.padded_actions.shape == (2, 6)
    assert batch.padded_step_types[1, :3].tolist() == [0, 1, 2]
    assert batch.padded_next_observations[0, 1].tolist() == batch.last_observations[0].tolist()
    assert batch.padded_env_infos["nested"]["flag"].shape == (2, 6)
    assert batch.padded_agent_infos["log_prob"][1, :3].tolist() == [-2, -3, -4]


def test_padding_without_a_max_length_uses_the_longest_episode_and_grows_with_a_warning():
    batch = dict_batch([2, 4])  # DICT_SPEC has no max_episode_length
    assert batch.padded_observations["pos"].shape == (2, 4, 2)
    short = box_batch([2, 7])  # BOX_SPEC.max_episode_length == 6
    with pytest.warns(UserWarning, match="max_episode_length=6, but an episode has 7 steps"):
        assert short.padded_rewards.shape == (2, 7)


# --- combining and splitting -----------------------------------------------------------------------------------

def test_split_then_concatenate_round_trips():
    batch = box_batch([2, 3, 1])
    parts = batch.split()
    assert [part.lengths.tolist() for part in parts] == [[2], [3], [1]]
    assert parts[1].episode_infos_by_episode["task"].tolist() == [1]
    np.testing.assert_array_equal(parts[2].last_observations, batch.last_observations[2:])
    assert_batches_equal(EpisodeBatch.concatenate(*parts), batch)


def test_concatenate_keeps_order_and_validates():
    first, second = box_batch([2]), box_batch([3], offset=1.0)
    joined = EpisodeBatch.concatenate(first, second)
    assert joined.lengths.tolist() == [2, 3]
    assert joined.rewards.tolist() == [0, 1, 1, 2, 3]
    assert joined.episode_infos_by_episode["task"].tolist() == [0, 1]


def test_concatenate_refuses_different_info_keys_and_nothing():
    with pytest.raises(ValueError, match=r"batch 1 has agent_infos keys \[\], batch 0 has \['/log_prob'\]"):
        EpisodeBatch.concatenate(box_batch([2]), box_batch([2], agent_infos={}))
    with pytest.raises(ValueError, match="at least one EpisodeBatch"):
        EpisodeBatch.concatenate()


def test_to_list_and_from_list_round_trip():
    batch = box_batch([2, 3])
    paths = batch.to_list()
    assert sorted(paths[0]) == sorted(["episode_infos", "observations", "next_observations", "actions", "rewards",
                                       "env_infos", "agent_infos", "step_types"])
    assert paths[1]["episode_infos"]["task"] == 1
    np.testing.assert_array_equal(paths[0]["next_observations"][-1], batch.last_observations[0])
    assert_batches_equal(EpisodeBatch.from_list(BOX_SPEC, paths), batch)


def test_from_list_accepts_one_more_observation_and_dones():
    observations = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    path = {"observations": observations, "actions": np.array([0, 1, 2]), "rewards": np.ones(3),
            "dones": np.array([False, False, True]), "env_infos": {}, "agent_infos": {}}
    cut = dict(path, dones=np.array([False, False, False]))
    batch = EpisodeBatch.from_list(BOX_SPEC, [path, cut])
    assert batch.lengths.tolist() == [3, 3]
    np.testing.assert_array_equal(batch.last_observations[0], observations[3])
    assert batch.step_types.tolist() == [StepType.FIRST, StepType.MID, StepType.TERMINAL,
                                         StepType.FIRST, StepType.MID, StepType.TIMEOUT]


def test_dict_observations_split_concatenate_and_next_observations():
    batch = dict_batch([2, 1])
    assert batch.next_observations["goal"].tolist() == [1, 0, 1]
    assert_batches_equal(EpisodeBatch.concatenate(*batch.split()), batch)
    assert [obs["pos"].shape for obs in batch.observations_list] == [(2, 2), (1, 2)]


# --- safetensors wire form -------------------------------------------------------------------------------------

def test_encode_decode_round_trips_with_nested_infos():
    batch = box_batch([2, 3])
    blob = encode_episodes(batch, {"worker": "3", "version": "7"})
    decoded, metadata = decode_episodes(blob, BOX_SPEC)
    assert metadata["worker"] == "3" and metadata["version"] == "7"
    assert_batches_equal(decoded, batch)
    assert decoded.env_infos["nested"]["flag"].dtype == bool
    assert b"pickle" not in blob[:200] and blob[8:9] == b"{"  # a safetensors JSON header, not a pickle


def test_encode_decode_round_trips_dict_observations():
    batch = dict_batch([3, 2])
    decoded, _ = decode_episodes(encode_episodes(batch), DICT_SPEC)
    assert_batches_equal(decoded, batch)


def test_encode_refuses_values_safetensors_cannot_carry():
    batch = box_batch([2], env_infos={"name": np.array(["a", "b"])})
    with pytest.raises(RecordError, match=r"env_infos/name has dtype <U1"):
        encode_episodes(batch)


def test_decode_refuses_foreign_or_inconsistent_buffers():
    with pytest.raises(RecordError, match="expected an episodes buffer"):
        decode_episodes(encode_arrays({"rewards": np.zeros(2)}, {}), BOX_SPEC)
    arrays = {"observations": np.zeros((2, 3), np.float32), "last_observations": np.zeros((1, 3), np.float32),
              "actions": np.zeros(2, np.int64), "rewards": np.zeros(3), "step_types": np.zeros(2, np.uint8),
              "lengths": np.array([2])}
    with pytest.raises(RecordError, match=r"rewards has shape \(3,\), expected \(2,\)"):
        decode_episodes(encode_arrays(arrays, {"format": "rqrl-episodes-1"}), BOX_SPEC)
    with pytest.raises(RecordError):
        decode_episodes(b"not safetensors at all", BOX_SPEC)


def test_env_spec_holds_spaces_and_limit():
    spec = EnvSpec(gymnasium.spaces.Discrete(2), gymnasium.spaces.Discrete(3), 10)
    assert spec.max_episode_length == 10
    assert EnvSpec(spec.observation_space, spec.action_space).max_episode_length is None
