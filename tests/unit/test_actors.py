"""Construction rules of the actors classes that need no Redis (nothing is started here)."""

from __future__ import annotations

import pytest

from rqrl import ConfigError, RedisDistributedActors, SubprocDistributedActors
from tests import fixtures


def test_subproc_actors_ignore_redis_url_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    actors = SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, 2.0, "spawn",
                                      [0, 1], [10, 11])
    assert actors.embedded and actors.redis_url is None


def test_redis_actors_take_redis_url_from_the_environment_and_then_need_a_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="secret"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2)
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, secret="s")
    assert not actors.embedded and actors.redis_url == "redis://127.0.0.1:1/0"
