"""The actor-group job's weights checks (rqrl.maze.jobs) against a real Redis: weights_refresh_seconds holds checks
off for its interval, counted from a check's answer, so a check sent and then dropped holds nothing off."""

from __future__ import annotations

import types

from rqrl.engine.codec import weights_key
from rqrl.engine.keys import RunKeys
from rqrl.engine.weights import WeightStore
from rqrl.maze.jobs import RunContext, _wait_for_weights
from tests import fixtures
from tests.conftest import TEST_SECRET


def weights_context(connection, run_name: str, refresh_seconds: float) -> tuple[RunContext, WeightStore]:
    """A worker's context of ``run_name`` (a weight-revealing policy) and the run's weights store."""
    keys, key = RunKeys(run_name), weights_key(TEST_SECRET, run_name)
    config = types.SimpleNamespace(weights_refresh_seconds=refresh_seconds)
    context = RunContext(config=config, env_factory=fixtures.make_cartpole, policy=fixtures.WeightRevealingPolicy(),
                         keys=keys, records_key=b"", weights_key=key)
    return context, WeightStore(connection, keys, key)


def wait(context: RunContext, store: WeightStore, sent=None) -> int | None:
    return _wait_for_weights(context, store, lambda: False, lambda: None, sent)


def test_within_the_interval_a_worker_keeps_its_weights_and_asks_nothing(connection, run_name):
    context, store = weights_context(connection, run_name, refresh_seconds=60.0)
    store.publish(fixtures.revealing_state(1))
    assert wait(context, store) == 1, "the first weights are always fetched"
    store.publish(fixtures.revealing_state(2))
    connection.config_resetstat()
    assert not context.weights_due()
    assert wait(context, store) == 1
    assert "cmdstat_get" not in connection.info("commandstats"), "a check was made within the interval"
    context.weights_checked_at -= 61.0  # the interval has passed
    assert wait(context, store) == 2 and context.policy.weight.item() == 2.0


def test_a_check_sent_and_dropped_unread_holds_off_no_check(connection, run_name):
    """A job sends the next rollout's check once a rollout is stepped, and drops it if its push then waits for room
    (the learner may publish meanwhile): that check must not count, or with the learner the bottleneck a worker
    could drop every check it sends and never load newer weights."""
    context, store = weights_context(connection, run_name, refresh_seconds=60.0)
    store.publish(fixtures.revealing_state(1))
    assert wait(context, store) == 1
    store.publish(fixtures.revealing_state(2))
    context.weights_checked_at -= 61.0  # the interval has passed by the end of the next rollout
    assert context.weights_due()
    store.send_fetch(context.weights_version).abandon()  # sent, then dropped as the push waited for room
    assert wait(context, store) == 2, "the dropped check held off the next one"
    assert context.policy.weight.item() == 2.0


def test_with_no_interval_every_rollout_checks(connection, run_name):
    context, store = weights_context(connection, run_name, refresh_seconds=0.0)
    for version in (1, 2, 3):
        store.publish(fixtures.revealing_state(version))
        assert context.weights_due()
        assert wait(context, store, store.send_fetch(context.weights_version)) == version
