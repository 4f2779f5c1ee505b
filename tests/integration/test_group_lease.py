"""The lease/progress protocol of rqrl.engine.leases and the worker's context cache of rqrl.maze.jobs, driven
directly against the test Redis (no worker processes): acquire, refresh, release, loss, hangs,
failures, and which envs a worker closes when runs come and go or a job loses its group."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from rqrl.engine import enqueue, group_job
from rqrl.engine import jobs as engine_jobs
from rqrl.engine.codec import dumps_object, weights_key
from rqrl.engine.group_job import WarmContexts
from rqrl.engine.keys import RunKeys
from rqrl.engine.leases import GroupLease, Reaper, group_is_leased, hand_over, read_progress, set_progress
from rqrl.engine.rq_safety import failed_registry
from rqrl.engine.run_config import RunConfig
from rqrl.engine.timings import protocol_timings
from rqrl.engine.weights import WeightStore
from rqrl.errors import LeaseLostError
from rqrl.maze import jobs
from tests import fixtures
from tests.conftest import TEST_SECRET
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def keys(run_name) -> RunKeys:
    return RunKeys(run_name)


@pytest.fixture
def leases():
    """GroupLeases made by a test, all released (their refresher threads stopped) at the end."""
    made: list[GroupLease] = []

    def make(connection, keys, holder="job-a", lease_seconds=1.0, hang_seconds=30.0, group_id=0) -> GroupLease:
        lease = GroupLease(connection, keys, group_id, holder, lease_seconds, hang_seconds)
        made.append(lease)
        return lease

    yield make
    for lease in made:
        lease.release()


# ---- GroupLease ---------------------------------------------------------------------------------------


def test_acquire_takes_the_lease_with_its_ttl(connection, keys, leases):
    connection.set(keys.lease(0), "a-dead-job", px=60_000)
    lease = leases(connection, keys, lease_seconds=2.0)
    lease.acquire()
    assert connection.get(keys.lease(0)) == b"job-a"  # taken over from the dead holder
    assert 1_000 < connection.pttl(keys.lease(0)) <= 2_000
    assert group_is_leased(connection, keys, 0)


def test_the_refresher_keeps_the_lease_alive_and_stores_progress(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=0.4)
    lease.acquire()
    lease.record_progress(7)
    time.sleep(1.2)  # the point: three TTLs, after which the lease would be gone without refreshes
    assert connection.get(keys.lease(0)) == b"job-a"
    assert connection.pttl(keys.lease(0)) > 0
    wait_until(lambda: read_progress(connection, keys, 0) == 7, message="progress 7 stored by the refresher")


def test_release_stores_the_final_progress_and_deletes_its_own_lease(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=5.0)  # refreshes every 1.25 s: release must write progress
    lease.acquire()
    lease.record_progress(3)
    lease.release()
    assert read_progress(connection, keys, 0) == 3
    assert connection.get(keys.lease(0)) is None
    assert not group_is_leased(connection, keys, 0)


def test_release_leaves_another_holders_lease_alone(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=5.0)
    lease.acquire()
    connection.set(keys.lease(0), "job-b", px=5_000)  # the reaper gave the group to another job
    lease.release()
    assert connection.get(keys.lease(0)) == b"job-b"


def test_a_lease_taken_by_another_job_makes_record_progress_raise(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=0.4)
    lease.acquire()
    lease.record_progress(1)
    connection.set(keys.lease(0), "job-b", px=5_000)
    wait_until(lambda: lease.lost, message="the refresher noticing the lost lease")
    with pytest.raises(LeaseLostError, match="group 0 was taken over by another job; job-a stops"):
        lease.record_progress(2)
    assert connection.get(keys.lease(0)) == b"job-b"
    assert read_progress(connection, keys, 0) != 2, "a lost lease must not store progress"


def test_no_progress_for_hang_seconds_lets_the_lease_expire(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=0.4, hang_seconds=1.2)
    lease.acquire()
    time.sleep(0.8)  # the point: two TTLs, before the hang deadline: the refresher must still keep the lease
    assert group_is_leased(connection, keys, 0), "the lease lapsed before the hang deadline"
    wait_until(lambda: not group_is_leased(connection, keys, 0), timeout=5.0, message="the hung job's lease expiring")


def test_touch_keeps_a_waiting_job_from_being_judged_hung(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=0.4, hang_seconds=0.6)
    lease.acquire()
    deadline = time.monotonic() + 1.5  # the point: past the hang deadline, which touches keep moving
    while time.monotonic() < deadline:
        lease.touch()  # waiting for queue space or weights: alive, not hung
        time.sleep(0.05)
    assert group_is_leased(connection, keys, 0)


def test_mark_failed_keeps_the_group_from_the_reaper(connection, keys, leases):
    lease = leases(connection, keys, lease_seconds=0.4)
    lease.acquire()
    assert lease.mark_failed()
    time.sleep(1.0)  # the point: past the TTL, a failed group keeps its marker, with no TTL
    assert connection.get(keys.lease(0)) == b"failed:job-a"
    assert connection.pttl(keys.lease(0)) == -1
    reaper = Reaper(connection, keys, 1, min_interval=0.0)
    assert reaper.orphaned_groups("rq:queue:none") == [] and reaper.orphaned_groups("rq:queue:none") == []


def test_a_job_that_failed_after_losing_its_group_leaves_the_new_holder_alone(connection, keys, leases):
    hung = leases(connection, keys, holder="job-hung")
    hung.acquire()
    rescuer = leases(connection, keys, holder="job-rescuer")
    rescuer.acquire()  # the reaper gave the group to another job while the first one hung
    assert not hung.mark_failed()
    assert connection.get(keys.lease(0)) == b"job-rescuer"
    rescuer.record_progress(1)  # the rescuer's fence still holds: no LeaseLostError


# ---- the protocol's functions -------------------------------------------------------------------------


def test_hand_over_gives_lease_and_progress_in_one_transaction(connection, keys):
    with connection.pipeline(transaction=True) as pipe:
        hand_over(pipe, keys, 2, "job-c", 5, lease_seconds=3.0)
        assert connection.get(keys.lease(2)) is None, "queued on the pipeline, not sent yet"
        pipe.execute()
    assert connection.get(keys.lease(2)) == b"job-c"
    assert 2_000 < connection.pttl(keys.lease(2)) <= 3_000
    assert read_progress(connection, keys, 2) == 5


def test_progress_defaults_to_zero_and_set_progress_moves_it(connection, keys):
    assert read_progress(connection, keys, 1) == 0
    set_progress(connection, keys, 1, 9)
    assert read_progress(connection, keys, 1) == 9
    assert not group_is_leased(connection, keys, 1)


# ---- the worker's context cache (rqrl.maze.jobs) -------------------------------------------------------------

CLOSED: list[str] = []  # labels of ClosingEnv instances closed in this process


class ClosingEnv(fixtures.CountingEnv):
    """CountingEnv that records its close(), so a test sees which cached envs a worker freed."""

    def __init__(self, label: str):
        super().__init__(length=50)
        self.label = label

    def close(self):
        CLOSED.append(self.label)
        super().close()


def make_closing_env(label: str) -> ClosingEnv:
    return ClosingEnv(label)


def store_run(connection, run_name: str, lease_seconds: float = 5.0) -> RunConfig:
    """Write a run's config and signed env factory and policy, as the learner does."""
    import functools

    config = RunConfig(run_name=run_name, run_id=f"id-{run_name}", queue_name="rqrl-test-contexts",
                       n_rollout_steps=8, n_actors=1, batch_size=1, queue_bound=10_000, actor_env_seeds=[0],
                       actor_agent_seeds=[1], actor_groups=[[0]],
                       timings=dataclasses.replace(protocol_timings(), lease=lease_seconds))
    keys = RunKeys(run_name)
    connection.set(keys.env_factory, dumps_object(functools.partial(make_closing_env, run_name), TEST_SECRET))
    connection.set(keys.policy, dumps_object(fixtures.mlp_policy(obs_size=1), TEST_SECRET))
    connection.set(keys.config, config.to_json())
    return config


@pytest.fixture
def worker_cache(monkeypatch):
    """This process as a worker: the shared secret set, an empty context cache, every context closed after."""
    contexts = WarmContexts()
    monkeypatch.setattr(jobs, "CONTEXTS", contexts)
    engine_jobs.configure_secret(TEST_SECRET)
    CLOSED.clear()
    yield contexts
    for run_name in contexts.run_names():
        contexts.drop(run_name)


def test_a_fifth_run_evicts_and_closes_the_oldest_runs_context(connection, worker_cache):
    names = [f"ctx-{index}" for index in range(worker_cache.size + 1)]
    contexts = {}
    for name in names[:-1]:
        store_run(connection, name)
        contexts[name] = jobs.load_context(connection, name)
        contexts[name].group(0)  # builds the group's env, which eviction must close
    assert worker_cache.run_names() == names[:-1]
    assert jobs.load_context(connection, names[0]) is contexts[names[0]], "a known run's context is reused"
    assert CLOSED == []
    store_run(connection, names[-1])
    jobs.load_context(connection, names[-1])
    assert worker_cache.run_names() == names[1:]
    assert CLOSED == [names[0]], "only the oldest run's envs are closed"
    assert contexts[names[0]].groups == {}


def test_a_run_restarted_under_the_same_name_gets_a_fresh_context(connection, worker_cache):
    store_run(connection, "ctx-again")
    first = jobs.load_context(connection, "ctx-again")
    first.group(0)
    config = RunConfig.from_json(connection.get(RunKeys("ctx-again").config))
    connection.set(RunKeys("ctx-again").config, dataclasses.replace(config, run_id="another-id").to_json())
    second = jobs.load_context(connection, "ctx-again")
    assert second is not first and second.config.run_id == "another-id"
    assert CLOSED == ["ctx-again"]


def test_a_job_that_loses_its_lease_drops_its_cached_envs(connection, worker_cache, monkeypatch):
    config = store_run(connection, "ctx-lost", lease_seconds=0.4)  # the refresher checks every 0.1 s
    keys = RunKeys("ctx-lost")
    WeightStore(connection, keys, weights_key(TEST_SECRET, config.run_id)).publish(
        fixtures.mlp_policy(obs_size=1).state_dict())
    job_id = enqueue.enqueue_group(connection, config, 0, 0)
    job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    monkeypatch.setattr(group_job, "get_current_job", lambda: job)  # as if a worker ran it

    def steal() -> None:  # another job takes the group once this one has pushed a few rollouts
        wait_until(lambda: read_progress(connection, keys, 0) >= 3, interval=0.02, message="three rollouts pushed")
        # as RQ's clean-up files a job whose worker was cut off (no heartbeats) while the learner re-ran its group
        failed_registry(job.origin, connection).add(job, exc_string="Moved, due to AbandonedJobError")
        connection.set(keys.lease(0), "rqrl_ctx-lost_g0_r99", px=10_000)

    thief = threading.Thread(target=steal, daemon=True)
    thief.start()
    result = jobs.run_actor_group("ctx-lost", 0, 0)
    thief.join(10)
    assert result["lost"] is True and result["rollouts"] >= 3
    assert 0 not in worker_cache.peek("ctx-lost").groups, "the group's envs stay cached after the lease was lost"
    assert CLOSED == ["ctx-lost"]
    assert connection.get(keys.lease(0)) == b"rqrl_ctx-lost_g0_r99", "the loser released the new holder's lease"
    assert connection.lrange(keys.errors, 0, -1) == [], "a lost lease is no failure"
    assert job_id not in failed_registry(job.origin, connection).get_job_ids(), "a fenced job is filed as failed"
