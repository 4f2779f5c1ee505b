"""RolloutRecord validation, its byte form, and batching into time-major [T, B] tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import safetensors.numpy
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rqrl.engine.codec import RECORD_MAGIC, TAG_SIZE, decode_arrays, encode_arrays, records_key, verified_view
from rqrl.engine.policy import make_act_function
from rqrl.errors import RecordError, SignatureError
from rqrl.maze.group_records import decode_group, encode_group, encode_signed_group
from rqrl.maze.records import (
    BatchedRecord,
    RecordSpec,
    RolloutRecord,
    batch_records,
    check_record,
    record_signature,
)
from rqrl.maze.rollout import ActorGroup
from tests import fixtures

RUN = "run-a"
KEY = records_key("secret", RUN)


def round_trip(record: RolloutRecord) -> RolloutRecord:
    """The record as the learner reads it back from the entry a worker pushes (a group of one)."""
    return decode_group(encode_group([record], RUN), RUN)[0]


def decode_one(blob: bytes, run_id: str = RUN) -> RolloutRecord:
    return decode_group(blob, run_id)[0]


def decode_signed(blob: bytes) -> RolloutRecord:
    return decode_group(verified_view(blob, KEY, RECORD_MAGIC), RUN)[0]


def box_record(steps: int = 5, *, truncated_at: tuple[int, ...] = (), actor_id: int = 0, rollout_id: int = 0,
               offset: float = 0.0, with_logits: bool = True, worker: str = "w1",
               continues_previous: bool = False) -> RolloutRecord:
    """A record with Box observations [T, 3] whose values are distinct per step and per record."""
    truncated = np.zeros(steps, bool)
    truncated[list(truncated_at)] = True
    return RolloutRecord(
        obs=(np.arange(steps * 3, dtype=np.float32).reshape(steps, 3) + offset),
        actions=np.arange(steps, dtype=np.int64) % 2,
        rewards=np.linspace(0, 1, steps, dtype=np.float32) + offset,
        terminated=np.arange(steps) == 0,
        truncated=truncated,
        log_probs=-np.arange(1, steps + 1, dtype=np.float32) / 10,
        logits=np.arange(steps * 2, dtype=np.float32).reshape(steps, 2) if with_logits else None,
        next_obs=np.full(3, 100 + offset, np.float32),
        final_obs=np.full((len(truncated_at), 3), 200 + offset, np.float32),
        final_obs_steps=np.array(truncated_at, np.int64),
        episode_returns=np.array([1.5 + offset, 2.5], np.float64),
        episode_lengths=np.array([3, 4], np.int64),
        policy_version=7,
        actor_id=actor_id,
        rollout_id=rollout_id,
        worker=worker,
        continues_previous=continues_previous,
    )


def nested_record(steps: int = 4) -> RolloutRecord:
    """A record whose observations are a nested dict: {"image": [T,2,2], "state": {"pos": [T,2], "goal": [T]}}."""
    def obs(n: int, base: float) -> dict:
        return {
            "image": np.arange(n * 4, dtype=np.uint8).reshape(n, 2, 2) + int(base),
            "state": {"pos": np.full((n, 2), base, np.float32), "goal": np.arange(n, dtype=np.int64)},
        }

    return RolloutRecord(
        obs=obs(steps, 1.0),
        actions=np.zeros(steps, np.int64),
        rewards=np.ones(steps, np.float32),
        terminated=np.zeros(steps, bool),
        truncated=np.array([False, True] + [False] * (steps - 2)),
        log_probs=np.zeros(steps, np.float32),
        logits=None,
        next_obs={"image": np.full((2, 2), 9, np.uint8), "state": {"pos": np.full(2, 5.0, np.float32),
                                                                   "goal": np.array([2], np.int64)}},
        final_obs=obs(1, 3.0),
        final_obs_steps=np.array([1], np.int64),
        episode_returns=np.array([2.0]),
        episode_lengths=np.array([2], np.int64),
        policy_version=1,
        actor_id=3,
        rollout_id=11,
    )


def assert_obs_equal(actual, expected) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected)
        for key in expected:
            assert_obs_equal(actual[key], expected[key])
    else:
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        np.testing.assert_array_equal(actual, expected)


def assert_records_equal(actual: RolloutRecord, expected: RolloutRecord) -> None:
    for name in ("obs", "next_obs", "final_obs", "actions", "rewards", "terminated", "truncated", "log_probs",
                 "final_obs_steps", "episode_returns", "episode_lengths"):
        assert_obs_equal(getattr(actual, name), getattr(expected, name))
    if expected.logits is None:
        assert actual.logits is None
    else:
        assert_obs_equal(actual.logits, expected.logits)
    for name in ("policy_version", "actor_id", "rollout_id", "worker", "continues_previous"):
        assert getattr(actual, name) == getattr(expected, name)


# --- round trip ---------------------------------------------------------------------------------


def test_round_trip_preserves_a_box_record():
    record = box_record(6, truncated_at=(2,))
    decoded = round_trip(record)
    assert_records_equal(decoded, record)


@pytest.mark.parametrize("continues_previous", [False, True])
def test_round_trip_keeps_whether_a_rollout_continues_the_previous_one(continues_previous):
    record = box_record(4, continues_previous=continues_previous)
    assert round_trip(record).continues_previous is continues_previous
    batch = batch_records([record, box_record(4, actor_id=1)], "cpu")
    assert batch.continues_previous.tolist() == [continues_previous, False]


def test_round_trip_preserves_a_record_without_logits_or_truncations():
    record = box_record(3, with_logits=False)
    decoded = round_trip(record)
    assert decoded.logits is None
    assert decoded.final_obs.shape == (0, 3)
    assert_records_equal(decoded, record)


def test_round_trip_preserves_a_nested_dict_record():
    record = nested_record()
    decoded = round_trip(record)
    assert set(decoded.obs) == {"image", "state"} and set(decoded.obs["state"]) == {"pos", "goal"}
    assert_records_equal(decoded, record)


def test_round_trip_of_a_real_dict_env_rollout():
    group = ActorGroup(fixtures.make_dict_env, [0], [5], [6], 25)
    record = group.run(make_act_function(fixtures.DictPolicy(), group.action_space), 0, 1, cut_at_end=False)[0]
    decoded = round_trip(record)
    assert_obs_equal(decoded.obs, record.obs)
    assert_obs_equal(decoded.final_obs, record.final_obs)
    np.testing.assert_array_equal(decoded.actions, record.actions)


def test_round_trip_keeps_scalar_next_obs_scalar():
    group = ActorGroup(fixtures.make_dict_env, [0, 1], [5, 6], [7, 8], 4)
    records = group.run(make_act_function(fixtures.DictPolicy(), group.action_space), 0, 1, cut_at_end=False)
    assert records[0].next_obs["goal"].shape == ()
    decoded = [round_trip(record) for record in records]
    assert decoded[0].next_obs["goal"].shape == ()
    assert batch_records(decoded, "cpu").next_obs["goal"].shape == (2,)


def test_decode_refuses_another_runs_record():
    blob = encode_group([box_record()], "run-a")
    with pytest.raises(RecordError, match="run-a"):
        decode_one(blob, "run-b")


def test_decode_refuses_a_foreign_format():
    blob = encode_arrays({"rewards": np.zeros(2, np.float32)}, {"format": "something.else", "run_id": RUN})
    with pytest.raises(RecordError, match="something.else"):
        decode_one(blob)


def test_decode_refuses_missing_arrays_and_metadata():
    arrays, metadata = decode_arrays(encode_group([box_record()], RUN))
    assert decode_one(encode_arrays(arrays, metadata)).n_steps == 5
    for name in arrays:
        if name == "logits":  # optional: a policy without logits
            continue
        partial = {key: value for key, value in arrays.items() if key != name}
        with pytest.raises(RecordError):
            decode_one(encode_arrays(partial, metadata))
    for name in ("policy_version", "rollout_id"):
        with pytest.raises(RecordError, match=name):
            decode_one(encode_arrays(arrays, {k: v for k, v in metadata.items() if k != name}))
    with pytest.raises(RecordError, match="malformed"):
        decode_one(encode_arrays(arrays, {**metadata, "policy_version": "seven"}))


@pytest.mark.parametrize("cut", [0, 1, 7, 8, 100, -1, -20])
def test_truncated_bytes_are_refused(cut):
    blob = encode_group([box_record()], RUN)
    with pytest.raises(RecordError):
        decode_one(blob[:cut])


@pytest.mark.parametrize("blob", [b"", b"\x00" * 8, b"\xff" * 64, b"not a record at all",
                                  b"\x05" + b"\x00" * 7 + b"{}"])
def test_garbage_is_refused(blob):
    with pytest.raises(RecordError):
        decode_one(blob)


def test_corrupted_header_is_refused():
    blob = bytearray(encode_group([box_record()], RUN))
    blob[8:12] = b"XXXX"  # break the JSON header
    with pytest.raises(RecordError):
        decode_one(bytes(blob))


def test_scalar_step_arrays_are_refused_as_record_error():
    names = ("actions", "rewards", "terminated", "truncated", "log_probs", "obs", "next_obs", "final_obs",
             "final_obs_steps", "episode_returns", "episode_lengths")
    metadata = {"format": "rqrl.rollouts.v1", "run_id": RUN, "policy_version": "1", "rollout_id": "0"}
    arrays = {name: np.zeros((), np.float32) for name in names} | {"actor_ids": np.zeros(1, np.int64)}
    blob = safetensors.numpy.save(arrays, metadata=metadata)
    with pytest.raises(RecordError):
        decode_one(blob)


# --- fuzzing ------------------------------------------------------------------------------------

VALID_BLOB = encode_group([box_record(4, truncated_at=(1,))], RUN)
NESTED_BLOB = encode_group([nested_record()], RUN)


def decode_or_record_error(blob: bytes) -> None:
    """decode_group either returns self-consistent records or raises RecordError, nothing else."""
    try:
        records = decode_group(blob, RUN)
    except RecordError:
        return
    for record in records:
        assert isinstance(record, RolloutRecord)
        assert len(record.actions) == len(record.truncated) == record.n_steps
        assert len(record.final_obs_steps) == int(record.truncated.sum())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_fuzz_arbitrary_bytes(blob):
    decode_or_record_error(blob)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=8, max_size=64).map(lambda tail: b"\x40\x00\x00\x00\x00\x00\x00\x00" + tail))
def test_fuzz_plausible_header_sizes(blob):
    decode_or_record_error(blob)


@st.composite
def mutated_blobs(draw):
    blob = bytearray(draw(st.sampled_from([VALID_BLOB, NESTED_BLOB])))
    header_end = 8 + int.from_bytes(blob[:8], "little")
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["header", "anywhere", "delete", "insert"]))
        if kind == "header":  # most interesting: JSON names, dtypes, shapes and offsets
            index = draw(st.integers(8, header_end - 1))
            blob[index] = draw(st.sampled_from(b'0123456789[]{}",: abcdefgorsu_/FIUBL'))
        elif kind == "anywhere":
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
        elif kind == "delete":
            del blob[draw(st.integers(0, len(blob) - 1))]
        else:
            blob.insert(draw(st.integers(0, len(blob))), draw(st.integers(0, 255)))
    return bytes(blob)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_blobs())
def test_fuzz_mutated_valid_records(blob):
    decode_or_record_error(blob)


# --- validation ---------------------------------------------------------------------------------


def record_fields(**changes) -> dict:
    record = box_record(5, truncated_at=(2,))
    fields = {name: getattr(record, name) for name in record.__dataclass_fields__}
    fields.update(changes)
    return fields


@pytest.mark.parametrize("name", ["actions", "terminated", "truncated", "log_probs"])
def test_step_field_length_mismatch_is_named(name):
    short = record_fields()[name][:3]
    with pytest.raises(RecordError, match=rf"expected {name} of length 5 \(rewards\), got 3"):
        RolloutRecord(**record_fields(**{name: short}))


def test_logits_length_mismatch_is_named():
    with pytest.raises(RecordError, match="expected logits of length 5, got 4"):
        RolloutRecord(**record_fields(logits=np.zeros((4, 2), np.float32)))


def test_obs_length_mismatch_names_the_nested_path():
    with pytest.raises(RecordError, match="expected obs of length 5, got 6"):
        RolloutRecord(**record_fields(obs=np.zeros((6, 3), np.float32)))
    bad = {"state": {"pos": np.zeros((5, 2)), "goal": np.zeros(4)}}
    with pytest.raises(RecordError, match="expected obs/state/goal of length 5, got 4"):
        RolloutRecord(**record_fields(obs=bad))


def test_final_obs_steps_must_match_truncations():
    with pytest.raises(RecordError, match=r"one final_obs per truncated step \(1\), got 0"):
        RolloutRecord(**record_fields(final_obs_steps=np.zeros(0, np.int64)))


def test_obs_keys_with_a_slash_are_refused():
    record = box_record()
    fields = {name: getattr(record, name) for name in record.__dataclass_fields__}
    fields["obs"] = {"a/b": record.obs}
    with pytest.raises(RecordError, match="'a/b'"):
        RolloutRecord(**fields)


# --- batching -----------------------------------------------------------------------------------


def test_batch_records_stacks_time_major():
    records = [box_record(5, actor_id=0, rollout_id=3, offset=0.0, worker="w0"),
               box_record(5, truncated_at=(1, 3), actor_id=1, rollout_id=4, offset=1000.0, worker="w1"),
               box_record(5, truncated_at=(4,), actor_id=2, rollout_id=5, offset=2000.0, worker="w2")]
    batch = batch_records(records, "cpu")
    assert isinstance(batch, BatchedRecord)
    assert batch.n_steps == 5 and batch.batch_size == 3
    assert batch.obs.shape == (5, 3, 3)
    for name in ("actions", "rewards", "terminated", "truncated", "log_probs"):
        assert getattr(batch, name).shape == (5, 3), name
    assert batch.logits.shape == (5, 3, 2)
    assert batch.next_obs.shape == (3, 3)
    torch.testing.assert_close(batch.obs[:, 1], torch.from_numpy(records[1].obs))
    torch.testing.assert_close(batch.rewards[:, 2], torch.from_numpy(records[2].rewards))
    assert batch.terminated.dtype == torch.bool and batch.actions.dtype == torch.int64
    assert batch.policy_version.tolist() == [7, 7, 7]
    assert batch.actor_id.tolist() == [0, 1, 2] and batch.rollout_id.tolist() == [3, 4, 5]
    assert batch.worker == ("w0", "w1", "w2")
    # final observations: (time step, batch column), in the order of final_obs
    assert batch.final_obs_index.tolist() == [[1, 1], [3, 1], [4, 2]]
    assert batch.final_obs.shape == (3, 3)
    assert batch.final_obs[:, 0].tolist() == [1200.0, 1200.0, 2200.0]
    for (step, column) in batch.final_obs_index.tolist():
        assert batch.truncated[step, column]
    assert batch.episode_returns.tolist() == [1.5, 2.5, 1001.5, 2.5, 2001.5, 2.5]
    assert batch.episode_lengths.tolist() == [3, 4] * 3


def test_batch_records_without_truncations_has_empty_final_obs():
    batch = batch_records([box_record(4), box_record(4)], "cpu")
    assert batch.final_obs.shape == (0, 3)
    assert batch.final_obs_index.shape == (0, 2) and batch.final_obs_index.dtype == torch.int64


def test_batch_records_drops_logits_unless_every_record_has_them():
    batch = batch_records([box_record(4), box_record(4, with_logits=False)], "cpu")
    assert batch.logits is None


def test_batch_records_of_nested_dict_obs():
    batch = batch_records([nested_record(), nested_record()], "cpu")
    assert batch.obs["image"].shape == (4, 2, 2, 2)
    assert batch.obs["state"]["pos"].shape == (4, 2, 2)
    assert batch.obs["state"]["goal"].shape == (4, 2)
    assert batch.next_obs["image"].shape == (2, 2, 2)
    assert batch.final_obs["state"]["pos"].shape == (2, 2)
    assert batch.final_obs_index.tolist() == [[1, 0], [1, 1]]


def test_batch_records_refuses_mixed_lengths_and_nothing():
    with pytest.raises(RecordError, match=r"one length, got lengths \[4, 5\]"):
        batch_records([box_record(5), box_record(4)], "cpu")
    with pytest.raises(RecordError, match="zero records"):
        batch_records([], "cpu")


# --- signed records -----------------------------------------------------------------------------

def test_signed_round_trip():
    record = box_record(6, truncated_at=(2,))
    assert_records_equal(decode_signed(encode_signed_group([record], RUN, KEY)), record)


def test_unsigned_forged_or_foreign_records_are_refused_before_decoding():
    record = box_record()
    for blob in (encode_group([record], RUN),  # what a Redis writer without the secret can make
                 encode_signed_group([record], RUN, records_key("guessed", RUN)),
                 encode_signed_group([record], "run-b", records_key("secret", "run-b")),
                 b"", b"RQRLREC1" + b"\x00" * 40):
        with pytest.raises(SignatureError):
            decode_signed(blob)


def test_a_tampered_value_in_a_signed_record_is_refused():
    blob = encode_signed_group([box_record()], RUN, KEY)
    rewards = box_record().rewards.tobytes()
    tampered = blob.replace(rewards, (box_record().rewards + 1e6).tobytes())
    assert tampered != blob and len(tampered) == len(blob)
    decode_one(tampered[TAG_SIZE:])  # the bytes still decode: only the tag tells
    with pytest.raises(SignatureError, match="tampered"):
        decode_signed(tampered)


# --- checking a record against its run ------------------------------------------------------------

SPEC = RecordSpec(n_steps=5, n_actors=4, signature=record_signature(box_record()), action_bounds=(0, 2))


def changed(**changes) -> RolloutRecord:
    return RolloutRecord(**record_fields(**changes))


def test_a_record_of_the_run_passes():
    check_record(box_record(5, truncated_at=(2,)), SPEC)
    check_record(box_record(5, truncated_at=(4,), actor_id=3, rollout_id=2**62 - 1), SPEC)
    nested = nested_record()
    nested = dataclasses.replace(nested, next_obs={**nested.next_obs, "state": {**nested.next_obs["state"],
                                                                                "goal": np.array(2, np.int64)}})
    check_record(nested, RecordSpec(n_steps=4, n_actors=4, signature=record_signature(nested)))
    with pytest.raises(RecordError, match=r"next_obs/state/goal is int64\[1\], expected int64\[\]"):
        check_record(nested_record(), RecordSpec(n_steps=4, n_actors=4))
    check_record(box_record(), RecordSpec(n_steps=5, n_actors=1))  # no signature, no action bounds


MISFITS = [  # (changes to a record of the run, what the refusal says); tests/unit/test_group_records.py reuses it
    (dict(rewards=np.full(5, np.nan, np.float32)), "rewards hold values that are not finite"),
    (dict(rewards=np.full(5, np.inf, np.float32)), "rewards hold values that are not finite"),
    (dict(log_probs=np.full(5, np.nan, np.float32)), "log_probs hold values that are not finite"),
    (dict(episode_returns=np.array([np.nan, 1.0])), "episode_returns hold values that are not finite"),
    (dict(episode_lengths=np.array([0, 4])), "episode_lengths hold lengths below 1"),
    (dict(episode_lengths=np.array([3])), "episode_returns .2. and episode_lengths .1."),
    (dict(logits=np.full((5, 2), np.nan, np.float32)), "logits are NaN"),
    # observations are trained on whether the policy looked at them or not (issue 24)
    (dict(obs=np.full((5, 3), np.nan, np.float32)), "obs hold values that are not finite"),
    (dict(next_obs=np.full(3, np.inf, np.float32)), "next_obs hold values that are not finite"),
    (dict(final_obs=np.full((1, 3), -np.inf, np.float32)), "final_obs hold values that are not finite"),
    (dict(actions=np.full(5, 2, np.int64)), r"actions are not integers in \[0, 2\)"),
    (dict(actions=np.full(5, -1, np.int64)), r"actions are not integers in \[0, 2\)"),
    (dict(final_obs_steps=np.array([999])), r"final_obs_steps \[999\] are not increasing steps in \[0, 5\)"),
    (dict(final_obs_steps=np.array([-1])), r"final_obs_steps \[-1\] are not increasing steps"),
    (dict(final_obs_steps=np.array([3])), r"final_obs_steps \[3\] are not its truncated steps \[2\]"),
    (dict(terminated=np.arange(5) == 2), "both terminated and truncated"),
    (dict(next_obs=np.zeros(7, np.float32)), r"next_obs is float32\[7\], expected float32\[3\]"),
    (dict(next_obs=np.zeros(3, np.float64)), r"next_obs is float64\[3\], expected float32\[3\]"),
    (dict(next_obs={"a": np.zeros(3, np.float32)}), r"next_obs has arrays \['obs/a'\], its obs \['obs'\]"),
    (dict(final_obs=np.zeros((1, 4), np.float32)), r"final_obs is float32\[1, 4\], expected float32\[1, 3\]"),
    (dict(obs=np.zeros((5, 3), np.float64), next_obs=np.zeros(3), final_obs=np.zeros((1, 3))),
     r"arrays \['obs'\] are \[\(\(3,\), 'float64'\)\]"),
    (dict(rewards=np.zeros(5, np.float64)), r"arrays \['rewards'\]"),
    (dict(logits=None), r"arrays \['logits'\]"),
    (dict(actor_id=4), r"names actor 4, this run has actors 0..3"),
    (dict(actor_id=-1), "names actor -1"),
    (dict(rollout_id=-1), r"rollout_id -1 is outside \[0, 2\*\*62\)"),
    (dict(policy_version=2**63), r"policy_version 9223372036854775808 is outside"),
]


@pytest.mark.parametrize(("changes", "match"), MISFITS)
def test_a_field_that_does_not_fit_the_run_is_named(changes, match):
    with pytest.raises(RecordError, match=match):
        check_record(changed(**changes), SPEC)


def test_a_record_of_another_length_is_refused():
    with pytest.raises(RecordError, match="record has 4 steps, this run's rollouts have 5"):
        check_record(box_record(4), SPEC)


def test_the_probe_spec_of_a_real_env_fits_its_real_rollouts():
    from rqrl.maze.inbox import probe_spec

    for make_env, policy in ((fixtures.make_cartpole, fixtures.mlp_policy()),
                             (fixtures.make_dict_env, fixtures.DictPolicy())):
        env = make_env()
        act = make_act_function(policy, env.action_space)
        spec = probe_spec(env, act, n_steps=40, n_actors=2)
        assert spec.signature is not None and spec.action_bounds is not None
        group = ActorGroup(make_env, [0, 1], [5, 6], [7, 8], 40)
        for rollout_id in range(3):
            for record in group.run(act, rollout_id, 1, cut_at_end=rollout_id == 1):
                check_record(decode_signed(encode_signed_group([record], RUN, KEY)), spec)


def test_dones_is_maze_view_of_terminated_or_truncated():
    from tests.factories import rollout_record

    records = [rollout_record(6, terminated=[1], final_obs_steps=[4]), rollout_record(6, actor_id=1, terminated=[5])]
    batch = batch_records(records, "cpu")
    assert batch.dones.dtype == torch.bool and batch.dones.shape == (6, 2)
    assert batch.dones[:, 0].tolist() == [False, True, False, False, True, False]
    assert batch.dones[:, 1].tolist() == [False] * 5 + [True]
    assert torch.equal(batch.dones, batch.terminated | batch.truncated)
