"""Redis SIGKILLed and restarted without persistence, again and again, under real workers: every rollout
the restart lost is re-run or counted, never silently skipped, and no episode is stitched across a loss."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pytest
import redis

from rqrl import RolloutEvents
from tests.children import WorkerProcesses
from tests.factories import redis_actors
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(240)

RESTARTS = 12
PAUSES = (0.0, 0.3, 1.0)  # how long Redis stays away: a quick restart lets running jobs push into the new one


@dataclass(frozen=True)
class Delivered:
    """One rollout as the learner got it."""

    rollout_id: int
    continues_previous: bool
    first_obs: np.ndarray
    next_obs: np.ndarray
    ended_episode: bool


@pytest.fixture
def restartable(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))  # a fixed unix socket: one URL across restarts
    yield server.start()
    server.stop()


def _collect(actors, stream: dict[int, list[Delivered]], batches: int) -> None:
    for _ in range(batches):
        record = actors.collect_outputs("cpu").record
        for column, actor in enumerate(record.actor_id.tolist()):
            stream.setdefault(actor, []).append(Delivered(
                rollout_id=int(record.rollout_id[column]),
                continues_previous=bool(record.continues_previous[column]),
                first_obs=record.obs[0, column].numpy().copy(),
                next_obs=record.next_obs[column].numpy().copy(),
                ended_episode=bool(record.terminated[-1, column] or record.truncated[-1, column]),
            ))


def check_stream(stream: dict[int, list[Delivered]], counted_lost: int) -> list[str]:
    """What is wrong with the delivered stream: duplicates, uncounted gaps, stitched or mislabelled rollouts."""
    problems, gaps = [], 0
    for actor, delivered in sorted(stream.items()):
        ids = [d.rollout_id for d in delivered]
        if len(ids) != len(set(ids)):
            problems.append(f"actor {actor}: a rollout was delivered twice ({ids})")
        for previous, current in zip(delivered, delivered[1:], strict=False):
            if current.rollout_id <= previous.rollout_id:
                problems.append(f"actor {actor}: rollout {current.rollout_id} after {previous.rollout_id}")
                continue
            follows_on = bool(np.array_equal(current.first_obs, previous.next_obs))
            if current.rollout_id != previous.rollout_id + 1:
                gaps += current.rollout_id - previous.rollout_id - 1
                if current.continues_previous:
                    problems.append(f"actor {actor}: rollout {current.rollout_id} follows lost rollout(s) after "
                                    f"{previous.rollout_id} but says continues_previous=True")
            if current.continues_previous != follows_on:
                problems.append(f"actor {actor}: rollout {current.rollout_id} says continues_previous="
                                f"{current.continues_previous}, but its first observation "
                                f"{'follows' if follows_on else 'does not follow'} rollout "
                                f"{previous.rollout_id}'s next_obs")
    if gaps > counted_lost:
        problems.append(f"{gaps} rollout id(s) skipped, only {counted_lost} counted as rollouts_lost")
    return problems


def _counted(actors, event) -> int:
    try:
        return int(actors.get_stats_value(event, name="sum"))
    except KeyError:
        return 0


def test_repeated_restarts_never_skip_or_stitch_a_rollout_silently(restartable, run_name):
    pool = WorkerProcesses(restartable.url)
    stream: dict[int, list[Delivered]] = {}
    try:
        for index in range(2):
            pool.start(f"w{index}")
        pool.wait_registered(redis.Redis.from_url(restartable.url), 2)
        with redis_actors(restartable.url, run_name, actors_per_job=1, redis_outage_seconds=30,
                          n_local_workers=0) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            _collect(actors, stream, 4)
            for restart in range(RESTARTS):
                time.sleep(0.05)  # let the workers fill the queue: those rollouts die with Redis
                restartable.kill()
                time.sleep(PAUSES[restart % len(PAUSES)])
                restartable.start()
                _collect(actors, stream, 12)
            restored = _counted(actors, RolloutEvents.runs_restored)
            lost = _counted(actors, RolloutEvents.rollouts_lost)
            rejected = actors.records_rejected
        assert all(process.poll() is None for process in pool.processes), "a worker died with a restart"
    finally:
        pool.stop_all()
    assert restored >= RESTARTS // 2, f"the learner stored the run again only {restored} times"
    assert set(stream) == {0, 1}
    problems = check_stream(stream, lost)
    if rejected:  # a rollout of the old job that the learner had to refuse: a race it should never meet
        problems.append(f"{rejected} record(s) rejected")
    assert not problems, "\n".join(problems[:20])
