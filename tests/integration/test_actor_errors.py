"""Every public method of the Redis actors raises only RqrlErrors: Redis outages and refusals, bad
state dicts and a bad embedded-Redis binary included, each with its cause kept."""

from __future__ import annotations

import time

import pytest
import redis
import torch

from rqrl import ConfigError, RedisUnavailableError, RqrlError, ServerError
from tests.children import free_port
from tests.factories import redis_actors

pytestmark = pytest.mark.timeout(60)


def test_start_against_a_closed_port_raises_redis_unavailable(run_name):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    actors = redis_actors(url, run_name, redis_outage_seconds=0.2)
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match=f"nothing answers at Redis {url} .*start redis-server there") \
            as raised:
        actors.start()
    assert time.monotonic() - started < 15, "a start against nothing waited for more than its first contact"
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    actors.stop()  # nothing was started: nothing to fail on


@pytest.mark.parametrize("state_dict, message", [
    (42, "expected a state dict .* got int 42"),
    ([torch.zeros(2)], "expected a state dict .* got list"),
    ({"0.weight": 1.0}, r"non-tensor values \[\"'0.weight': float\"\]"),
])
def test_broadcasting_what_is_not_a_state_dict_raises_config_error(redis_url, connection, run_name, state_dict,
                                                                  message):
    with redis_actors(redis_url, run_name, n_local_workers=0) as actors:
        with pytest.raises(ConfigError, match=message):
            actors.broadcast_updated_policy(state_dict)
        assert connection.get(actors.keys.latest_version) is None


def test_an_embedded_redis_without_a_usable_binary_raises_a_server_error(tmp_path):
    actors = redis_actors(None, redis_server=str(tmp_path / "no-such-redis-server"), secret=None)
    with pytest.raises(ServerError, match="is not an executable file") as raised:
        actors.start()
    assert isinstance(raised.value, RqrlError)
    actors.stop()
