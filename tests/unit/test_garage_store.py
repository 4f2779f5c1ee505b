"""The sampler's protocol pieces that need no Redis: update chains, update blobs, calls."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from rqrl import NewEnvUpdate, SetTaskUpdate, SignatureError
from rqrl.engine.codec import weights_key
from rqrl.errors import RecordError
from rqrl.garage.store import (
    OVERRIDE,
    REPLACE,
    STACK,
    SamplerCall,
    agent_kind,
    decode_update,
    encode_update,
    env_kind,
    extend_chain,
    plan_chain,
)
from tests import fixtures

SECRET = "unit-secret"
KEY = weights_key(SECRET, "run-id")
AT = "rqrl:r:sampler:update:1:agent:all"
"""The Redis key an update is stored at, which its tag binds."""


def test_update_kinds():
    assert agent_kind(None) is None and env_kind(None) is None
    assert agent_kind({"w": np.zeros(2)}) == agent_kind((np.zeros(1),)) == agent_kind(np.zeros(1)) == OVERRIDE
    assert agent_kind(fixtures.VersionPolicy()) == agent_kind(torch.nn.Linear(2, 2)) == REPLACE
    assert env_kind(fixtures.make_echo_env()) == env_kind(NewEnvUpdate(fixtures.make_echo_env)) == REPLACE
    assert env_kind(SetTaskUpdate(fixtures.EchoEnv, 1)) == OVERRIDE
    assert env_kind(lambda old: old) == STACK


def test_chains_start_afresh_on_replace_and_keep_only_the_last_override():
    chain = extend_chain([], (0, -1, REPLACE))
    chain = extend_chain(chain, (1, -1, OVERRIDE))
    chain = extend_chain(chain, (2, 3, STACK))
    chain = extend_chain(chain, (3, -1, OVERRIDE))
    assert chain == [(0, -1, REPLACE), (2, 3, STACK), (3, -1, OVERRIDE)]
    assert extend_chain(chain, (4, -1, REPLACE)) == [(4, -1, REPLACE)]


def test_plan_applies_only_what_is_new_and_rebuilds_when_the_base_changed():
    applied = [(0, -1, REPLACE), (1, -1, OVERRIDE)]
    assert plan_chain(applied, [(0, -1, REPLACE), (5, -1, OVERRIDE)]) == (False, [(5, -1, OVERRIDE)])
    assert plan_chain(applied, applied) == (False, [])
    assert plan_chain(applied, [(6, -1, REPLACE)]) == (True, [(6, -1, REPLACE)])
    assert plan_chain([], [(0, 2, REPLACE)]) == (True, [(0, 2, REPLACE)])
    # a stacked update dropped from the target cannot be undone in place: rebuild
    stacked = [(0, -1, REPLACE), (1, -1, STACK)]
    assert plan_chain(stacked, [(0, -1, REPLACE), (2, -1, STACK)])[0] is True
    # JSON gives lists, not tuples
    assert plan_chain([[0, -1, REPLACE]], [[0, -1, REPLACE], [1, -1, STACK]]) == (False, [(1, -1, STACK)])


@pytest.mark.parametrize("value", [
    {"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.ones(2, dtype=torch.float64)},
    {"value": np.asarray(3)}, (np.zeros(2), np.ones((2, 2), np.int32)), np.arange(4.0),
])
def test_parameters_travel_as_tagged_safetensors(value):
    blob = encode_update(value, SECRET, KEY, AT)
    assert b"cloudpickle" not in blob
    decoded = decode_update(blob, SECRET, KEY, AT)
    assert type(decoded) is type(value)
    if isinstance(value, dict):
        assert sorted(decoded) == sorted(value)
        pairs = [(value[key], decoded[key]) for key in value]
    else:
        pairs = list(zip(value, decoded, strict=True)) if isinstance(value, tuple) else [(value, decoded)]
    for a, b in pairs:
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_objects_travel_as_signed_pickles_and_tampering_is_refused():
    blob = encode_update(SetTaskUpdate(fixtures.EchoEnv, 4), SECRET, KEY, AT)
    assert b"\nP" in blob  # the pickle tag after the binding
    update = decode_update(blob, SECRET, KEY, AT)
    env = update(None)
    assert isinstance(env, gymnasium.Env) and env.task == 4
    with pytest.raises(SignatureError):
        decode_update(blob[:-1] + b"x", SECRET, KEY, AT)
    with pytest.raises(SignatureError):
        decode_update(encode_update({"v": np.zeros(1)}, SECRET, KEY, AT), SECRET, weights_key(SECRET, "other-run"), AT)
    with pytest.raises(SignatureError):
        decode_update(b"Xjunk", SECRET, KEY, AT)


def test_calls_round_trip_and_junk_is_refused():
    call = SamplerCall(mode="exact", count=3, agent_chains=[[(0, -1, REPLACE)]] * 2, env_chains=[[], []])
    assert SamplerCall.from_json(call.to_json(), 2) == call
    with pytest.raises(RecordError):
        SamplerCall.from_json(call.to_json(), 3)
    with pytest.raises(RecordError):
        SamplerCall.from_json(b"{}", 2)
    with pytest.raises(RecordError):
        SamplerCall.from_json(call.to_json().replace('"exact"', '"other"'), 2)


def test_an_update_copied_to_another_calls_key_is_refused():
    """Issue 24, item 6: call 1's signed update copied over call 5's is not call 5's."""
    blob = encode_update({"w": torch.ones(2)}, SECRET, KEY, "rqrl:r:sampler:update:1:agent:all")
    with pytest.raises(SignatureError, match="signed for"):
        decode_update(blob, SECRET, KEY, "rqrl:r:sampler:update:5:agent:all")
