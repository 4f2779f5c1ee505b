"""`rqrl worker` and `rq worker` processes: joining mid-run, the documented rq command line.

The tests here run in-process; those that start processes are in tests/processes/test_worker.py.
"""

from __future__ import annotations

import pytest

from tests.conftest import TEST_SECRET
from tests.factories import redis_actors

pytestmark = pytest.mark.timeout(120)


def test_an_external_redis_without_a_secret_is_refused(redis_url, monkeypatch):
    from rqrl import ConfigError

    monkeypatch.delenv("RQRL_SECRET")
    with pytest.raises(ConfigError, match="RQRL_SECRET"):
        redis_actors(redis_url, "no-secret", n_actors=4, secret=None)


def test_the_learner_never_reads_the_secret_from_the_environment(redis_url):
    from rqrl import ConfigError

    assert TEST_SECRET  # set in this process's environment by conftest: only the command line may read it
    with pytest.raises(ConfigError, match=r"pass secret=\.\.\. \(e\.g\. secret=os\.environ\[\"RQRL_SECRET\"\]\)"):
        redis_actors(redis_url, "no-secret", n_actors=4, secret=None)


def test_an_idle_worker_beats_once_per_heartbeat_of_its_timings(connection, redis_url):
    from rqrl.timings import protocol_timings
    from rqrl.worker import RolloutWorker

    worker = RolloutWorker(["rqrl"], connection=connection)
    assert worker.dequeue_timeout == protocol_timings().heartbeat == 0.5  # RQ alone would wait whole seconds
    assert worker.worker_ttl >= 15
