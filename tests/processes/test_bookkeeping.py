"""Junk in rqrl's bookkeeping keys (as a Redis writer without the secret can plant it), under real
workers: each is repaired or reported with the key's name, and the run keeps delivering real rollouts,
each actor's as one contiguous, never doubled run of rollout ids (issue 9, item 4)."""

from __future__ import annotations

import functools
import os
import time

import gymnasium
import numpy as np
import pytest
import redis
import torch

from rqrl import ActorFailedError, CollectTimeoutError, NoWorkersError, RedisDistributedActors, RolloutEvents
from rqrl.engine.rq_safety import failed_registry, rollout_queue
from tests import fixtures
from tests.children import WorkerProcesses
from tests.conftest import TEST_SECRET
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(180)


def actors_on_workers(redis_url, run_name, n_actors=1, **options) -> RedisDistributedActors:
    options.setdefault("collect_timeout", 40.0)
    return RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, n_actors, 1, 2.0,
                                  redis_url=redis_url, run_name=run_name, actors_per_job=1, secret=TEST_SECRET,
                                  **options)


def collect(actors, batches: int, delivered: list[tuple[int, int, bool]]) -> None:
    for _ in range(batches):
        record = actors.collect_outputs("cpu").record
        delivered += [(int(a), int(r), bool(c)) for a, r, c in zip(record.actor_id.tolist(), record.rollout_id.tolist(),
                                                                    record.continues_previous.tolist(), strict=True)]


def assert_contiguous(delivered: list[tuple[int, int, bool]], n_actors: int = 1) -> None:
    for actor in range(n_actors):
        ids = [r for a, r, _ in delivered if a == actor]
        assert ids == list(range(len(ids))), f"actor {actor}'s rollouts have gaps or doubles: {ids}"


def one_worker(workers, connection) -> None:
    workers.start("w0")
    workers.wait_registered(connection, 1)


@pytest.mark.parametrize("holder, expiry_ms", [
    ("job", None),                # a lease without expiry: its group would never be re-run
    ("job", 3_600_000),           # an hour: far beyond any lease rqrl gives
    ("a-stranger", None),         # a holder that is no job of the group
], ids=["no-expiry", "hour-long", "stranger"])
def test_a_lease_that_cannot_be_right_is_deleted_and_the_group_rerun(connection, redis_url, run_name, workers,
                                                                      holder, expiry_ms, caplog):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 3, delivered)
        value = actors.keys.job_id(0, 999) if holder == "job" else holder
        connection.set(actors.keys.lease(0), value, px=expiry_ms)  # the running job is fenced out and stops
        collect(actors, 8, delivered)
        assert actors.supervisor.reaper.leases_repaired >= 1
    assert_contiguous(delivered)
    assert actors.keys.lease(0) in caplog.text


def test_a_progress_that_is_no_rollout_id_is_replaced_by_what_the_learner_has(connection, redis_url, run_name,
                                                                               workers, caplog):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 3, delivered)
        with connection.pipeline(transaction=True) as pipe:  # junk progress, and the job fenced out
            pipe.set(actors.keys.progress(0), "abc")
            pipe.set(actors.keys.lease(0), "a-stranger")
            pipe.execute()
        collect(actors, 8, delivered)
    assert_contiguous(delivered)
    assert f"{actors.keys.progress(0)} holds b'abc', not a rollout id" in caplog.text


def test_error_list_entries_that_are_no_reports_are_dropped_and_counted(connection, redis_url, run_name, workers,
                                                                         caplog):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 2, delivered)
        connection.rpush(actors.keys.errors, b"not json", b"[]", b'{"job_id": 1}', b"\xff\xfe")
        collect(actors, 4, delivered)  # before the fix: JSONDecodeError / KeyError out of collect_outputs
        deadline = time.monotonic() + 10  # the error list is read at most every 0.5 s
        while actors.supervisor.error_reports_rejected < 4 and time.monotonic() < deadline:
            collect(actors, 1, delivered)
        assert actors.supervisor.error_reports_rejected == 4
    assert_contiguous(delivered)
    assert actors.keys.errors in caplog.text


def test_worker_records_with_junk_fields_do_not_break_counting_live_workers(connection, redis_url, run_name,
                                                                             workers):
    for name in ("w0", "w1"):
        workers.start(name)
    workers.wait_registered(connection, 2)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name, n_actors=2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 2, delivered)
        connection.hset("rq:worker:w0", mapping={"pid": "x", "birth": "not a date", "queues": "\xff"})
        connection.sadd("rq:workers:rqrl", "rq:worker:planted")
        connection.sadd("rq:workers", "rq:worker:planted")
        connection.hset("rq:worker:planted", mapping={"last_heartbeat": "yesterday", "pid": "x"})
        assert actors.workers_alive(cached=False) == 2  # before the fix: ValueError out of RQ's Worker.all
        collect(actors, 4, delivered)
    assert_contiguous(delivered, 2)


def test_an_acknowledged_counter_that_is_no_index_realigns_and_the_run_goes_on(connection, redis_url, run_name,
                                                                               workers, caplog):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 3, delivered)
        connection.set(actors.keys.acknowledged, "abc")
        collect(actors, 5, delivered)  # before the fix: a Lua error out of collect_outputs on every call
        assert actors.records_rejected == 0
    assert_contiguous(delivered)
    assert actors.keys.acknowledged in caplog.text


def test_a_pushed_marker_far_beyond_the_run_is_lowered_and_the_skip_counted(connection, redis_url, run_name,
                                                                            workers):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 3, delivered)
        connection.hset(actors.keys.pushed_rollouts, "0", 10**9)  # every later push looks like a duplicate
        started = time.monotonic()
        collect(actors, 6, delivered)  # the job lowers the marker after 2 * lease_seconds of refusals
        assert time.monotonic() - started < 35
        lost = actors.get_stats_value(RolloutEvents.rollouts_lost, name="sum")
        assert int(connection.hget(actors.keys.pushed_rollouts, "0")) < 10**6
    ids = [r for _, r, _ in delivered]
    assert ids == sorted(set(ids)), f"not increasing, or doubled: {ids}"
    skips = [(before, after) for before, after in zip(delivered, delivered[1:], strict=False)
             if after[1] != before[1] + 1]
    assert len(skips) >= 1 and lost == sum(after[1] - before[1] - 1 for before, after in skips)
    assert all(not after[2] for _, after in skips), "the rollout after a skip must not claim to continue"


def test_a_job_that_asks_for_rollout_ten_to_the_nine_starts_from_the_recorded_progress(connection, redis_url,
                                                                                       run_name, workers):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name, min_job_seconds=0.2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 3, delivered)
        # a permitted job function with absurd arguments, enqueued straight into RQ
        forged = rollout_queue("rqrl", connection).enqueue("rqrl.maze.jobs.run_actor_group", run_name, 0, 10**9,
                                                           job_id=actors.keys.job_id(0, 10**9), result_ttl=0)
        deadline = time.monotonic() + 30
        while connection.exists(forged.key) or connection.lpos("rq:queue:rqrl", forged.id) is not None:
            assert time.monotonic() < deadline, "the forged job never ran"
            collect(actors, 1, delivered)  # the running job yields to it within min_job_seconds
        collect(actors, 6, delivered)
    assert max(r for _, r, _ in delivered) < 1000
    assert_contiguous(delivered)


@pytest.mark.parametrize("group_id, rollout_id", [(-1, 0), ("0", 0), (0, -5)],
                         ids=["group-minus-one", "group-as-text", "negative-rollout"])
def test_a_job_with_arguments_no_learner_enqueues_is_refused_and_not_reported(connection, redis_url, run_name,
                                                                              workers, group_id, rollout_id):
    one_worker(workers, connection)
    delivered: list[tuple[int, int, bool]] = []
    with actors_on_workers(redis_url, run_name, min_job_seconds=0.2) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        collect(actors, 2, delivered)
        forged = rollout_queue("rqrl", connection).enqueue("rqrl.maze.jobs.run_actor_group", run_name, group_id,
                                                           rollout_id, job_id=f"forged-{run_name}", result_ttl=0)
        failed = failed_registry("rqrl", connection)
        deadline = time.monotonic() + 30
        while forged.id not in failed.get_job_ids():
            assert time.monotonic() < deadline, "the forged job never failed"
            collect(actors, 1, delivered)  # no ActorFailedError: the refusal is not the run's failure
        collect(actors, 3, delivered)
        assert "ForbiddenJobError" in (forged.fetch(forged.id, connection).exc_info or "")
        assert not connection.exists(actors.keys.lease(-1))
    assert_contiguous(delivered)


# ---- the weak cases: clear errors instead of a broken pipe or a misleading NoWorkersError -----------------


class BigObservationEnv(gymnasium.Env):
    """160 kB observations: 16 steps make a record over a server whose proto-max-bulk-len is 1 MB."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (40_000,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(40_000, np.float32), {}

    def step(self, action):
        return np.zeros(40_000, np.float32), 1.0, False, False, {}


class FirstFourPolicy(torch.nn.Module):
    """Logits from the first four numbers of the observation: small weights for big observations."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, obs):
        return self.linear(obs[:, :4])


def test_a_record_over_redis_value_limit_fails_at_once_naming_size_limit_and_fix(tmp_path):
    server = RedisServer(tmp_path, extra=["--proto-max-bulk-len", "1mb"]).start()
    pool = WorkerProcesses(server.url)
    try:
        pool.start("w0")
        pool.wait_registered(redis.Redis.from_url(server.url), 1)
        with RedisDistributedActors(BigObservationEnv, FirstFourPolicy(), 16, 1, 1, 2.0, redis_url=server.url,
                                    secret=TEST_SECRET, collect_timeout=60) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            started = time.monotonic()
            with pytest.raises(ActorFailedError, match=r"MB encoded, over the 1 MB a queue entry may be \(the "
                                                       r"learner's limit, or Redis's proto-max-bulk-len where "
                                                       r"smaller\): use a shorter n_rollout_steps"):
                actors.collect_outputs("cpu")
            assert time.monotonic() - started < 20, "before the fix: a broken pipe after about 60 s"
    finally:
        pool.stop_all()
        server.stop()


class ResetHangsOnceToldEnv(gymnasium.Env):
    """Five-step episodes whose reset blocks (for 300 s) once the file ``path`` exists."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, path: str):
        self.path, self.steps = path, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if os.path.exists(self.path):
            time.sleep(300)
        self.steps = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(4, np.float32), 1.0, self.steps >= 5, False, {}


def test_workers_hung_in_env_reset_are_named_as_hung_not_as_missing(connection, redis_url, run_name, workers,
                                                                    tmp_path):
    for name in ("w0", "w1"):
        workers.start(name)
    workers.wait_registered(connection, 2)
    hang = tmp_path / "hang"
    actors = RedisDistributedActors(functools.partial(ResetHangsOnceToldEnv, str(hang)), fixtures.mlp_policy(), 16,
                                    2, 2, 2.0, redis_url=redis_url, run_name=run_name, actors_per_job=1,
                                    secret=TEST_SECRET, no_worker_timeout=2.0, collect_timeout=90)
    actors.start()
    try:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        actors.collect_outputs("cpu")
        hang.touch()
        with pytest.raises(CollectTimeoutError) as raised:  # after LIVENESS_SECONDS + no_worker_timeout
            for _ in range(1000):
                actors.collect_outputs("cpu")
        assert not isinstance(raised.value, NoWorkersError), "the workers are alive: they must not be called missing"
        assert "their workers are alive and the jobs hung, most likely in the env's reset or step" in str(raised.value)
    finally:
        actors.stop(timeout=1)
        for process in workers.processes:  # blocked in reset: no warm shutdown to wait for
            process.kill()
