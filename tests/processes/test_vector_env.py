"""SubprocVectorEnv with real env processes and real gymnasium envs (Maze's vector-env test intents, ported).

The tests here start processes; the in-process ones are in tests/integration/test_vector_env.py.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from rqrl.errors import ConfigError, EnvError
from rqrl.maze.stats import LogStatsLevel, RolloutEvents
from rqrl.maze.vector_env import EnvProcessDiedError, SubprocVectorEnv, VectorEnvError
from tests.children import REPO_ROOT, worker_env
from tests.integration.test_vector_env import CountdownEnv, explode_in_step, make_cartpole, our_children  # noqa: F401 - shared with the in-process tests

pytestmark = pytest.mark.timeout(60)


# ---- envs (module level: the env processes import them by name) ----------------------------------


class MazeLikeEnv(CountdownEnv):
    """A CountdownEnv that reports rewards per actor, as Maze's structured envs do."""

    def get_actor_rewards(self) -> np.ndarray:
        return np.array([self.t, -self.t], dtype=np.float64)


class SeedEchoEnv(CountdownEnv):
    """A CountdownEnv whose observation is the seed of its last reset (-1 for none), and a Dict observation of
    nothing else when ``dict_obs``: each auto-reset shows which seed of the list it took."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_used = -1.0 if seed is None else float(seed)
        return np.array([self.seed_used], np.float32), {"seed": seed}

    def step(self, action):
        _, reward, terminated, truncated, info = super().step(action)
        return np.array([self.seed_used], np.float32), reward, terminated, truncated, info


class DictEnv(gymnasium.Env):
    """Nested Dict observations and Dict actions; the next observation echoes the action, the image holds
    the env's ``ident`` so each env's rows can be told apart."""

    observation_space = spaces.Dict({
        "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "state": spaces.Dict({"goal": spaces.Discrete(5), "image": spaces.Box(0, 255, (3, 3), np.uint8)}),
    })
    action_space = spaces.Dict({"move": spaces.Discrete(3), "force": spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def __init__(self, ident: int = 0):
        self.ident = ident
        self.t = 0

    def _obs(self, pos, goal):
        return {"pos": np.asarray(pos, np.float32),
                "state": {"goal": np.int64(goal), "image": np.full((3, 3), self.ident, np.uint8)}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs([0.0, 0.0], 0), {}

    def step(self, action):
        self.t += 1
        return self._obs(action["force"], action["move"]), 0.5, self.t >= 4, False, {}


class TupleActionEnv(gymnasium.Env):
    """Text observations and Tuple actions: spaces without a fixed shape travel through the pipes."""

    observation_space = spaces.Text(8)
    action_space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3)))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return f"a{action[0]}b{action[1]}", 0.0, False, False, {}


def broken_factory() -> gymnasium.Env:
    raise OSError("no such simulator")


# ---- helpers --------------------------------------------------------------------------------------


@pytest.fixture
def vector_envs():
    """Builds SubprocVectorEnvs and closes every one after the test, whatever happened."""
    made: list[SubprocVectorEnv] = []

    def make(factories, **options) -> SubprocVectorEnv:
        envs = SubprocVectorEnv(factories, **options)
        made.append(envs)
        return envs

    yield make
    for envs in made:
        envs.close()


def pid_exists(pid: int) -> bool:
    """True while ``pid`` exists, zombies included (stricter than tests.children.alive: close() must reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def countdowns(*lengths: int, **options) -> list:
    return [functools.partial(CountdownEnv, length=length, **options) for length in lengths]


# ---- reset / step ---------------------------------------------------------------------------------


def rollout(envs: SubprocVectorEnv, seeds: list[int], steps: int = 40) -> np.ndarray:
    envs.seed(seeds)
    observations = [envs.reset()]
    actions = np.random.default_rng(0).integers(0, 2, (steps, envs.n_envs))
    for action in actions:  # long enough for auto-resets, which must be reproducible too
        observations.append(envs.step(action)[0])
    return np.stack(observations)


def test_reset_and_step_return_env_aggregated_arrays(vector_envs):
    envs = vector_envs([make_cartpole] * 3)
    single = make_cartpole()
    assert envs.n_envs == 3
    assert envs.observation_space == single.observation_space and envs.action_space == single.action_space
    assert envs.observation_spaces_dict == {0: single.observation_space}
    obs = envs.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    assert len(envs.reset_infos) == 3
    for _ in range(5):
        obs, rewards, dones, infos = envs.step(np.array([0, 1, 0]))
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    assert rewards.shape == (3,) and rewards.dtype == np.float64 and rewards.tolist() == [1.0, 1.0, 1.0]
    assert dones.shape == (3,) and dones.dtype == bool
    assert len(infos) == 3 and all(info["terminated"] is False and info["truncated"] is False for info in infos)
    # a list of per-env actions works too, and the returned arrays are copies, not views of shared memory
    obs_before = obs.copy()
    envs.step([1, 1, 1])
    np.testing.assert_array_equal(obs, obs_before)


def test_actions_reach_their_own_env(vector_envs):
    envs = vector_envs(countdowns(10, 10))
    envs.reset()
    _, _, _, infos = envs.step(np.array([1, 0]))
    assert [info["action"] for info in infos] == [1, 0]
    _, _, _, infos = envs.step([0, 1])
    assert [info["action"] for info in infos] == [0, 1]
    _, _, _, infos = envs.step({"action": np.array([1, 1])})  # Maze's call form: its gym wrapper's one key
    assert [info["action"] for info in infos] == [1, 1]
    with pytest.raises(ConfigError, match=r"Maze's dict of one key .* got a dict of keys \['a', 'b'\]"):
        envs.step({"a": np.array([0, 0]), "b": np.array([0, 0])})


def test_nested_dict_observations_and_dict_actions(vector_envs):
    envs = vector_envs([functools.partial(DictEnv, ident) for ident in (7, 8, 9)])
    assert envs.observation_space == DictEnv.observation_space and envs.action_space == DictEnv.action_space
    obs = envs.reset()
    assert obs["pos"].shape == (3, 2) and obs["state"]["goal"].shape == (3,)
    assert obs["state"]["image"].shape == (3, 3, 3) and obs["state"]["image"].dtype == np.uint8
    force = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], np.float32)
    obs, rewards, dones, _ = envs.step({"move": np.array([2, 0, 1]), "force": force})
    np.testing.assert_allclose(obs["pos"], force)
    assert obs["state"]["goal"].tolist() == [2, 0, 1]
    assert obs["state"]["image"][:, 0, 0].tolist() == [7, 8, 9]
    assert rewards.tolist() == [0.5, 0.5, 0.5]
    # Maze's form: a list of one action dict per env
    obs, _, _, _ = envs.step([{"move": 1, "force": force[0]}] * 3)
    assert obs["state"]["goal"].tolist() == [1, 1, 1]
    # episode ends after 4 steps: the terminal observation is a dict too
    envs.step({"move": np.array([1, 1, 1]), "force": force})
    obs, _, dones, infos = envs.step({"move": np.array([1, 2, 1]), "force": force})
    assert dones.tolist() == [True, True, True]
    assert infos[1]["terminal_observation"]["state"]["goal"] == 2
    assert obs["state"]["goal"].tolist() == [0, 0, 0]  # already reset


def test_spaces_without_a_fixed_shape_travel_through_the_pipes(vector_envs):
    envs = vector_envs([TupleActionEnv] * 2)
    assert envs.reset().tolist() == ["start", "start"]
    obs, _, _, _ = envs.step([(0, 2), (1, 1)])
    assert obs.tolist() == ["a0b2", "a1b1"]
    with pytest.raises(ConfigError, match="expected actions for 2 envs"):
        envs.step([(0, 2)])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", multiprocessing.get_all_start_methods())
def test_every_start_method_steps_envs(vector_envs, start_method):
    envs = vector_envs([make_cartpole] * 2, start_method=start_method)
    assert envs.start_method == start_method
    envs.reset()
    obs, _, _, _ = envs.step(np.array([0, 1]))
    assert obs.shape == (2, 4)


def test_default_start_method_is_forkserver_where_available(vector_envs):
    envs = vector_envs([make_cartpole])
    expected = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    assert envs.start_method == expected


def test_seeds_make_rollouts_reproducible(vector_envs):
    first = vector_envs([make_cartpole] * 2)
    second = vector_envs([make_cartpole] * 2)
    seeded = rollout(first, [1, 2])
    np.testing.assert_array_equal(seeded, rollout(second, [1, 2]))
    np.testing.assert_array_equal(seeded, rollout(first, [1, 2]))  # seeds apply at the next reset, again
    # each env is reset with its own seed, exactly as gymnasium's reset(seed=...)
    np.testing.assert_array_equal(seeded[0], [make_cartpole().reset(seed=seed)[0] for seed in (1, 2)])
    other = rollout(second, [3, 4])
    assert not np.array_equal(seeded[0], other[0])
    assert not np.array_equal(seeded[0, 0], seeded[0, 1])  # different seeds per env differ too


def test_a_seed_list_seeds_every_episode_in_turn_and_reset_starts_it_over(vector_envs):
    envs = vector_envs([functools.partial(SeedEchoEnv, length=2), functools.partial(SeedEchoEnv, length=3)])
    envs.seed([10, 11, 12])  # longer than n_envs: Maze keeps the whole list
    assert envs.reset()[:, 0].tolist() == [10, 11]
    seen, reset_seeds = [], []
    for _ in range(6):
        obs, _, dones, infos = envs.step(np.array([0, 0]))
        seen.append(obs[:, 0].tolist())
        reset_seeds.extend(infos[index]["reset_info"]["seed"] for index in np.flatnonzero(dones))
    # env 0 ends episodes at steps 2, 4, 6 and env 1 at 3, 6; each reset takes the next seed, in env order
    assert seen == [[10, 11], [12, 11], [12, 10], [11, 10], [11, 10], [12, 10]]
    assert reset_seeds == [12, 10, 11, 12, 10]
    assert infos[0]["terminal_observation"].tolist() == [11.0]  # the episode it ended, not the new one
    assert envs.reset()[:, 0].tolist() == [10, 11]  # the list starts over
    assert envs.step(np.array([0, 0]))[0][:, 0].tolist() == [10, 11]
    assert envs.step(np.array([0, 0]))[0][:, 0].tolist() == [12, 11]


def test_seed_needs_one_seed_per_env(vector_envs):
    envs = vector_envs([make_cartpole] * 3)
    with pytest.raises(ConfigError, match=r"3 seeds for n_envs=3, got 2"):
        envs.seed([1, 2])
    with pytest.raises(ConfigError, match=r"seeds\[1\] must be a non-negative int"):
        envs.seed([1, -2, 3])
    envs.seed([1, None, 3])  # None: the env picks its own
    assert envs.reset().shape == (3, 4)


def test_done_envs_reset_at_once_keeping_the_terminal_observation(vector_envs):
    envs = vector_envs(countdowns(2, 3) + countdowns(2, truncate=True))
    envs.reset()
    obs, _, dones, infos = envs.step(np.array([0, 0, 0]))
    assert dones.tolist() == [False, False, False] and "terminal_observation" not in infos[0]
    obs, _, dones, infos = envs.step(np.array([0, 0, 0]))
    assert dones.tolist() == [True, False, True]
    assert obs[:, 0].tolist() == [0.0, 2.0, 0.0]  # envs 0 and 2 were reset, env 1 was not
    for index in (0, 2):
        assert infos[index]["terminal_observation"].tolist() == [2.0]
        np.testing.assert_array_equal(infos[index]["final_observation"], infos[index]["terminal_observation"])
        assert infos[index]["final_info"] == {"action": 0}
        assert infos[index]["reset_info"] == {"reset_by": "CountdownEnv"}
    assert (infos[0]["terminated"], infos[0]["truncated"]) == (True, False)
    assert (infos[2]["terminated"], infos[2]["truncated"]) == (False, True)
    obs, _, dones, _ = envs.step(np.array([0, 0, 0]))
    assert dones.tolist() == [False, True, False] and obs[:, 0].tolist() == [1.0, 0.0, 1.0]


def test_episode_statistics_match_the_episodes_run(vector_envs):
    envs = vector_envs(countdowns(2, 3), logging_prefix="train")
    envs.reset()
    for _ in range(7):  # env 0 ends episodes at steps 2, 4, 6; env 1 at steps 3, 6
        envs.step(np.array([0, 0]))
    returns = envs.get_stats_value(RolloutEvents.episode_return, LogStatsLevel.EPOCH)
    assert returns["count"] == 5 and returns["sum"] == 2 * 3 + 3 * 2
    lengths = envs.get_stats_value("episode_length")
    assert (lengths["min"], lengths["max"], lengths["sum"]) == (2, 3, 12)
    assert envs.get_stats_value(RolloutEvents.env_steps, name="sum") == 14
    assert envs.get_stats_value(RolloutEvents.env_steps_per_second, name="mean") > 0
    envs.step(np.array([0, 0]))  # steps taken after a read are counted too (env 0 ends its 4th episode)
    epoch = envs.get_epoch_stats_aggregator().reduce()
    assert epoch["env_steps"]["sum"] == 16 and epoch["episode_return"]["count"] == 6
    # an explicit reset drops running episodes: env 1 (2 steps into an episode) starts over
    envs.reset()
    envs.step(np.array([0, 0]))
    envs.step(np.array([0, 0]))
    envs.step(np.array([0, 0]))
    current = envs.get_epoch_stats_aggregator().current()
    assert current["episode_length"]["count"] == 2 and current["episode_length"]["max"] == 3  # not 2 + 3
    assert current["env_steps"]["sum"] == 6


def test_actor_rewards_are_stacked_for_maze_envs_and_none_for_gymnasium_envs(vector_envs):
    plain = vector_envs([make_cartpole] * 2)
    plain.reset()
    plain.step(np.array([0, 1]))
    assert plain.get_actor_rewards() is None
    maze_like = vector_envs([lambda: gymnasium.wrappers.TimeLimit(MazeLikeEnv(length=5), 100)] * 2)
    maze_like.reset()
    assert maze_like.get_actor_rewards() is None  # no step yet
    maze_like.step(np.array([0, 1]))
    maze_like.step(np.array([0, 1]))
    rewards = maze_like.get_actor_rewards()
    assert rewards.dtype == np.float32 and rewards.shape == (2, 2)  # Maze's [n_actors, n_envs]
    np.testing.assert_array_equal(rewards, [[2, 2], [-2, -2]])
    three = vector_envs([lambda: gymnasium.wrappers.TimeLimit(MazeLikeEnv(length=5), 100)] * 3)
    three.reset()
    three.step(np.array([0, 1, 0]))
    assert three.get_actor_rewards().shape == (2, 3)


def test_bad_actions_name_the_expected_count_and_shape(vector_envs):
    envs = vector_envs([make_cartpole] * 3)
    envs.reset()
    with pytest.raises(ConfigError, match=r"expected actions for 3 envs \(a leading dimension of 3\), got 2"):
        envs.step(np.array([0, 1]))
    with pytest.raises(ConfigError, match="got 4"):
        envs.step([0, 1, 0, 1])
    with pytest.raises(ConfigError, match="dtype int64"):
        envs.step(np.array([0.5, 1.0, 0.0]))
    dict_envs = vector_envs([DictEnv] * 2)
    dict_envs.reset()
    with pytest.raises(ConfigError, match="lack key"):
        dict_envs.step({"move": np.array([0, 1])})
    envs.step(np.array([0, 1, 0]))  # nothing was sent: the envs are still in step


def test_an_env_exception_is_raised_in_the_caller_with_its_traceback(vector_envs):
    envs = vector_envs(countdowns(10) + countdowns(10, explode_at=2))
    envs.reset()
    envs.step(np.array([0, 0]))
    with pytest.raises(VectorEnvError, match="env 1 raised RuntimeError: the env exploded at step 2") as error:
        envs.step(np.array([0, 0]))
    assert isinstance(error.value, EnvError)
    assert error.value.env_index == 1
    assert "explode_in_step" in error.value.remote_traceback and "explode_in_step" in str(error.value)
    # every env answered, so the pipes are still in step: the envs go on after a reset
    envs.reset()
    obs, _, _, _ = envs.step(np.array([0, 0]))
    assert obs[:, 0].tolist() == [1.0, 1.0]


def test_a_failing_env_factory_is_raised_and_leaves_no_process(vector_envs):
    with pytest.raises(VectorEnvError, match=r"env 1 raised OSError: no such simulator in env_factories\[1\]\(\)"):
        vector_envs([make_cartpole, broken_factory])
    assert our_children() == []


def test_envs_with_different_spaces_are_refused():
    with pytest.raises(ConfigError, match="env 1 has spaces"):
        SubprocVectorEnv([make_cartpole, DictEnv])
    assert our_children() == []


def test_an_env_process_killed_between_steps_is_raised_not_waited_for(vector_envs):
    envs = vector_envs([make_cartpole] * 2)
    envs.reset()
    os.kill(envs.processes[1].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(EnvProcessDiedError) as error:
        for _ in range(100):  # the kill lands asynchronously
            envs.step(np.array([0, 1]))
    assert time.monotonic() - started < 10
    assert error.value.env_index == 1 and error.value.exitcode == -signal.SIGKILL
    with pytest.raises(EnvProcessDiedError, match="env 1 died"):  # and stays raised
        envs.reset()


def test_an_env_process_killed_inside_step_is_raised_within_seconds(vector_envs):
    envs = vector_envs(countdowns(100, 100) + countdowns(100, delay=30.0))
    envs.reset()
    pid = envs.processes[2].pid
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(EnvProcessDiedError, match="the process of env 2 died"):
            envs.step(np.array([0, 0, 0]))
    finally:
        killer.cancel()
    assert time.monotonic() - started < 10  # the env would have slept 30 s
    envs.close()
    assert not pid_exists(pid)


def test_close_is_idempotent_and_leaves_no_process_or_shared_memory():
    envs = SubprocVectorEnv([make_cartpole] * 2)
    pids = [process.pid for process in envs.processes]
    block = envs._shared[0].memory.name
    try:
        envs.reset()
        envs.step(np.array([0, 1]))
        assert all(pid_exists(pid) for pid in pids)
    finally:
        envs.close()
    envs.close()
    assert our_children() == []
    assert not any(pid_exists(pid) for pid in pids)
    if sys.platform.startswith("linux"):
        assert not os.path.exists(f"/dev/shm/{block.lstrip('/')}")
    with pytest.raises(VectorEnvError, match="closed"):
        envs.step(np.array([0, 1]))


def test_close_ends_an_env_stuck_in_step():
    envs = SubprocVectorEnv(countdowns(100, delay=60.0))
    pids = [process.pid for process in envs.processes]
    try:
        envs.reset()
        envs._send_bytes(0, pickle.dumps(("step", None)))  # a step the env will not finish for 60 s
    finally:
        started = time.monotonic()
        envs.close()
    assert time.monotonic() - started < 20  # close waits CLOSE_TIMEOUT_SECONDS, then terminates
    assert not any(pid_exists(pid) for pid in pids)
    assert our_children() == []


def test_context_manager_closes(vector_envs):
    with SubprocVectorEnv([make_cartpole]) as envs:
        pids = [process.pid for process in envs.processes]
        envs.reset()
    assert not any(pid_exists(pid) for pid in pids)


@pytest.mark.timeout(180)
def test_benchmark_script_prints_a_table():
    result = subprocess.run(
        [sys.executable, "benchmarks/vector_env_throughput.py", "--seconds", "0.3", "--rounds", "1", "--n-envs", "2"],
        cwd=REPO_ROOT, env=worker_env(), capture_output=True, text=True, timeout=170,
    )
    assert result.returncode == 0, result.stderr
    assert "| CartPole-v1 | 2 |" in result.stdout and "| image 84x84x4 uint8 | 2 |" in result.stdout


def test_the_methods_a_maze_learner_calls_through_its_base_classes(vector_envs):
    envs = vector_envs(countdowns(2, 3))
    assert envs.agent_counts_dict == {0: 1} and envs.actor_id() == (0, 0) and envs.actor_id().step_key == 0
    assert envs.observation_spaces_dict[envs.actor_id().step_key] == envs.observation_space
    envs.reset()
    assert envs.is_actor_done().tolist() == [False, False] and envs.get_env_time().tolist() == [0, 0]
    envs.step(np.array([0, 0]))
    assert envs.get_env_time().tolist() == [1, 1]
    envs.step(np.array([0, 0]))  # env 0 ends its episode and starts the next
    assert envs.is_actor_done().tolist() == [True, False] and envs.get_env_time().tolist() == [0, 2]
    assert envs.get_stats(LogStatsLevel.EPOCH) is envs.get_epoch_stats_aggregator()
    with pytest.raises(ConfigError, match="LogStatsLevel.EPOCH"):
        envs.get_stats(LogStatsLevel.STEP)
    envs.write_epoch_stats()  # ends the epoch: its statistics become the last ones
    assert envs.get_stats(LogStatsLevel.EPOCH).last_stats["episode_return"]["count"] == 1
    envs.step(np.array([0, 0]))  # env 1 ends an episode in the new epoch
    envs.clear_epoch_stats()  # ... which is dropped unreduced
    assert envs.get_epoch_stats_aggregator().current() == {}
    assert envs.get_stats(LogStatsLevel.EPOCH).last_stats["episode_return"]["count"] == 1
