"""Redis restarted mid-run: learner and workers ride it out; a Redis that stays away is a clear error."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis

from rqrl import RedisDistributedActors, RedisUnavailableError, RolloutEvents
from rqrl.server import find_redis_server
from tests import fixtures
from tests.conftest import TEST_SECRET

pytestmark = pytest.mark.timeout(180)


class RestartableRedis:
    """A private redis-server without persistence on a fixed unix socket, which tests stop and start."""

    def __init__(self, directory: Path):
        self.socket = str(directory / "redis.sock")
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def start(self) -> None:
        self.process = subprocess.Popen([find_redis_server(), "--port", "0", "--unixsocket", self.socket, "--save", "",
                                         "--appendonly", "no", "--dir", str(self.directory)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(unix_socket_path=self.socket).ping()
                return
            except (redis.ConnectionError, FileNotFoundError):
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def restartable(tmp_path_factory):
    server = RestartableRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


def test_a_redis_restart_without_persistence_is_ridden_out(restartable, run_name):
    from tests.conftest import WorkerProcesses

    pool = WorkerProcesses(restartable.url)
    try:
        for index in range(2):
            pool.start(f"w{index}")
        pool.wait_registered(redis.Redis.from_url(restartable.url), 2)
        with RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0,
                                    redis_url=restartable.url, run_name=run_name, actors_per_job=1,
                                    redis_outage_seconds=30, secret=TEST_SECRET) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            before = [actors.collect_outputs("cpu").record for _ in range(5)]
            restartable.stop()
            time.sleep(2.0)
            restartable.start()  # empty: the run's keys, queue and RQ jobs are gone
            restarted = time.monotonic()
            after = [actors.collect_outputs("cpu").record for _ in range(5)]
            assert time.monotonic() - restarted < 30
            assert actors.get_stats_value(RolloutEvents.runs_restored, name="sum") >= 1
            deadline = time.monotonic() + 30  # workers register again with their next heartbeat
            while actors.workers_alive(cached=False) < 2 and time.monotonic() < deadline:
                actors.collect_outputs("cpu")
            assert actors.workers_alive(cached=False) == 2
            assert actors.records_rejected == 0
        assert all(process.poll() is None for process in pool.processes), "a worker died with the restart"
    finally:
        pool.stop_all()
    pairs = [(a, r) for record in before + after
             for a, r in zip(record.actor_id.tolist(), record.rollout_id.tolist(), strict=True)]
    assert len(pairs) == len(set(pairs)), "a rollout was delivered twice"
    for actor in (0, 1):  # rollout ids carry on where the learner left off (queued rollouts were lost)
        mine = [r for a, r in pairs if a == actor]
        assert mine == sorted(mine)


def test_a_redis_that_stays_away_ends_the_run_with_a_clear_error(restartable, run_name):
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0,
                                    redis_url=restartable.url, run_name=run_name, n_local_workers=0,
                                    redis_outage_seconds=3, secret=TEST_SECRET)
    actors.start()
    actors.broadcast_updated_policy(actors.policy.state_dict())
    restartable.stop()
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match="stayed unreachable for about 3 s"):
        actors.collect_outputs("cpu")
    assert time.monotonic() - started < 20
    with pytest.raises(RedisUnavailableError):
        actors.broadcast_updated_policy(actors.policy.state_dict())
    with pytest.raises(RedisUnavailableError) as raised:  # stop() too: no raw redis error
        actors.stop(timeout=1)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    with pytest.raises(RedisUnavailableError):
        actors.queue_size()
