"""A group's rollouts as one signed entry: round trips, and checks that refuse what check_record refuses."""

from __future__ import annotations

import dataclasses
import functools

import gymnasium
import numpy as np
import pytest
import safetensors.numpy
import torch

from rqrl.engine.codec import RECORD_MAGIC, TAG_SIZE, decode_arrays, encode_arrays, records_key, sign
from rqrl.engine.compression import COMPRESSED_MAGIC
from rqrl.engine.policy import PolicyStep, make_act_function
from rqrl.errors import RecordError, SignatureError
from rqrl.maze.group_records import (
    decode_signed_entry,
    encode_group,
    encode_signed_group,
    encode_signed_steps,
    encode_steps_group,
    entry_stream,
    records_per_entry,
)
from rqrl.maze.inbox import probe_spec
from rqrl.maze.records import RecordSpec, RolloutRecord, check_record, record_signature
from rqrl.maze.rollout import ActorGroup
from tests import fixtures
from tests.unit.test_records import MISFITS, SPEC, assert_records_equal, box_record, changed, nested_record

RUN = "run-a"
KEY = records_key("secret", RUN)


def short_cartpole() -> gymnasium.Env:
    """CartPole whose episodes are truncated after 6 steps: every rollout has truncations and finished episodes."""
    return gymnasium.make("CartPole-v1", max_episode_steps=6)


def real_rollouts(make_env, policy, n_actors: int = 3, steps: int = 16, rollout_id: int = 0):  # noqa: ANN001
    group = ActorGroup(make_env, list(range(2, 2 + n_actors)), [5, 6, 7][:n_actors], [8, 9, 10][:n_actors], steps)
    act = make_act_function(policy, group.action_space)
    for earlier in range(rollout_id):
        group.run(act, earlier, 1, cut_at_end=False)
    return group.run(act, rollout_id, 4, cut_at_end=rollout_id == 1, worker="w7"), act


@pytest.mark.parametrize("make_env,policy", [(short_cartpole, fixtures.mlp_policy()),
                                             (fixtures.make_dict_env, fixtures.DictPolicy())])
@pytest.mark.parametrize("rollout_id", [0, 1])
def test_a_real_group_round_trips_record_for_record_and_fits_the_probe_spec(make_env, policy, rollout_id):
    records, act = real_rollouts(make_env, policy, rollout_id=rollout_id)
    spec = probe_spec(make_env(), act, n_steps=16, n_actors=6)
    entry = decode_signed_entry(encode_signed_group(records, RUN, KEY), RUN, KEY, spec)
    assert entry.problem is None
    assert len(entry.records) == len(records)
    for decoded, original in zip(entry.records, records, strict=True):
        assert_records_equal(decoded, original)
        check_record(decoded, spec)  # the per-record check agrees with the group's
    if make_env is short_cartpole:
        assert sum(len(r.final_obs_steps) for r in records) > 0 and sum(len(r.episode_returns) for r in records) > 0


class NoLogitsPolicy:
    """Samples CartPole's actions itself and gives no logits (an ActorPolicy)."""

    def act(self, obs, generator) -> PolicyStep:  # noqa: ANN001
        actions = torch.randint(0, 2, (len(obs),), generator=generator)
        return PolicyStep(actions=actions, log_probs=torch.full((len(obs),), -0.5))


@pytest.mark.parametrize("make_env,policy", [(short_cartpole, fixtures.mlp_policy()),
                                             (fixtures.make_dict_env, fixtures.DictPolicy()),
                                             (short_cartpole, NoLogitsPolicy())])
@pytest.mark.parametrize("rollout_id", [1, 2])  # 2: cut at the end, every running episode truncated
@pytest.mark.parametrize("refused", [(), (0, 2)])  # actors whose first rollout here does not continue
def test_a_group_encoded_from_its_buffers_is_the_entry_its_records_make(make_env, policy, rollout_id, refused):
    group = ActorGroup(make_env, [2, 3, 4], [5, 6, 7], [8, 9, 10], 16)
    act = make_act_function(policy, group.action_space)
    for earlier in range(rollout_id):
        group.run(act, earlier, 1, cut_at_end=False)
    rollout = group.run_group(act, rollout_id, 4, cut_at_end=rollout_id == 2, worker="w7")
    records = [dataclasses.replace(record, continues_previous=False) if index in refused else record
               for index, record in enumerate(rollout.records())]
    continues = [record.continues_previous for record in records]
    from_buffers = encode_steps_group(rollout.steps, rollout.actor_ids, continues, 4, rollout_id, "w7", RUN)
    assert from_buffers == encode_group(records, RUN), "byte for byte the records' entry"
    assert encode_signed_steps(rollout.steps, rollout.actor_ids, continues, 4, rollout_id, "w7", RUN,
                               KEY) == encode_signed_group(records, RUN, KEY)
    for start, stop in [(0, 2), (2, 3), (1, 2)]:  # a group in several entries: each part from its actors' columns
        part = encode_steps_group(rollout.steps.actors(start, stop), rollout.actor_ids[start:stop],
                                  continues[start:stop], 4, rollout_id, "w7", RUN)
        assert part == encode_group(records[start:stop], RUN), (start, stop)
    if make_env is short_cartpole:
        assert sum(len(r.final_obs_steps) for r in records) > 0 and sum(len(r.episode_returns) for r in records) > 0
    assert continues == [index not in refused for index in range(3)]


def test_records_of_different_truncation_counts_split_at_the_right_rows():
    records = [box_record(5, truncated_at=at, actor_id=actor, offset=actor)
               for actor, at in enumerate([(), (1, 3), (4,)])]
    entry = decode_signed_entry(encode_signed_group(records, RUN, KEY), RUN, KEY, SPEC)
    assert entry.problem is None
    for decoded, original in zip(entry.records, records, strict=True):
        assert_records_equal(decoded, original)


def test_a_nested_dict_group_round_trips():
    first = nested_record()
    state = {**first.next_obs["state"], "goal": np.array(2, np.int64)}  # one observation: a scalar goal
    first = dataclasses.replace(first, next_obs={**first.next_obs, "state": state})
    second = dataclasses.replace(first, actor_id=1, continues_previous=True)
    entry = decode_signed_entry(encode_signed_group([first, second], RUN, KEY), RUN, KEY,
                                RecordSpec(n_steps=4, n_actors=4, signature=record_signature(first)))
    assert entry.problem is None
    for decoded, original in zip(entry.records, [first, second], strict=True):
        assert_records_equal(decoded, original)


def test_any_safetensors_reader_reads_a_group_entry():
    records = [box_record(5, truncated_at=(2,), actor_id=actor) for actor in range(2)]
    arrays = safetensors.numpy.load(encode_signed_group(records, RUN, KEY)[TAG_SIZE:])
    assert arrays["obs"].shape == (2, 5, 3) and arrays["final_obs"].shape == (2, 3)
    np.testing.assert_array_equal(arrays["actor_ids"], [0, 1])


def test_unsigned_tampered_and_foreign_entries_are_refused():
    blob = encode_signed_group([box_record(5, truncated_at=(2,))], RUN, KEY)
    with pytest.raises(SignatureError):
        decode_signed_entry(blob[TAG_SIZE:], RUN, KEY, SPEC)
    tampered = bytearray(blob)
    tampered[-1] ^= 1
    with pytest.raises(SignatureError, match="tampered"):
        decode_signed_entry(bytes(tampered), RUN, KEY, SPEC)
    other_key = records_key("secret", "run-b")
    with pytest.raises(RecordError, match="belongs to run 'run-b'"):
        decode_signed_entry(encode_signed_group([box_record(5, truncated_at=(2,))], "run-b", KEY), RUN, KEY, SPEC)
    with pytest.raises(SignatureError):
        decode_signed_entry(encode_signed_group([box_record(5, truncated_at=(2,))], "run-b", other_key), RUN, KEY,
                            SPEC)


def test_a_group_holds_rollouts_of_one_rollout_id_and_version():
    with pytest.raises(ValueError, match="one rollout id, policy version, worker and length"):
        encode_group([box_record(actor_id=0), box_record(actor_id=1, rollout_id=1)], RUN)


def test_inconsistent_counts_are_malformed():
    records = [box_record(5, truncated_at=(2,), actor_id=actor) for actor in range(2)]
    arrays, metadata = decode_arrays(encode_group(records, RUN))
    arrays = {name: np.array(value) for name, value in arrays.items()}
    arrays["final_obs_counts"] = np.array([2, 1], np.int64)
    with pytest.raises(RecordError, match="final_obs_counts add up to 3, its final_obs_steps has 2"):
        decode_signed_entry(sign(encode_arrays(arrays, metadata), KEY, RECORD_MAGIC), RUN, KEY, SPEC)
    del arrays["final_obs_counts"]
    with pytest.raises(RecordError, match="missing or has a malformed field"):
        decode_signed_entry(sign(encode_arrays(arrays, metadata), KEY, RECORD_MAGIC), RUN, KEY, SPEC)


# where the group's check words a refusal of check_record's differently (its arrays have an actor axis)
GROUP_WORDING = {
    r"final_obs_steps \[999\] are not increasing steps in \[0, 5\)":
        r"final_obs_steps \[999\] are not its truncated steps \[2\]",
    r"final_obs_steps \[-1\] are not increasing steps": r"final_obs_steps \[-1\] are not its truncated steps",
    r"next_obs is float32\[7\], expected float32\[3\]": r"next_obs is float32\[1, 7\], expected float32\[1, 3\]",
    r"next_obs is float64\[3\], expected float32\[3\]": r"next_obs is float64\[1, 3\], expected float32\[1, 3\]",
    r"names actor 4, this run has actors 0..3": r"names actors \[4\], this run has distinct actors 0..3",
    "names actor -1": r"names actors \[-1\]",
}


# what check_record refuses in one record, the group's checks refuse in the entry holding it
@pytest.mark.parametrize(("changes", "match"),
                         [(changes, GROUP_WORDING.get(match, match)) for changes, match in MISFITS])
def test_what_check_record_refuses_the_group_check_refuses(changes, match):
    bad = changed(**changes)
    with pytest.raises(RecordError):
        check_record(bad, SPEC)
    entry = decode_signed_entry(encode_signed_group([bad], RUN, KEY), RUN, KEY, SPEC)
    assert entry.problem is not None
    assert entry.records[0].actor_id == bad.actor_id  # the inbox still sees whose rollout was refused
    with pytest.raises(RecordError, match=match):
        raise entry.problem


@pytest.mark.parametrize("changes", [dict(rewards=np.full(5, np.inf, np.float32)),
                                     dict(actions=np.full(5, 2, np.int64)),
                                     dict(terminated=np.arange(5) == 2)])
def test_one_bad_record_among_good_ones_fails_the_entry(changes):
    records = [box_record(5, truncated_at=(2,), actor_id=0), changed(actor_id=1, **changes),
               box_record(5, truncated_at=(2,), actor_id=2)]
    assert decode_signed_entry(encode_signed_group(records, RUN, KEY), RUN, KEY, SPEC).problem is not None
    assert decode_signed_entry(encode_signed_group([records[0], records[2]], RUN, KEY), RUN, KEY,
                               SPEC).problem is None


def test_the_same_actor_twice_and_another_length_are_refused():
    twice = [box_record(5, truncated_at=(2,), actor_id=1), box_record(5, truncated_at=(2,), actor_id=1)]
    assert "distinct actors" in str(decode_signed_entry(encode_signed_group(twice, RUN, KEY), RUN, KEY, SPEC).problem)
    short = [box_record(4, truncated_at=(2,))]
    assert "record has 4 steps, this run's rollouts have 5" in str(
        decode_signed_entry(encode_signed_group(short, RUN, KEY), RUN, KEY, SPEC).problem)


def test_a_group_is_cut_into_entries_of_whole_rollouts_that_fit_the_entry_size():
    record = box_record(5, truncated_at=(2,))
    # obs 60, actions 40, rewards 20, terminated 5, truncated 5, log-probs 20, logits 40, next_obs 12 bytes; the
    # final observations and episodes, which vary per rollout, are not counted
    fixed = 60 + 40 + 20 + 5 + 5 + 20 + 40 + 12
    assert records_per_entry(record, entry_bytes=fixed) == 1
    assert records_per_entry(record, entry_bytes=3 * fixed + 1) == 3
    assert records_per_entry(record, entry_bytes=10) == 1, "a rollout larger than an entry goes alone"
    assert records_per_entry(box_record(5, truncated_at=(1, 2, 3))) == records_per_entry(record)
    assert [entry_stream(7, part) for part in range(3)] == [7, "7.1", "7.2"]


def test_frame_stacks_count_about_a_frame_per_step_when_a_group_is_cut():
    group = ActorGroup(functools.partial(fixtures.make_frame_stack_env, size=48), [0], [1], [2], 16)
    record = group.run(make_act_function(fixtures.FramePolicy48(), group.action_space), 0, 1, cut_at_end=False)[0]
    stacks = record.obs.nbytes  # 16 steps of (4, 48, 48)
    assert records_per_entry(record, entry_bytes=stacks) == 3, "a quarter of the stacks, plus the rest"


@pytest.mark.parametrize("name", ["actions", "log_probs", "logits", "obs"])
def test_a_per_step_array_with_another_number_of_steps_is_malformed(name):
    records = [box_record(5, truncated_at=(2,), actor_id=actor) for actor in range(2)]
    arrays, metadata = decode_arrays(encode_group(records, RUN))
    arrays = {key: np.array(value) for key, value in arrays.items()}
    arrays[name] = arrays[name][:, :4]  # 4 steps where the rewards have 5
    with pytest.raises(RecordError, match=rf"entry's {name} is \[2, 4.*with the steps of its rewards \[2, 5\]"):
        decode_signed_entry(sign(encode_arrays(arrays, metadata), KEY, RECORD_MAGIC), RUN, KEY, SPEC)


def test_records_of_a_group_entry_equal_records_built_with_every_check():
    records = [box_record(5, truncated_at=(1, 3), actor_id=actor, worker="w2", continues_previous=actor == 1)
               for actor in range(3)]
    decoded = decode_signed_entry(encode_signed_group(records, RUN, KEY), RUN, KEY, SPEC).records
    for record in decoded:
        checked = RolloutRecord(**{item.name: getattr(record, item.name) for item in dataclasses.fields(record)})
        assert_records_equal(record, checked)
        assert (record.worker, record.continues_previous) == (checked.worker, checked.continues_previous)
    assert [record.continues_previous for record in decoded] == [False, True, False]


@pytest.mark.parametrize("rollout_id", [0, 1])  # 1: cut at the end, every running episode truncated
def test_frame_stacks_go_as_unique_frames_compressed_and_decode_to_the_records(rollout_id):
    group = ActorGroup(fixtures.make_frame_stack_env, [2, 3, 4], [5, 6, 7], [8, 9, 10], 16)
    act = make_act_function(fixtures.FramePolicy(), group.action_space)
    for earlier in range(rollout_id):
        group.run(act, earlier, 1, cut_at_end=False)
    rollout = group.run_group(act, rollout_id, 4, cut_at_end=rollout_id == 1, worker="w7")
    records = rollout.records()
    continues = [record.continues_previous for record in records]
    blob = encode_signed_steps(rollout.steps, rollout.actor_ids, continues, 4, rollout_id, "w7", RUN, KEY)
    plain = encode_signed_group(records, RUN, KEY)  # every observation as it is
    assert blob[TAG_SIZE:].startswith(COMPRESSED_MAGIC)
    raw_obs = sum(record.obs.nbytes + record.next_obs.nbytes for record in records)
    assert len(blob) < 0.5 * raw_obs < len(plain), "unique frames, compressed"
    spec = probe_spec(fixtures.make_frame_stack_env(), act, n_steps=16, n_actors=11)
    entry = decode_signed_entry(blob, RUN, KEY, spec)
    assert entry.problem is None
    assert sum(len(r.final_obs_steps) for r in records) > 0, "truncated episodes: their final obs go too"
    for decoded, original in zip(entry.records, records, strict=True):
        assert_records_equal(decoded, original)
        check_record(decoded, spec)
