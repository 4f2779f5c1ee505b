"""rqrl.garage.store against a real Redis: a call's spec is signed with its version, so neither an unsigned
rewrite nor another call's spec copied over it is run (issue 24, item 6)."""

from __future__ import annotations

import pytest

from rqrl.engine.codec import weights_key
from rqrl.engine.keys import RunKeys
from rqrl.errors import SignatureError
from rqrl.garage.store import REPLACE, STACK, SamplerCall, SamplerStore

KEY = weights_key("store-secret", "run-id")


def test_a_signed_call_spec_round_trips_and_rewrites_are_refused(connection, run_name):
    store = SamplerStore(connection, RunKeys(run_name))
    call = SamplerCall(mode="samples", count=100, agent_chains=[[(1, -1, REPLACE)]] * 2, env_chains=[[], []])
    store.begin(1, call, {}, KEY)
    store.begin(2, call, {}, KEY)
    assert store.read_call(1, 2, KEY) == call
    forged = SamplerCall(mode="samples", count=100, agent_chains=[[(0, -1, STACK)]] * 2, env_chains=[[], []])
    connection.set(store.keys.sampler_call(2), forged.to_json())  # every chain back to the initial agent
    with pytest.raises(SignatureError, match="unsigned"):
        store.read_call(2, 2, KEY)
    connection.set(store.keys.sampler_call(2), connection.get(store.keys.sampler_call(1)))  # call 1's, copied
    with pytest.raises(SignatureError, match="signed for call 1"):
        store.read_call(2, 2, KEY)
    with pytest.raises(SignatureError):
        store.read_call(1, 2, weights_key("store-secret", "another-run"))
