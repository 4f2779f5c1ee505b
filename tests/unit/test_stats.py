"""EpochStatsAggregator: values per event, reduced per epoch, read the Maze way."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from rqrl.errors import ConfigError
from rqrl.maze.stats import EpochStatsAggregator, LogStatsLevel, RolloutEvents, event_name, record_batch


def test_add_and_current_reduce_each_event():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.episode_return, [1.0, 2.0, 6.0])
    stats.add(RolloutEvents.episode_return, 3.0)
    stats.add(RolloutEvents.queue_size, np.array([4, 8]))
    current = stats.current()
    assert set(current) == {"episode_return", "queue_size"}
    assert current["episode_return"] == {"mean": 3.0, "min": 1.0, "max": 6.0, "sum": 12.0, "count": 4.0, "last": 3.0}
    assert current["queue_size"]["mean"] == 6.0


def test_numpy_scalars_and_ints_are_values():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.env_steps, np.int64(16))
    stats.add(RolloutEvents.env_steps, np.float32(4.0))
    stats.add(RolloutEvents.env_steps, 5)
    assert stats.get_stats_value(RolloutEvents.env_steps, LogStatsLevel.EPOCH, "sum") == 25.0


def test_events_as_methods_and_strings_are_the_same_event():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.policy_lag, [0, 2])
    stats.add("policy_lag", [4])
    assert stats.get_stats_value(RolloutEvents.policy_lag, LogStatsLevel.EPOCH, "count") == 3.0
    assert stats.get_stats_value("policy_lag", LogStatsLevel.EPOCH, "max") == 4.0
    assert stats.get_stats_value("policy_lag", name="mean") == 2.0
    assert event_name(RolloutEvents.workers_alive) == "workers_alive"


def test_get_stats_value_without_name_returns_every_statistic():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.dequeue_time, [0.5, 1.5])
    assert stats.get_stats_value(RolloutEvents.dequeue_time) == {
        "mean": 1.0, "min": 0.5, "max": 1.5, "sum": 2.0, "count": 2.0, "last": 1.5,
    }


def test_empty_adds_leave_no_event():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.episode_length, [])
    assert stats.current() == {}
    with pytest.raises(KeyError, match="episode_length"):
        stats.get_stats_value(RolloutEvents.episode_length, LogStatsLevel.EPOCH, "mean")


def test_reduce_ends_the_epoch():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.episode_return, [10.0, 20.0])
    first = stats.reduce()
    assert first["episode_return"]["mean"] == 15.0
    assert stats.last_stats == first
    assert stats.current() == {}
    stats.add(RolloutEvents.episode_return, [1.0])
    assert stats.get_stats_value(RolloutEvents.episode_return, LogStatsLevel.EPOCH, "mean") == 1.0
    second = stats.reduce()
    assert second["episode_return"]["count"] == 1.0
    assert first["episode_return"]["count"] == 2.0  # earlier epochs are not rewritten
    assert stats.reduce() == {} and stats.last_stats == {}


@pytest.mark.parametrize("level", [LogStatsLevel.STEP, LogStatsLevel.EPISODE, "epoch"])
def test_non_epoch_levels_are_refused(level):
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.episode_return, [1.0])
    with pytest.raises(ConfigError, match="LogStatsLevel.EPOCH"):
        stats.get_stats_value(RolloutEvents.episode_return, level, "mean")


def test_unknown_statistic_is_refused_with_the_choices():
    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.episode_return, [1.0])
    choices = r"\['count', 'last', 'max', 'mean', 'min', 'sum'\]"
    with pytest.raises(ConfigError, match=rf"unknown statistic 'median'.*{choices}"):
        stats.get_stats_value(RolloutEvents.episode_return, LogStatsLevel.EPOCH, "median")


def test_every_rollout_event_is_documented():
    names = [name for name in vars(RolloutEvents) if not name.startswith("_")]
    assert {"episode_return", "episode_length", "policy_lag", "queue_size"} <= set(names)
    for name in names:
        assert getattr(RolloutEvents, name).__doc__, name


@dataclass(frozen=True)
class Delivered:
    """The parts of a rollout record that record_batch reads."""

    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    policy_version: int
    n_steps: int


def test_record_batch_adds_every_event_of_one_collect():
    stats = EpochStatsAggregator()
    records = [Delivered(np.array([3.0, 5.0]), np.array([3, 5]), 4, 10),
               Delivered(np.array([], np.float64), np.array([], np.int64), 6, 10)]
    record_batch(stats, records, policy_version=6, elapsed_seconds=0.5, queue_size=7, dequeue_time=0.25,
                 workers_alive=3)
    current = stats.current()
    assert current["episode_return"]["count"] == 2 and current["episode_return"]["sum"] == 8.0
    assert current["episode_length"]["max"] == 5
    assert (current["policy_lag"]["min"], current["policy_lag"]["max"], current["policy_lag"]["count"]) == (0, 2, 2)
    assert current["env_steps"]["sum"] == 20
    assert current["env_steps_per_second"]["last"] == 40.0
    assert current["queue_size"]["last"] == 7 and current["dequeue_time"]["last"] == 0.25
    assert current["workers_alive"]["last"] == 3


def test_record_batch_without_workers_alive_leaves_that_event_out():
    stats = EpochStatsAggregator()
    record_batch(stats, [Delivered(np.array([1.0]), np.array([1]), 1, 4)], policy_version=1, elapsed_seconds=0.0,
                 queue_size=0, dequeue_time=0.0)
    assert "workers_alive" not in stats.current()
    assert stats.get_stats_value(RolloutEvents.env_steps_per_second, name="last") == 4 / 1e-9  # no division by 0


class MazeImpalaEvents:
    """The shape of Maze's MultiStepIMPALAEvents: plain methods with self, Maze's argument names."""

    def policy_loss(self, step_key, value):
        """per sub-step"""

    def estimated_queue_sizes(self, before, after):
        """two values per call"""

    def time_backprob(self, time, percent):
        """two values per call"""


def test_an_event_topic_records_maze_learner_events_and_reads_them_the_maze_way():
    stats = EpochStatsAggregator()
    topic = stats.create_event_topic(MazeImpalaEvents)
    topic.estimated_queue_sizes(after=1, before=3)
    topic.estimated_queue_sizes(2, 5)  # positional, as the signature orders them
    topic.policy_loss(step_key=0, value=0.5)
    topic.policy_loss(step_key=0, value=1.5)
    topic.policy_loss(step_key=1, value=np.float32(2.0))
    assert stats.get_stats_value(MazeImpalaEvents.estimated_queue_sizes, LogStatsLevel.EPOCH, name="before") == 2.5
    assert stats.get_stats_value("estimated_queue_sizes.after", name="max") == 5.0
    assert stats.get_stats_value("policy_loss[step_key=0]", name="mean") == 1.0
    assert stats.get_stats_value("policy_loss[step_key=1]", name="count") == 1.0
    with pytest.raises(KeyError, match=r"recorded per group or argument: read one of \['policy_loss\[step_key=0\]'"):
        stats.get_stats_value(MazeImpalaEvents.policy_loss, name="mean")
    stats.reduce()  # the last epoch's values stay readable until the next one records
    assert stats.get_stats_value(MazeImpalaEvents.estimated_queue_sizes, name="before") == 2.5


def test_an_event_topic_fails_loudly_on_what_it_cannot_record():
    topic = EpochStatsAggregator().create_event_topic(MazeImpalaEvents)
    with pytest.raises(AttributeError, match=r"MazeImpalaEvents has no event 'policy_lose'; its events: \["):
        topic.policy_lose(step_key=0, value=1.0)
    with pytest.raises(ConfigError, match=r"MazeImpalaEvents.time_backprob\(time, percent\) does not take these"):
        topic.time_backprob(time=1.0)
    with pytest.raises(ConfigError, match=r"expected a number for 'value', got 'high'"):
        topic.policy_loss(step_key=0, value="high")
    with pytest.raises(ConfigError, match=r"expected a number for 'before', got True"):
        topic.estimated_queue_sizes(before=True, after=1)
    with pytest.raises(ConfigError, match="expects an event interface class"):
        EpochStatsAggregator().create_event_topic(MazeImpalaEvents())


def test_maze_base_env_events_reward_reads_the_episode_statistics_by_maze_names():
    from rqrl import BaseEnvEvents

    stats = EpochStatsAggregator()
    stats.add(RolloutEvents.episode_return, [10.0, 20.0, 60.0])
    stats.add(RolloutEvents.episode_length, [10, 20, 60])
    assert stats.get_stats_value(BaseEnvEvents.reward, LogStatsLevel.EPOCH, name="mean") == 30.0
    assert stats.get_stats_value(BaseEnvEvents.reward, LogStatsLevel.EPOCH, name="max") == 60.0
    assert stats.get_stats_value(BaseEnvEvents.reward, LogStatsLevel.EPOCH, name="episode_count") == 3.0
    assert stats.get_stats_value(BaseEnvEvents.reward, LogStatsLevel.EPOCH, name="mean_step_count") == 30.0
    with pytest.raises(ConfigError, match=r"Maze's reward statistic 'total_step_count' has no rqrl counterpart"):
        stats.get_stats_value(BaseEnvEvents.reward, LogStatsLevel.EPOCH, name="total_step_count")


def test_clear_drops_the_running_epoch_unreduced_and_keeps_the_last_one():
    stats = EpochStatsAggregator()
    stats.add("episode_return", [1.0, 3.0])
    assert stats.reduce()["episode_return"]["mean"] == 2.0
    stats.add("episode_return", 10.0)
    stats.clear()
    assert stats.current() == {} and stats.last_stats["episode_return"]["mean"] == 2.0


def test_a_missing_event_is_not_listed_among_the_events_with_values():
    from rqrl import MissingStatsError

    stats = EpochStatsAggregator()
    stats.add("episode_return", [])  # an empty add leaves its event without values
    stats.add("env_steps", 5)
    with pytest.raises(MissingStatsError) as raised:
        stats.get_stats_value("episode_return")
    assert str(raised.value).endswith("no values for 'episode_return' yet; events with values: ['env_steps']\"")
