"""Pops that drop an oversized list entry in Redis, unread (rqrl.engine.screen), on a real Redis."""

from __future__ import annotations

import pytest
import redis

from rqrl.engine.screen import screened_lpop

LIMIT = 10_000


@pytest.fixture
def keys(connection, run_name):
    names = (f"rqrl:{run_name}:list", f"rqrl:{run_name}:scratch")
    yield names
    connection.delete(*names)


def test_an_entry_over_the_limit_is_dropped_unread_and_the_others_come_in_order(connection, keys):
    listed, scratch = keys
    connection.rpush(listed, b"first", b"x" * (LIMIT * 3), b"second", b"third")
    entries, dropped = screened_lpop(connection, listed, scratch, 2, LIMIT)
    assert (entries, dropped) == ([b"first", b"second"], 1)
    assert connection.lrange(listed, 0, -1) == [b"third"] and not connection.exists(scratch)


def test_a_list_smaller_than_one_entry_may_be_is_popped_without_measuring(connection, keys):
    listed, scratch = keys
    connection.rpush(listed, b"a", b"b")
    assert screened_lpop(connection, listed, scratch, 10, LIMIT) == ([b"a", b"b"], 0)
    assert screened_lpop(connection, listed, scratch, 10, LIMIT) == ([], 0)


def test_a_key_that_is_no_list_is_redis_error_for_the_caller_to_repair(connection, keys):
    listed, scratch = keys
    connection.set(listed, b"y" * (LIMIT * 2))
    with pytest.raises(redis.ResponseError):
        screened_lpop(connection, listed, scratch, 1, LIMIT)


def test_a_user_that_may_not_run_scripts_pops_unscreened_and_says_so(connection, keys, redis_url):
    listed, scratch = keys
    connection.acl_setuser("rqrl-test-noeval", enabled=True, passwords=["+noeval-pw"], keys=["*"],
                           commands=["-@all", "+multi", "+exec", "+lpop"])
    try:
        user = redis.Redis.from_url(redis_url, username="rqrl-test-noeval", password="noeval-pw")
        connection.rpush(listed, b"a", b"b")
        assert screened_lpop(user, listed, scratch, 5, LIMIT) == ([b"a", b"b"], -1)
        user.close()
    finally:
        connection.acl_deluser("rqrl-test-noeval")
