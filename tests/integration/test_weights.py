"""WeightStore against a real Redis: versions, fetch-if-newer, expiry of old versions, untorn reads."""

from __future__ import annotations

import threading

import pytest
import redis
import torch

from rqrl.codec import encode_state_dict
from rqrl.errors import RecordError
from rqrl.keys import RunKeys
from rqrl.weights import WeightStore
from tests import fixtures


def versioned_state(version: int, size: int = 2048) -> dict[str, torch.Tensor]:
    """Every value encodes the version, so a blob that mismatches its version shows."""
    return {"version": torch.tensor(float(version)), "body": torch.full((size,), float(version)),
            "half": torch.full((7, 3), float(version), dtype=torch.bfloat16)}


def test_publish_increments_versions(connection, run_name):
    store = WeightStore(connection, RunKeys(run_name))
    assert store.latest_version() is None
    assert [store.publish(versioned_state(v)) for v in range(1, 4)] == [1, 2, 3]
    assert store.latest_version() == 3
    assert connection.get(RunKeys(run_name).latest_version) == b"3"


def test_fetch_before_any_publish_is_none(connection, run_name):
    store = WeightStore(connection, RunKeys(run_name))
    assert store.fetch_if_newer(None) is None
    assert store.fetch_if_newer(0) is None


def test_fetch_if_newer(connection, run_name):
    store = WeightStore(connection, RunKeys(run_name))
    policy = fixtures.mlp_policy(seed=4)
    assert store.publish(policy.state_dict()) == 1
    version, state = store.fetch_if_newer(None)
    assert version == 1
    assert set(state) == set(policy.state_dict())
    for name, tensor in policy.state_dict().items():
        assert torch.equal(state[name], tensor), name
    assert store.fetch_if_newer(1) is None
    store.publish(versioned_state(2))
    version, state = store.fetch_if_newer(1)
    assert version == 2 and torch.equal(state["body"], torch.full((2048,), 2.0))
    assert state["half"].dtype == torch.bfloat16
    assert store.fetch_if_newer(2) is None


def test_a_second_store_sees_what_the_first_published(connection, redis_url, run_name):
    WeightStore(connection, RunKeys(run_name)).publish(versioned_state(1))
    with redis.Redis.from_url(redis_url) as other_connection:
        fetched = WeightStore(other_connection, RunKeys(run_name)).fetch_if_newer(None)
    assert fetched is not None and fetched[0] == 1 and fetched[1]["version"].item() == 1.0


def test_runs_do_not_see_each_others_weights(connection):
    WeightStore(connection, RunKeys("run-a")).publish(versioned_state(1))
    other = WeightStore(connection, RunKeys("run-b"))
    assert other.latest_version() is None and other.fetch_if_newer(None) is None


def test_old_versions_expire_and_the_latest_does_not(connection, run_name):
    keys = RunKeys(run_name)
    store = WeightStore(connection, keys, ttl_seconds=50)
    store.publish(versioned_state(1))
    assert connection.ttl(keys.weights(1)) == -1
    store.publish(versioned_state(2))
    store.publish(versioned_state(3))
    for old in (1, 2):
        assert 0 < connection.ttl(keys.weights(old)) <= 50, old
    assert connection.ttl(keys.weights(3)) == -1
    assert connection.ttl(keys.latest_version) == -1


def test_missing_blob_is_reported(connection, run_name):
    keys = RunKeys(run_name)
    store = WeightStore(connection, keys)
    store.publish(versioned_state(1))
    connection.delete(keys.weights(1))
    with pytest.raises(RecordError, match="version 1 is latest but its blob is missing"):
        store.fetch_if_newer(None)


def test_blob_that_disagrees_with_the_pointer_is_refused(connection, run_name):
    keys = RunKeys(run_name)
    store = WeightStore(connection, keys)
    connection.set(keys.weights(5), encode_state_dict(versioned_state(4), {"version": "4"}))
    connection.set(keys.latest_version, 5)
    with pytest.raises(RecordError, match="blob says version '4', pointer says 5"):
        store.fetch_if_newer(None)


def test_corrupt_blob_is_refused(connection, run_name):
    keys = RunKeys(run_name)
    connection.set(keys.weights(1), b"\x00\x01garbage")
    connection.set(keys.latest_version, 1)
    with pytest.raises(RecordError):
        WeightStore(connection, keys).fetch_if_newer(None)


@pytest.mark.timeout(60)
def test_concurrent_readers_never_see_a_torn_or_mislabelled_blob(connection, redis_url, run_name):
    keys = RunKeys(run_name)
    writer = WeightStore(connection, keys, ttl_seconds=30)
    writer.publish(versioned_state(1))
    n_versions, n_readers = 60, 3
    done = threading.Event()
    errors: list[str] = []
    seen: list[set[int]] = [set() for _ in range(n_readers)]

    def read(index: int) -> None:
        with redis.Redis.from_url(redis_url) as reader_connection:
            store = WeightStore(reader_connection, keys)
            held = None
            while not done.is_set() or held != n_versions:
                fetched = store.fetch_if_newer(held)
                if fetched is None:
                    continue
                version, state = fetched
                if held is not None and version <= held:
                    errors.append(f"reader {index} went back from {held} to {version}")
                for name, tensor in state.items():
                    if not torch.all(tensor == float(version)):
                        errors.append(f"reader {index}: {name} of version {version} holds {tensor.flatten()[0]}")
                seen[index].add(version)
                held = version
                if errors:
                    return

    readers = [threading.Thread(target=read, args=(index,), daemon=True) for index in range(n_readers)]
    for thread in readers:
        thread.start()
    for version in range(2, n_versions + 1):
        assert writer.publish(versioned_state(version)) == version
    done.set()
    for thread in readers:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert errors == []
    for versions in seen:
        assert n_versions in versions
    assert len(set().union(*seen)) > 2, "readers should have seen several versions while the writer published"
