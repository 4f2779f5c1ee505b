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
    monkeypatch.delenv("RQRL_SECRET")
    with pytest.raises(ConfigError, match="secret"):
        RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2)
    actors = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, secret="s")
    assert not actors.embedded and actors.redis_url == "redis://127.0.0.1:1/0" and actors.secret == "s"
    monkeypatch.setenv("RQRL_SECRET", "from-the-environment")  # with Redis from REDIS_URL, RQRL_SECRET will do
    taken = RedisDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2)
    assert taken.secret == "from-the-environment"


@pytest.mark.parametrize("method", ["threads", "", "FORK"])
def test_an_unknown_start_method_is_refused_naming_the_platforms_methods(method: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown start_method {method!r}; choose one of "
                                          rf"multiprocessing.get_all_start_methods\(\) = \["):
        SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, 2.0, method, [0, 1], [10, 11])


def test_fork_is_refused_with_a_policy_off_the_cpu_as_in_maze() -> None:
    """A tensor on the meta device stands for one on a GPU: both are off the CPU, which a forked child cannot use."""
    policy = fixtures.mlp_policy().to("meta")
    with pytest.raises(ConfigError, match=r"start_method 'fork' needs a policy on the CPU, and this one has "
                                          r"tensors on \['meta'\]; use start_method 'forkserver' or 'spawn'"):
        SubprocDistributedActors(fixtures.make_cartpole, policy, 8, 2, 2, 2.0, "fork", [0, 1], [10, 11])
    SubprocDistributedActors(fixtures.make_cartpole, policy, 8, 2, 2, 2.0, "spawn", [0, 1], [10, 11])  # no error
    SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 2, 2, 2.0, "fork", [0, 1], [10, 11])


def test_a_factor_below_one_gives_maze_max_queue_size_smaller_than_a_batch() -> None:
    actors = SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 4, 8, 0.25, "spawn",
                                      [0, 1, 2, 3], [10, 11, 12, 13])
    assert actors.max_queue_size == 2 and actors.config.queue_bound == 2
    with pytest.raises(ConfigError, match="gives a queue of 0 rollouts"):
        SubprocDistributedActors(fixtures.make_cartpole, fixtures.mlp_policy(), 8, 4, 8, 0.1, "spawn",
                                 [0, 1, 2, 3], [10, 11, 12, 13])
