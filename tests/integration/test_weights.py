"""WeightStore against a real Redis: versions, fetch-if-newer, expiry of old versions, untorn reads, and refusing
weights a Redis writer without the secret planted."""

from __future__ import annotations

import logging
import threading

import pytest
import redis
import torch

from rqrl.engine.codec import WEIGHTS_MAGIC, encode_state_dict, sign, weights_key
from rqrl.engine.keys import RunKeys
from rqrl.engine.weights import WeightStore
from tests import fixtures

SECRET = "weights-secret"


def new_store(connection: redis.Redis, run_name: str, **options) -> WeightStore:
    """A store of ``run_name`` whose run id is its name, under the test secret's weights key."""
    return WeightStore(connection, RunKeys(run_name), weights_key(SECRET, run_name), **options)


def signed_blob(run_name: str, state: dict[str, torch.Tensor], version: str, secret: str = SECRET) -> bytes:
    """A weights blob as a learner with ``secret`` publishes it (``version`` is what the blob names)."""
    return sign(encode_state_dict(state, {"version": version}), weights_key(secret, run_name), WEIGHTS_MAGIC)


def versioned_state(version: int, size: int = 2048) -> dict[str, torch.Tensor]:
    """Every value encodes the version, so a blob that mismatches its version shows."""
    return {"version": torch.tensor(float(version)), "body": torch.full((size,), float(version)),
            "half": torch.full((7, 3), float(version), dtype=torch.bfloat16)}


def test_publish_increments_versions(connection, run_name):
    store = new_store(connection, run_name)
    assert store.latest_version() is None
    assert [store.publish(versioned_state(v)) for v in range(1, 4)] == [1, 2, 3]
    assert store.latest_version() == 3
    assert connection.get(RunKeys(run_name).latest_version) == b"3"


def test_fetch_before_any_publish_is_none(connection, run_name):
    store = new_store(connection, run_name)
    assert store.fetch_if_newer(None) is None
    assert store.fetch_if_newer(0) is None


def test_fetch_if_newer(connection, run_name):
    store = new_store(connection, run_name)
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
    new_store(connection, run_name).publish(versioned_state(1))
    with redis.Redis.from_url(redis_url) as other_connection:
        fetched = new_store(other_connection, run_name).fetch_if_newer(None)
    assert fetched is not None and fetched[0] == 1 and fetched[1]["version"].item() == 1.0


def test_runs_do_not_see_each_others_weights(connection):
    new_store(connection, "run-a").publish(versioned_state(1))
    other = new_store(connection, "run-b")
    assert other.latest_version() is None and other.fetch_if_newer(None) is None


def test_old_versions_expire_and_the_latest_does_not(connection, run_name):
    keys = RunKeys(run_name)
    store = new_store(connection, run_name, ttl_seconds=50)
    store.publish(versioned_state(1))
    assert connection.ttl(keys.weights(1)) == -1
    store.publish(versioned_state(2))
    store.publish(versioned_state(3))
    for old in (1, 2):
        assert 0 < connection.ttl(keys.weights(old)) <= 50, old
    assert connection.ttl(keys.weights(3)) == -1
    assert connection.ttl(keys.latest_version) == -1


def test_a_check_sent_ahead_gives_what_fetch_if_newer_gives(connection, run_name):
    store = new_store(connection, run_name)
    assert store.send_fetch(None).result() is None, "nothing published yet"
    store.publish(versioned_state(1))
    sent = store.send_fetch(None)
    store.publish(versioned_state(2))  # after the check was sent: that check answers for the moment it ran
    version, state = sent.result()
    assert version == 1 and torch.all(state["body"] == 1.0)
    assert store.send_fetch(2).result() is None, "nothing newer than the version held"
    version, state = store.send_fetch(1).result()
    assert version == 2 and torch.all(state["body"] == 2.0)
    assert not connection.connection_pool._in_use_connections, "each check's connection went back to the pool"


def test_a_check_sent_ahead_refuses_forged_weights(connection, run_name, caplog):
    keys = RunKeys(run_name)
    connection.set(keys.weights(1), signed_blob(run_name, versioned_state(1), "1", secret="guessed"))
    connection.set(keys.latest_version, 1)
    store = new_store(connection, run_name)
    with caplog.at_level(logging.WARNING, logger="rqrl.engine.weights"):
        assert store.send_fetch(None).result() is None
    assert store.refused == 1
    assert any("weights version 1" in message for message in caplog.messages), caplog.messages


@pytest.mark.parametrize("how", ["connection-killed", "error-reply"])
def test_a_check_sent_ahead_whose_reply_is_lost_asks_again(connection, run_name, how):
    store = new_store(connection, run_name)
    store.publish(versioned_state(1))
    if how == "error-reply":  # a pointer of the wrong type: the sent GET's reply is an error
        keys = RunKeys(run_name)
        connection.delete(keys.latest_version)
        connection.hset(keys.latest_version, "version", 1)
        sent = store.send_fetch(None)
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            sent.result()  # asked again the waiting way, which raises what fetch_if_newer raises
    else:  # the server drops the connection before the reply is read (a restart, a network cut)
        sent = store.send_fetch(None)
        connection.client_kill_filter(_type="normal", skipme=True)
        version, state = sent.result()
        assert version == 1 and torch.all(state["body"] == 1.0)
    assert not connection.connection_pool._in_use_connections, "the check's connection went back to the pool"


def test_an_abandoned_check_closes_its_connection(connection, run_name):
    store = new_store(connection, run_name)
    store.publish(versioned_state(1))
    sent = store.send_fetch(None)
    sent.abandon()
    sent.abandon()  # twice: no error
    assert not connection.connection_pool._in_use_connections
    assert store.fetch_if_newer(None)[0] == 1, "the store's own connection is untouched"


def refused(store: WeightStore, held: int | None, caplog, match: str) -> None:
    """fetch_if_newer refuses what Redis holds: None, counted, and a warning naming why."""
    before = store.refused
    with caplog.at_level(logging.WARNING, logger="rqrl.engine.weights"):
        assert store.fetch_if_newer(held) is None
    assert store.refused == before + 1
    assert any(match in message for message in caplog.messages), caplog.messages


@pytest.fixture(autouse=True)
def every_refusal_logged(monkeypatch):
    monkeypatch.setattr("rqrl.engine.weights._REFUSALS.interval", 0.0)


def test_missing_blob_is_refused(connection, run_name, caplog):
    keys = RunKeys(run_name)
    store = new_store(connection, run_name)
    store.publish(versioned_state(1))
    connection.delete(keys.weights(1))
    refused(store, None, caplog, "version 1 is latest but its blob is missing")


def test_a_signed_blob_under_another_version_is_refused(connection, run_name, caplog):
    keys = RunKeys(run_name)
    connection.set(keys.weights(5), signed_blob(run_name, versioned_state(4), "4"))  # a replay of version 4
    connection.set(keys.latest_version, 5)
    refused(new_store(connection, run_name), None, caplog, "blob says version '4', pointer says 5")


def test_corrupt_blob_is_refused(connection, run_name, caplog):
    keys = RunKeys(run_name)
    connection.set(keys.weights(1), b"\x00\x01garbage")
    connection.set(keys.latest_version, 1)
    refused(new_store(connection, run_name), None, caplog, "unsigned")


@pytest.mark.parametrize("planted", ["unsigned", "another secret", "another run"])
def test_forged_weights_are_refused_and_the_held_ones_kept(connection, run_name, caplog, planted):
    keys = RunKeys(run_name)
    store = new_store(connection, run_name)
    store.publish(versioned_state(1))
    held, _ = store.fetch_if_newer(None)
    forged = {"unsigned": encode_state_dict(versioned_state(666), {"version": "2"}),
              "another secret": signed_blob(run_name, versioned_state(666), "2", secret="guessed"),
              "another run": signed_blob("another-run", versioned_state(666), "2")}[planted]
    connection.set(keys.weights(2), forged)
    connection.set(keys.latest_version, 2)
    refused(store, held, caplog, "weights version 2")
    assert store.fetch_if_newer(held) is None, "refused again, still without raising"
    assert store.publish(versioned_state(2)) == 2, "the learner counts on from its own version 1"
    version, state = store.fetch_if_newer(held)
    assert version == 2 and torch.all(state["body"] == 2.0)


@pytest.mark.parametrize("pointer", [b"abc", b"-3", b"2.5", str(2**63).encode(), b"0", b"1" * 30])
def test_a_pointer_that_is_no_version_is_refused(connection, run_name, caplog, pointer):
    keys = RunKeys(run_name)
    connection.set(keys.latest_version, pointer)
    connection.set(keys.weights_prefix + pointer.decode(), signed_blob(run_name, versioned_state(1), pointer.decode()))
    refused(new_store(connection, run_name), None, caplog, "not a version number")


def test_a_rolled_back_pointer_is_refused(connection, run_name, caplog):
    keys = RunKeys(run_name)
    store = new_store(connection, run_name, ttl_seconds=60)
    old_blob = None
    for version in (1, 2, 3):
        store.publish(versioned_state(version))
        if version == 1:
            old_blob = connection.get(keys.weights(1))
    connection.set(keys.weights(1), old_blob)  # genuine, replayed
    connection.set(keys.latest_version, 1)
    refused(store, 3, caplog, "went back from version 3 to 1")


def test_the_learner_never_counts_on_from_a_forged_pointer(connection, run_name):
    keys = RunKeys(run_name)
    huge = 2**63
    connection.set(keys.weights(huge), encode_state_dict(versioned_state(1), {"version": str(huge)}))
    connection.set(keys.latest_version, huge)
    store = new_store(connection, run_name)
    assert store.latest_version() is None
    assert store.publish(versioned_state(1)) == 1
    connection.set(keys.latest_version, 10**6)  # planted after its first publish: it counts on from its own
    assert store.publish(versioned_state(2)) == 2


def test_a_resuming_learner_counts_on_from_the_newest_verified_version(connection, run_name):
    keys = RunKeys(run_name)
    first = new_store(connection, run_name, ttl_seconds=60)
    for version in (1, 2, 3):
        first.publish(versioned_state(version))
    assert new_store(connection, run_name).last_published() == 3
    connection.set(keys.latest_version, 2**40)  # forged: the newest verified blob is still version 3's
    connection.set(keys.weights(2**40), encode_state_dict(versioned_state(9), {"version": str(2**40)}))
    resumed = new_store(connection, run_name)
    assert resumed.latest_version() is None and resumed.last_published() == 3
    assert resumed.publish(versioned_state(4)) == 4


@pytest.mark.timeout(60)
def test_concurrent_readers_never_see_a_torn_or_mislabelled_blob(connection, redis_url, run_name):
    writer = new_store(connection, run_name, ttl_seconds=30)
    writer.publish(versioned_state(1))
    n_versions, n_readers = 60, 3
    done = threading.Event()
    errors: list[str] = []
    seen: list[set[int]] = [set() for _ in range(n_readers)]

    def read(index: int) -> None:
        with redis.Redis.from_url(redis_url) as reader_connection:
            store = new_store(reader_connection, run_name)
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


def test_a_blob_that_expired_after_its_pointer_was_read_gives_the_newest_one(connection, run_name):
    """The pointer read ahead names version 1; by the time its blob is asked for, versions 2 and 3 came and 1 expired:
    the fetch reads the pointer again and loads version 3."""
    keys = RunKeys(run_name)
    store = new_store(connection, run_name)
    store.publish(versioned_state(1))
    sent = store.send_fetch(None)
    store.publish(versioned_state(2))
    store.publish(versioned_state(3))
    connection.delete(keys.weights(1))  # expired
    version, state = sent.result()
    assert version == 3 and torch.all(state["body"] == 3.0)


def test_a_fetch_runs_no_script(connection, run_name):
    """Fetching is plain GETs: a script returning a blob copies it into Lua and out again on Redis's one thread
    (about 20x a GET's cost for a Nature CNN's weights)."""
    store = new_store(connection, run_name)
    store.publish(versioned_state(1, size=1 << 20))
    connection.config_resetstat()
    assert store.fetch_if_newer(None)[0] == 1 and store.send_fetch(None).result()[0] == 1
    assert store.fetch_if_newer(1) is None and store.send_fetch(1).result() is None
    stats = connection.info("commandstats")
    commands = {name.removeprefix("cmdstat_"): command["calls"] for name, command in stats.items()}
    assert not {"eval", "evalsha", "fcall"} & set(commands), commands
    assert commands["get"] == 6, "the pointer four times, the blob twice"


def test_a_run_whose_weights_went_between_the_two_reads_gives_nothing_and_refuses_nothing(connection, run_name):
    keys = RunKeys(run_name)
    store = new_store(connection, run_name)
    store.publish(versioned_state(1))
    sent = store.send_fetch(None)
    connection.delete(keys.weights(1), keys.latest_version)  # the run stopped and its keys went
    assert sent.result() is None and store.refused == 0
