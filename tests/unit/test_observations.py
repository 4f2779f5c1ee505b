"""Observation trees: Box, Discrete, Dict and nested Dict observations through every walker."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rqrl.engine.observations import (
    concat_to,
    empty_like_batch,
    flatten_obs,
    map_tree,
    select,
    stack_obs,
    stack_to,
    to_array,
    to_tensor,
    unflatten_obs,
)
from rqrl.errors import RecordError

SPACES = {
    "box": spaces.Box(-1, 1, (3,), np.float32),
    "discrete": spaces.Discrete(5),
    "dict": spaces.Dict({"position": spaces.Box(-1, 1, (2,), np.float32), "goal": spaces.Discrete(3)}),
    "nested": spaces.Dict({
        "image": spaces.Box(0, 255, (2, 2), np.uint8),
        "state": spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "goal": spaces.Discrete(4)}),
    }),
}


def samples(space: spaces.Space, n: int) -> list:
    """``n`` observations of ``space`` as an env returns them (a Discrete as a plain int)."""
    space.seed(0)
    return [map_tree(lambda leaf: int(leaf) if np.ndim(leaf) == 0 else leaf, space.sample()) for _ in range(n)]


def assert_tree_equal(left, right) -> None:
    """Same keys, and leaves of one kind (torch or numpy: a numpy scalar equals a 0-d array), dtype and values."""
    if isinstance(left, dict):
        assert isinstance(right, dict) and set(left) == set(right)
        for key in left:
            assert_tree_equal(left[key], right[key])
    else:
        assert isinstance(left, torch.Tensor) == isinstance(right, torch.Tensor), (type(left), type(right))
        assert left.dtype == right.dtype and left.shape == right.shape
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))  # NaNs in one place are equal


def leaves(tree) -> list:
    """The leaves of a tree, in its key order."""
    found: list = []
    map_tree(found.append, tree)
    return found


def test_map_tree_maps_leaves_and_zips_trees_by_the_first_trees_keys():
    left = {"a": 1, "b": {"c": 2, "d": 3}}
    right = {"b": {"d": 30, "c": 20}, "a": 10}
    assert map_tree(lambda x: x * 2, left) == {"a": 2, "b": {"c": 4, "d": 6}}
    summed = map_tree(lambda x, y: x + y, left, right)
    assert summed == {"a": 11, "b": {"c": 22, "d": 33}}
    assert list(summed) == ["a", "b"] and list(summed["b"]) == ["c", "d"]
    assert map_tree(lambda x, y: x - y, 5, 3) == 2
    with pytest.raises(KeyError):
        map_tree(lambda x, y: x, {"a": 1, "b": 2}, {"a": 1})


@pytest.mark.parametrize("name", sorted(SPACES))
def test_env_observations_become_numpy_trees_of_the_spaces_dtypes(name):
    obs = to_array(samples(SPACES[name], 1)[0])
    assert SPACES[name].contains(obs)
    for leaf in leaves(obs):
        assert isinstance(leaf, np.ndarray)
    if name == "discrete":
        assert obs.shape == () and obs.dtype == np.int64


@pytest.mark.parametrize("name", sorted(SPACES))
def test_stack_then_select_gives_back_each_observation(name):
    observations = [to_array(obs) for obs in samples(SPACES[name], 4)]
    batch = stack_obs(observations)
    for leaf, example in zip(leaves(batch), leaves(observations[0]), strict=True):
        assert leaf.shape == (4, *example.shape) and leaf.dtype == example.dtype
    for index, obs in enumerate(observations):
        assert_tree_equal(select(batch, index), obs)
    assert_tree_equal(select(stack_obs([batch, batch]), (slice(None), 2)), stack_obs([observations[2]] * 2))


@pytest.mark.parametrize("name", sorted(SPACES))
def test_flatten_then_unflatten_is_the_identity(name):
    batch = stack_obs([to_array(obs) for obs in samples(SPACES[name], 3)])
    flat = flatten_obs(batch, "obs")
    assert all(path == "obs" or path.startswith("obs/") for path in flat)
    assert_tree_equal(unflatten_obs(flat, "obs"), batch)
    assert_tree_equal(unflatten_obs({**flat, **flatten_obs(batch, "next_obs")}, "obs"), batch)


def test_flatten_names_nested_paths_and_unflatten_needs_the_prefix():
    obs = to_array(samples(SPACES["nested"], 1)[0])
    assert sorted(flatten_obs(obs, "obs")) == ["obs/image", "obs/state/goal", "obs/state/pos"]
    with pytest.raises(RecordError, match="'final_obs'"):
        unflatten_obs(flatten_obs(obs, "obs"), "final_obs")
    with pytest.raises(RecordError, match="must not contain '/'"):
        flatten_obs({"a/b": np.zeros(1)}, "obs")


@pytest.mark.parametrize("name", sorted(SPACES))
def test_tensors_share_the_arrays_memory(name):
    obs = stack_obs([to_array(o) for o in samples(SPACES[name], 2)])
    tensors = to_tensor(obs)
    for array, tensor in zip(leaves(obs), leaves(tensors), strict=True):
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_array_equal(tensor.numpy(), array)
        array[0] = 0
        assert not tensor[0].any()


@pytest.mark.parametrize("name", sorted(SPACES))
def test_empty_like_batch_keeps_shape_and_dtype_per_leaf(name):
    obs = to_array(samples(SPACES[name], 1)[0])
    empty = empty_like_batch(obs)
    for leaf, example in zip(leaves(empty), leaves(obs), strict=True):
        assert leaf.shape == (0, *example.shape) and leaf.dtype == example.dtype
    assert_tree_equal(concat_to([empty, stack_obs([obs])], "cpu"), to_tensor(stack_obs([obs])))


@pytest.mark.parametrize("name", sorted(SPACES))
def test_stack_to_and_concat_to_build_batches_on_a_device(name):
    rollouts = [stack_obs([to_array(o) for o in samples(SPACES[name], 5)]) for _ in range(3)]  # [T=5] each
    batch = stack_to(rollouts, 1, "cpu")  # [T, B]
    for column, rollout_obs in enumerate(rollouts):
        assert_tree_equal(select(batch, (slice(None), column)), to_tensor(rollout_obs))
    joined = concat_to(rollouts, "cpu")
    assert_tree_equal(select(joined, slice(5, 10)), to_tensor(rollouts[1]))


KEYS = st.text(alphabet="abcxyz_0", min_size=1, max_size=4)
LEAF_DTYPES = st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_])


@st.composite
def obs_trees(draw, depth: int = 2):
    """A random observation tree: an array, or a dict of trees (depth at most ``depth``)."""
    if depth == 0 or draw(st.booleans()):
        return draw(hnp.arrays(draw(LEAF_DTYPES), hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)))
    return draw(st.dictionaries(KEYS, obs_trees(depth - 1), min_size=1, max_size=3))


@settings(max_examples=60, deadline=None)
@given(tree=obs_trees(), n=st.integers(1, 4))
def test_property_round_trips(tree, n):
    assert_tree_equal(unflatten_obs(flatten_obs(tree, "obs"), "obs"), tree)
    assert_tree_equal(map_tree(lambda x: x, tree), tree)
    batch = stack_obs([tree] * n)
    for index in range(n):
        assert_tree_equal(select(batch, index), tree)
    assert_tree_equal(to_tensor(batch), stack_to([tree] * n, 0, "cpu"))
    assert_tree_equal(concat_to([empty_like_batch(tree), batch], "cpu"), to_tensor(batch))
