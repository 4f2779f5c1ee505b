"""Every public method of the Redis actors raises only RqrlErrors: Redis outages and refusals, bad
state dicts and a bad embedded-Redis binary included, each with its cause kept."""

from __future__ import annotations

import socket
import time

import pytest
import redis
import torch

from rqrl import ConfigError, RedisDistributedActors, RedisUnavailableError, RqrlError, ServerError
from tests import fixtures
from tests.conftest import TEST_SECRET

pytestmark = pytest.mark.timeout(60)


def closed_port() -> int:
    """A local TCP port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_start_against_a_closed_port_raises_redis_unavailable(run_name):
    url = f"redis://127.0.0.1:{closed_port()}/0"
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, redis_url=url,
                                    run_name=run_name, secret=TEST_SECRET, redis_outage_seconds=0.2)
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match=f"Redis at {url} stayed unreachable") as raised:
        actors.start()
    assert time.monotonic() - started < 30
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    actors.stop()  # nothing was started: nothing to fail on


@pytest.mark.parametrize("state_dict, message", [
    (42, "expected a state dict .* got int 42"),
    ([torch.zeros(2)], "expected a state dict .* got list"),
    ({"0.weight": 1.0}, r"non-tensor values \[\"'0.weight': float\"\]"),
])
def test_broadcasting_what_is_not_a_state_dict_raises_config_error(redis_url, connection, run_name, state_dict,
                                                                  message):
    with RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0, redis_url=redis_url,
                                run_name=run_name, secret=TEST_SECRET, n_local_workers=0) as actors:
        with pytest.raises(ConfigError, match=message):
            actors.broadcast_updated_policy(state_dict)
        assert connection.get(actors.keys.latest_version) is None


def test_an_embedded_redis_without_a_usable_binary_raises_a_server_error(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 16, 2, 2, 2.0,
                                    redis_server=str(tmp_path / "no-such-redis-server"))
    with pytest.raises(ServerError, match="is not an executable file") as raised:
        actors.start()
    assert isinstance(raised.value, RqrlError)
    actors.stop()
