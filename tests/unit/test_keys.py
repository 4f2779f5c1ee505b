"""Redis key names and RQ job ids of one run: one prefix each, never colliding across runs."""

from __future__ import annotations

import fnmatch
import inspect
import re

import pytest
from rq.job import validate_job_id

from rqrl.engine.keys import RunKeys, check_run_name
from rqrl.errors import ConfigError

RQ_JOB_ID = re.compile(r"[A-Za-z0-9_-]+")


def every_key(keys: RunKeys) -> dict[str, str]:
    """Every key name RunKeys builds, found by introspection so new keys are covered too."""
    found = {}
    for name, member in inspect.getmembers(RunKeys):
        if name.startswith("_") or name in ("pattern", "job_id", "job_id_prefix", "run_name", "group_of_job",
                                                     "sampler_job_id"):
            continue
        if isinstance(member, property):
            found[name] = getattr(keys, name)
        elif inspect.isfunction(member):
            arity = len(inspect.signature(member).parameters) - 1
            found[name] = getattr(keys, name)(*range(3, 3 + arity))
    return found


def test_introspection_finds_the_known_keys():
    assert {"config", "env_factory", "policy", "latest_version", "weights", "trajectories", "pushed_rollouts", "errors",
            "stopped"} <= set(every_key(RunKeys("r")))


@pytest.mark.parametrize("run", ["r", "run-1", "A-b-9", "x" * 64])
def test_every_key_starts_with_the_run_prefix_and_matches_its_pattern(run):
    keys = RunKeys(run)
    assert keys.pattern == f"rqrl:{run}:*"
    for name, key in every_key(keys).items():
        assert key.startswith(f"rqrl:{run}:"), name
        assert fnmatch.fnmatchcase(key, keys.pattern), name


def test_keys_are_distinct():
    keys = RunKeys("r")
    names = list(every_key(keys).values()) + [keys.weights(4), keys.lease(4), keys.progress(5)]
    assert len(names) == len(set(names))
    assert keys.weights(1) == "rqrl:r:weights:1" and keys.latest_version == "rqrl:r:weights:latest"
    assert keys.weights_prefix + "12" == keys.weights(12)


def test_one_runs_pattern_does_not_match_another_runs_keys():
    for run, other in [("a", "ab"), ("a", "a-b"), ("run", "run-2")]:
        for key in every_key(RunKeys(other)).values():
            assert not fnmatch.fnmatchcase(key, RunKeys(run).pattern), (run, key)


@pytest.mark.parametrize("run", ["r", "run-1", "Z9", "x" * 64])
@pytest.mark.parametrize(("group", "rollout"), [(0, 0), (3, 12345), (17, 10**12)])
def test_job_ids_are_valid_for_rq_and_share_the_prefix(run, group, rollout):
    keys = RunKeys(run)
    job_id = keys.job_id(group, rollout)
    assert RQ_JOB_ID.fullmatch(job_id)
    validate_job_id(job_id)  # rq's own check
    assert job_id.startswith(keys.job_id_prefix)
    assert keys.job_id_prefix == f"rqrl_{run}_"


def test_job_ids_are_distinct_and_do_not_leak_across_runs():
    keys = RunKeys("a")
    ids = {keys.job_id(group, rollout) for group in range(12) for rollout in range(12)}
    assert len(ids) == 144
    for other in ("a-b", "ab", "b"):
        assert not RunKeys(other).job_id(0, 0).startswith(keys.job_id_prefix)


@pytest.mark.parametrize("bad", ["", "a:b", "a b", "a_b", "a*", "a/b", "x" * 65, "ü", "run.1", "{run}", None, 5,
                                 b"run"])
def test_bad_run_names_are_refused(bad):
    with pytest.raises(ConfigError, match="1-64 letters, digits or '-'"):
        check_run_name(bad)
    with pytest.raises(ConfigError):
        RunKeys(bad)


def test_a_trailing_newline_is_refused():
    with pytest.raises(ConfigError):
        check_run_name("run\n")


def test_good_run_names_pass_through():
    assert check_run_name("my-run-01") == "my-run-01"


def test_group_of_job_reads_back_the_group_of_this_runs_job_ids_only():
    keys = RunKeys("run-1")
    assert keys.group_of_job(keys.job_id(7, 42)) == 7
    assert RunKeys("run-12").group_of_job(keys.job_id(7, 42)) is None
    assert keys.group_of_job("rqrl_run-1_gx_r1") is None


def test_sampler_job_ids_are_valid_rq_ids_and_name_their_group():
    keys = RunKeys("run-1")
    job_id = keys.sampler_job_id(3, 12, "ab12cd")
    validate_job_id(job_id)
    assert RQ_JOB_ID.fullmatch(job_id) and job_id.startswith(keys.job_id_prefix)
    assert keys.group_of_job(job_id) == 3
    assert keys.group_of_job("rqrl_run-1_sx_v1_ab") is None
    assert keys.sampler_update(2, "agent", -1) == "rqrl:run-1:update:2:agent:all"
    assert keys.sampler_update(2, "env", 4) == "rqrl:run-1:update:2:env:4"
