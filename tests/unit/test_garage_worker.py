"""WorkerFactory, the EnvUpdate family and LogicalWorker (garage's DefaultWorker) on real gymnasium envs:
the intent of garage's tests/garage/sampler (worker factory, default worker, env updates), plus seeding."""

from __future__ import annotations

import os
import pickle
import random
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rqrl import (
    ConfigError,
    EnvError,
    EnvUpdate,
    EpisodeBatch,
    ExistingEnvUpdate,
    NewEnvUpdate,
    PolicyError,
    SetTaskUpdate,
    StepType,
    WorkerFactory,
)
from rqrl.engine.compression import COMPRESSED_MAGIC
from rqrl.garage.episodes import decode_episodes, encode_episodes
from rqrl.garage.worker import LogicalWorker, ModuleAgent, apply_env_update, check_env_update
from tests import fixtures

FIRST, MID, TERMINAL, TIMEOUT = StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT


class FixedLengthEnv(gymnasium.Env):
    """Observation = [step count, task]; terminates (or truncates) after ``length`` steps; info reports the action."""

    observation_space = spaces.Box(0, 1000, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 5, truncate: bool = False, task: int = 0):
        self.length, self.truncate, self.task = length, truncate, task
        self.count, self.closed = 0, False

    def set_task(self, task: int) -> None:
        self.task = task

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {"task": self.task}

    def _obs(self) -> np.ndarray:
        return np.array([self.count, self.task], np.float32)

    def step(self, action):
        self.count += 1
        ended = self.count >= self.length
        info = {"action_seen": int(action)}
        return self._obs(), float(self.count), ended and not self.truncate, ended and self.truncate, info

    def close(self) -> None:
        self.closed = True


class OtherTaskEnv(FixedLengthEnv):
    """A subtype: SetTaskUpdate(FixedLengthEnv, ...) must rebuild it, not reuse it."""


class ScriptedPolicy:
    """garage protocol; always ``action`` (an int, or a float vector for Box), its own counter in agent_info."""

    def __init__(self, action: Any = 1):
        self.action = action
        self.resets = 0

    def reset(self, do_resets=None) -> None:
        self.resets += 1

    def get_action(self, observation):
        return self.action, {"resets": self.resets}

    def get_actions(self, observations):
        return [self.action] * len(observations), {"resets": np.full(len(observations), self.resets)}

    def get_param_values(self):
        return np.array([self.action])

    def set_param_values(self, params) -> None:
        self.action = int(np.asarray(params).reshape(-1)[0])


class GaussianPendulumPolicy:
    """garage protocol for Box actions: mean = theta @ obs, noise from the global np.random (as garage policies)."""

    def __init__(self, theta: np.ndarray | None = None):
        self.theta = np.zeros(3) if theta is None else np.asarray(theta, np.float64)

    def reset(self, do_resets=None) -> None:
        pass

    def get_action(self, observation):
        mean = float(self.theta @ observation)
        action = np.clip(mean + 0.5 * np.random.standard_normal(), -2.0, 2.0)
        return np.array([action], np.float32), {"mean": np.array([mean], np.float32)}

    def get_actions(self, observations):
        actions, infos = zip(*(self.get_action(obs) for obs in observations), strict=True)
        return np.stack(actions), {"mean": np.stack([info["mean"] for info in infos])}

    def get_param_values(self):
        return self.theta.copy()

    def set_param_values(self, params) -> None:
        self.theta = np.asarray(params, np.float64).reshape(3)


def worker(env=None, agent=None, *, seed: int | None = 0, number: int = 0, max_length: int = 10,
           n_workers: int = 4) -> LogicalWorker:
    built = WorkerFactory(seed=seed, max_episode_length=max_length, n_workers=n_workers)(number)
    built.update_agent(agent if agent is not None else ScriptedPolicy())
    built.update_env(env if env is not None else FixedLengthEnv())
    return built


def cartpole_episodes(seed: int | None, number: int, n: int = 2) -> list[EpisodeBatch]:
    built = worker(gymnasium.make("CartPole-v1"), fixtures.mlp_policy(seed=3), seed=seed, number=number,
                   max_length=500)
    return [built.rollout() for _ in range(n)]


def same_episodes(left: EpisodeBatch, right: EpisodeBatch) -> bool:
    return (left.lengths.tolist() == right.lengths.tolist() and np.array_equal(left.observations, right.observations)
            and np.array_equal(left.actions, right.actions) and np.array_equal(left.step_types, right.step_types))


# --- WorkerFactory ----------------------------------------------------------------------------------------------

def test_worker_factory_is_keyword_only_with_garage_defaults():
    with pytest.raises(TypeError):
        WorkerFactory(10)  # type: ignore[misc]
    factory = WorkerFactory(max_episode_length=10)
    assert factory.n_workers == (os.cpu_count() or 1)
    assert factory._seed is None and factory._max_episode_length == 10
    assert WorkerFactory(max_episode_length=3, seed=7, n_workers=2)._seed == 7


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_episode_length": 0}, "max_episode_length >= 1"),
    ({"max_episode_length": None}, "max_episode_length >= 1"),
    ({"max_episode_length": 5, "n_workers": 0}, "n_workers >= 1"),
    ({"max_episode_length": 5, "seed": 1.5}, "seed to be an int"),
    ({"max_episode_length": 5, "seed": -1}, "seed to be an int >= 0"),
    ({"max_episode_length": 5, "is_tf_worker": True}, "TensorFlow"),
])
def test_worker_factory_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        WorkerFactory(**kwargs)


def test_prepare_worker_messages_spreads_only_lists():
    factory = WorkerFactory(max_episode_length=5, n_workers=3)
    assert factory.prepare_worker_messages([1, 2, 3]) == [1, 2, 3]
    assert factory.prepare_worker_messages((1, 2, 3)) == [(1, 2, 3)] * 3  # a tuple of parameters goes whole
    params = {"w": np.zeros(2)}
    assert all(message is params for message in factory.prepare_worker_messages(params))
    assert factory.prepare_worker_messages(None) == [None, None, None]
    array = np.arange(3)
    assert all(message is array for message in factory.prepare_worker_messages(array))
    with pytest.raises(ValueError, match="Length of list doesn't match number of workers: got a list of 4"):
        factory.prepare_worker_messages([1, 2, 3, 4])


def test_prepare_worker_messages_preprocesses_each_message():
    factory = WorkerFactory(max_episode_length=5, n_workers=2)
    calls = []
    assert factory.prepare_worker_messages([1, 2], preprocess=lambda x: calls.append(x) or x * 10) == [10, 20]
    assert factory.prepare_worker_messages(5, preprocess=lambda x: calls.append(x) or x + 1) == [6, 6]
    assert calls == [1, 2, 5, 5]  # called once per worker, as garage


def test_factory_builds_numbered_seeded_workers_within_limits():
    factory = WorkerFactory(max_episode_length=7, seed=100, n_workers=2)
    built = factory(1)
    assert isinstance(built, LogicalWorker) and built.worker_number == 1
    assert built._seed == 100 and built._max_episode_length == 7
    with pytest.raises(ValueError, match="Worker number is too big: 2 >= n_workers=2"):
        factory(2)
    with pytest.raises(ValueError, match="must be >= 0"):
        factory(-1)


class TaggedWorker(LogicalWorker):
    def __init__(self, *, tag: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.tag = tag


def test_factory_passes_worker_class_and_args_and_pickles():
    factory = WorkerFactory(max_episode_length=5, seed=1, n_workers=2, worker_class=TaggedWorker,
                            worker_args={"tag": "x"})
    restored = pickle.loads(pickle.dumps(factory))
    built = restored(0)
    assert isinstance(built, TaggedWorker) and built.tag == "x" and restored.n_workers == 2


def test_workers_refuse_to_pickle():
    with pytest.raises(ValueError, match="Please pickle the WorkerFactory instead"):
        pickle.dumps(worker())


# --- rollouts, step types, last observations -------------------------------------------------------------------

def test_rollout_of_an_env_that_terminates():
    batch = worker(FixedLengthEnv(length=5), max_length=10).rollout()
    assert batch.lengths.tolist() == [5]
    assert batch.step_types.tolist() == [FIRST, MID, MID, MID, TERMINAL]
    assert batch.observations[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert batch.last_observations.tolist() == [[5, 0]]  # the observation after the final action
    assert batch.rewards.tolist() == [1, 2, 3, 4, 5]
    assert batch.actions.tolist() == [1] * 5
    assert batch.env_infos["action_seen"].tolist() == [1] * 5
    assert batch.agent_infos["resets"].tolist() == [1] * 5
    assert batch.episode_infos_by_episode["task"].tolist() == [0]
    assert batch.env_spec.max_episode_length == 10


def test_a_rollout_stopped_by_an_exception_leaves_no_half_episode_behind():
    built = worker(FixedLengthEnv(length=5), max_length=10)
    steps = []

    def stop_after_two() -> None:
        steps.append(1)
        if len(steps) == 2:
            raise KeyboardInterrupt  # as a sampler job's on_step raises when its call is over

    with pytest.raises(KeyboardInterrupt):
        built.rollout(on_step=stop_after_two)
    batch = built.rollout()
    assert batch.lengths.tolist() == [5] and len(batch.observations) == 5  # nothing of the dropped episode


def test_termination_on_the_last_allowed_step_is_terminal():
    batch = worker(FixedLengthEnv(length=5), max_length=5).rollout()
    assert batch.step_types.tolist() == [FIRST, MID, MID, MID, TERMINAL]


def test_max_episode_length_cuts_with_timeout_and_keeps_the_final_observation():
    batch = worker(FixedLengthEnv(length=50), max_length=4).rollout()
    assert batch.step_types.tolist() == [FIRST, MID, MID, TIMEOUT]
    assert batch.last_observations.tolist() == [[4, 0]]
    assert batch.next_observations[:, 0].tolist() == [1, 2, 3, 4]


def test_env_truncation_is_timeout():
    batch = worker(FixedLengthEnv(length=3, truncate=True), max_length=10).rollout()
    assert batch.step_types.tolist() == [FIRST, MID, TIMEOUT]
    assert batch.last_observations.tolist() == [[3, 0]]


def test_one_step_episode_is_just_terminal():
    batch = worker(FixedLengthEnv(length=1)).rollout()
    assert batch.step_types.tolist() == [TERMINAL] and batch.lengths.tolist() == [1]


def test_step_episode_and_collect_gather_several_episodes():
    built = worker(FixedLengthEnv(length=2))
    for _ in range(2):
        built.start_episode()
        while not built.step_episode():
            pass
    batch = built.collect_episode()
    assert batch.lengths.tolist() == [2, 2]
    assert batch.step_types.tolist() == [FIRST, TERMINAL, FIRST, TERMINAL]
    assert batch.agent_infos["resets"].tolist() == [1, 1, 2, 2]
    with pytest.raises(EnvError, match="before an episode finished"):
        built.collect_episode()


def test_cartpole_with_a_plain_module_gives_logprobs_and_timeouts():
    batch = worker(gymnasium.make("CartPole-v1"), fixtures.mlp_policy(), max_length=8).rollout()
    assert batch.observations.shape == (int(batch.lengths[0]), 4) and batch.observations.dtype == np.float32
    assert set(batch.actions.tolist()) <= {0, 1}
    assert batch.agent_infos["log_prob"].shape == (int(batch.lengths[0]),)
    assert np.all(batch.agent_infos["log_prob"] < 0)
    assert batch.step_types[-1] in (TERMINAL, TIMEOUT)


def test_a_plain_module_samples_in_numpy_with_the_log_probs_of_its_logits_and_reseeds():
    policy = fixtures.mlp_policy()
    built = worker(gymnasium.make("CartPole-v1"), policy, max_length=50, seed=4)
    built.reseed(3)
    first = built.rollout()
    with torch.no_grad():
        log_probs = torch.log_softmax(policy(torch.as_tensor(first.observations)), -1).numpy()
    expected = log_probs[np.arange(len(first.actions)), first.actions]
    np.testing.assert_allclose(first.agent_infos["log_prob"], expected, rtol=1e-5, atol=1e-6)
    assert first.agent_infos["log_prob"].dtype == np.float32 and first.actions.dtype == np.int64
    built.rollout()
    built.reseed(3)
    np.testing.assert_array_equal(built.rollout().actions, first.actions)


def test_pendulum_with_a_garage_policy_and_box_actions():
    batch = worker(gymnasium.make("Pendulum-v1"), GaussianPendulumPolicy([1.0, 0.0, 0.0]), max_length=20).rollout()
    assert batch.lengths.tolist() == [20] and batch.step_types[-1] == TIMEOUT
    assert batch.actions.shape == (20, 1) and batch.agent_infos["mean"].shape == (20, 1)
    np.testing.assert_allclose(batch.agent_infos["mean"][:, 0], batch.observations[:, 0], rtol=1e-5)


def test_dict_observations_round_trip_through_safetensors():
    built = worker(fixtures.make_dict_env(), fixtures.DictPolicy(), max_length=6)
    batch = EpisodeBatch.concatenate(built.rollout(), built.rollout())
    assert set(batch.observations) == {"position", "goal"} and batch.observations["goal"].shape == (12,)
    decoded, metadata = decode_episodes(encode_episodes(batch, {"worker": "0"}), batch.env_spec)
    assert metadata["worker"] == "0"
    for key in ("position", "goal"):
        np.testing.assert_array_equal(decoded.observations[key], batch.observations[key])
        np.testing.assert_array_equal(decoded.last_observations[key], batch.last_observations[key])
    np.testing.assert_array_equal(decoded.agent_infos["log_prob"], batch.agent_infos["log_prob"])
    assert decoded.step_types.tolist() == batch.step_types.tolist() == [FIRST, MID, MID, MID, MID, TIMEOUT] * 2


def test_env_info_keys_that_change_within_an_episode_are_refused():
    class FlakyInfoEnv(FixedLengthEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, truncated, info if self.count < 3 else {}

    with pytest.raises(EnvError, match=r"env info keys changed within an episode: .*\['action_seen'\]"):
        worker(FlakyInfoEnv(length=5)).rollout()


def test_updates_are_refused_in_the_middle_of_an_episode():
    built = worker(FixedLengthEnv(length=3))
    built.start_episode()
    built.step_episode()
    with pytest.raises(PolicyError, match="in the middle of an episode"):
        built.update_agent(ScriptedPolicy(action=0))
    with pytest.raises(EnvError, match="in the middle of an episode"):
        built.update_env(FixedLengthEnv())
    while not built.step_episode():
        pass
    built.update_agent(ScriptedPolicy(action=0))  # between episodes: fine
    assert built.collect_episode().actions.tolist() == [1, 1, 1]
    assert built.rollout().actions.tolist() == [0, 0, 0]


def test_a_worker_needs_an_env_and_an_agent():
    built = WorkerFactory(max_episode_length=5, n_workers=1)(0)
    with pytest.raises(EnvError, match="has no env"):
        built.rollout()
    built.update_env(FixedLengthEnv())
    with pytest.raises(PolicyError, match="has no agent"):
        built.rollout()


# --- agent updates ----------------------------------------------------------------------------------------------

def test_agent_updates_params_none_and_replacement():
    policy = ScriptedPolicy(action=1)
    built = worker(agent=policy)
    built.update_agent(np.array([0]))  # ndarray: parameters
    assert built.rollout().actions.tolist() == [0] * 5 and built.agent is policy
    built.update_agent((1,))  # tuple: parameters too, not spread
    assert built.rollout().actions.tolist() == [1] * 5
    built.update_agent(None)
    assert built.rollout().actions.tolist() == [1] * 5
    replacement = ScriptedPolicy(action=0)
    built.update_agent(replacement)
    assert built.agent is replacement and built.rollout().actions.tolist() == [0] * 5


def biased_linear(bias: list[float]) -> torch.nn.Linear:
    module = torch.nn.Linear(2, 2)
    with torch.no_grad():
        module.weight.zero_()
        module.bias.copy_(torch.tensor(bias))
    return module


def test_module_agent_takes_state_dicts_as_params():
    module = biased_linear([-50.0, 50.0])
    built = worker(FixedLengthEnv(length=4), module)
    assert isinstance(built.agent, ModuleAgent) and built.agent.module is module
    assert built.rollout().actions.tolist() == [1] * 4
    built.update_agent(biased_linear([50.0, -50.0]).state_dict())
    assert built.rollout().actions.tolist() == [0] * 4
    assert built.agent.get_param_values()["bias"].tolist() == [50.0, -50.0]
    with pytest.raises(PolicyError, match="wrong shapes"):
        built.update_agent({"weight": torch.zeros(3, 2), "bias": torch.zeros(2)})


def test_bad_agents_are_refused():
    empty = WorkerFactory(max_episode_length=5, n_workers=1)(0)
    with pytest.raises(PolicyError, match="has no agent yet"):
        empty.update_agent({"w": np.zeros(1)})
    with pytest.raises(PolicyError, match="got str"):
        empty.update_agent("policy.pt")
    built = worker(gymnasium.make("Pendulum-v1"), torch.nn.Linear(3, 2))
    with pytest.raises(PolicyError, match="needs a Discrete action space"):
        built.rollout()


# --- env updates ------------------------------------------------------------------------------------------------

def test_new_env_update_closes_the_old_env_and_builds_a_new_one():
    old = FixedLengthEnv()
    new = NewEnvUpdate(lambda: FixedLengthEnv(length=2))(old)
    assert old.closed and isinstance(new, FixedLengthEnv) and new.length == 2
    assert isinstance(NewEnvUpdate(FixedLengthEnv)(None), FixedLengthEnv)


def test_set_task_update_reuses_an_env_of_exactly_that_type():
    env = FixedLengthEnv()
    update = SetTaskUpdate(FixedLengthEnv, task=3, wrapper_constructor=None)
    assert update(env) is env and env.task == 3 and not env.closed
    wrapped = gymnasium.wrappers.RecordEpisodeStatistics(FixedLengthEnv())
    assert update(wrapped) is wrapped and wrapped.unwrapped.task == 3


def test_set_task_update_rebuilds_other_types_and_subtypes_with_a_warning():
    other = OtherTaskEnv()
    update = SetTaskUpdate(FixedLengthEnv, task=4,
                           wrapper_constructor=lambda env, task: gymnasium.wrappers.RecordEpisodeStatistics(env))
    with pytest.warns(UserWarning, match="SetTaskUpdate is closing an env of type OtherTaskEnv"):
        rebuilt = update(other)
    assert other.closed and type(rebuilt.unwrapped) is FixedLengthEnv and rebuilt.unwrapped.task == 4
    assert isinstance(rebuilt, gymnasium.wrappers.RecordEpisodeStatistics)
    assert type(update(None).unwrapped) is FixedLengthEnv
    with pytest.raises(ValueError, match="env_type should be a type"):
        SetTaskUpdate(FixedLengthEnv(), task=1)  # type: ignore[arg-type]


def test_existing_env_update_returns_its_env_and_warns_when_pickled():
    env = FixedLengthEnv(length=3)
    update = ExistingEnvUpdate(env)
    assert update(FixedLengthEnv()) is env
    with pytest.warns(UserWarning, match="not the most efficient"):
        restored = pickle.loads(pickle.dumps(update))
    assert restored(None).length == 3
    assert isinstance(update, EnvUpdate)


def test_apply_env_update_accepts_envs_updates_and_callables():
    old = FixedLengthEnv()
    assert apply_env_update(old, None) == (old, False)
    replacement = FixedLengthEnv(length=2)
    assert apply_env_update(old, replacement) == (replacement, True) and old.closed
    env, changed = apply_env_update(replacement, lambda previous: FixedLengthEnv(length=previous.length + 1))
    assert changed and env.length == 3
    with pytest.raises(TypeError, match="Unknown environment update type: int"):
        check_env_update(3)
    with pytest.raises(EnvError, match="returned str, expected a gymnasium.Env"):
        apply_env_update(old, lambda previous: "CartPole-v1")


def test_env_updates_apply_to_the_next_episode():
    built = worker(FixedLengthEnv(length=3))
    assert built.rollout().observations[:, 1].tolist() == [0, 0, 0]
    built.update_env(SetTaskUpdate(FixedLengthEnv, task=5))
    batch = built.rollout()
    assert batch.observations[:, 1].tolist() == [5, 5, 5] and batch.episode_infos_by_episode["task"].tolist() == [5]
    built.update_env(NewEnvUpdate(lambda: FixedLengthEnv(length=2, task=9)))
    assert built.rollout().observations[:, 1].tolist() == [9, 9]
    previous = built.env
    built.shutdown()
    assert previous.closed


# --- seeding ----------------------------------------------------------------------------------------------------

def test_same_seed_and_worker_number_give_identical_episodes():
    first, second = cartpole_episodes(seed=11, number=2), cartpole_episodes(seed=11, number=2)
    assert all(same_episodes(a, b) for a, b in zip(first, second, strict=True))
    assert not same_episodes(first[0], first[1])  # later resets continue the stream, they do not repeat it


def test_different_worker_numbers_or_seeds_give_different_episodes():
    base = cartpole_episodes(seed=11, number=0)[0]
    assert not same_episodes(base, cartpole_episodes(seed=11, number=1)[0])
    assert not same_episodes(base, cartpole_episodes(seed=12, number=0)[0])
    assert same_episodes(cartpole_episodes(seed=12, number=0)[0], cartpole_episodes(seed=11, number=1)[0])


def test_the_first_reset_is_seeded_with_seed_plus_worker_number():
    built = worker(gymnasium.make("CartPole-v1"), fixtures.mlp_policy(), seed=40, number=2)
    expected, _ = gymnasium.make("CartPole-v1").reset(seed=42)
    np.testing.assert_array_equal(built.rollout().observations[0], expected)


def test_workers_sharing_a_process_keep_their_own_global_rng_streams():
    def pendulum_worker(number: int) -> LogicalWorker:
        return worker(gymnasium.make("Pendulum-v1"), GaussianPendulumPolicy(), seed=5, number=number, max_length=15)

    alone = pendulum_worker(0)
    alone_episodes = [alone.rollout() for _ in range(2)]
    a, b = pendulum_worker(0), pendulum_worker(1)
    interleaved = []
    for _ in range(2):
        interleaved.append(a.rollout())
        b.rollout()
        np.random.standard_normal(7)  # the caller's own use of the global RNG between rollouts
    for left, right in zip(alone_episodes, interleaved, strict=True):
        np.testing.assert_array_equal(left.actions, right.actions)


def test_rollouts_leave_the_callers_global_rngs_alone():
    built = worker(gymnasium.make("Pendulum-v1"), GaussianPendulumPolicy(), seed=5, max_length=15)
    np.random.seed(123)
    random.seed(123)
    torch.manual_seed(123)
    expected = (np.random.standard_normal(3), random.random(), torch.rand(3))
    np.random.seed(123)
    random.seed(123)
    torch.manual_seed(123)
    built.rollout()
    after = (np.random.standard_normal(3), random.random(), torch.rand(3))
    np.testing.assert_array_equal(after[0], expected[0])
    assert after[1] == expected[1] and torch.equal(after[2], expected[2])


def test_reseed_makes_an_episode_a_function_of_seed_worker_and_episode_index():
    def pendulum_worker(number: int = 1) -> LogicalWorker:
        return worker(gymnasium.make("Pendulum-v1"), GaussianPendulumPolicy(), seed=5, number=number, max_length=15)

    fresh = pendulum_worker()
    fresh_first = fresh.rollout()
    fresh.reseed(3)
    third = fresh.rollout()
    moved = pendulum_worker()  # the same logical worker rebuilt elsewhere, with another history
    for _ in range(2):
        moved.rollout()
    moved.reseed(3)
    assert same_episodes(moved.rollout(), third) and not same_episodes(third, fresh_first)
    moved.reseed(0)
    assert same_episodes(moved.rollout(), fresh_first)
    other = pendulum_worker(number=2)
    other.reseed(3)
    assert not same_episodes(other.rollout(), third)
    with pytest.raises(ConfigError, match="has no seed"):
        worker(seed=None).reseed(1)


def test_unseeded_workers_differ():
    first, second = cartpole_episodes(seed=None, number=0, n=1), cartpole_episodes(seed=None, number=0, n=1)
    assert not same_episodes(first[0], second[0])


def test_frame_stack_episodes_go_as_unique_frames_compressed_and_round_trip():
    built = worker(fixtures.make_frame_stack_env(max_episode_steps=9), ScriptedPolicy(0), max_length=9)
    batch = EpisodeBatch.concatenate(built.rollout(), built.rollout(), built.rollout())
    assert batch.observations.shape == (27, 4, 12, 12) and batch.observations.dtype == np.uint8
    blob = encode_episodes(batch, {"worker": "0"})
    assert blob.startswith(COMPRESSED_MAGIC)
    assert len(blob) < 0.5 * batch.observations.nbytes, "each episode's shifted steps send one frame"
    decoded, metadata = decode_episodes(blob, batch.env_spec)
    assert metadata["worker"] == "0"
    np.testing.assert_array_equal(decoded.observations, batch.observations)
    np.testing.assert_array_equal(decoded.last_observations, batch.last_observations)
    np.testing.assert_array_equal(decoded.next_observations, batch.next_observations)


def nan_state(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights, every one NaN: what a diverged update sends."""
    return {key: value * float("nan") for key, value in policy.state_dict().items()}


def test_nan_weights_are_refused_not_sampled_and_the_worker_goes_on_after_a_good_update():
    policy = fixtures.mlp_policy()
    good = {key: value.clone() for key, value in policy.state_dict().items()}
    built = worker(gymnasium.make("CartPole-v1"), policy, max_length=50)
    built.update_agent(nan_state(policy))
    with pytest.raises(PolicyError, match=r"log-prob nan at step 0 of an episode of logical worker 0; expected "
                                          r"finite numbers: check the policy \(NaN weights"):
        built.rollout()
    built.update_agent(good)  # between episodes: the refused one left nothing behind
    assert np.isfinite(built.rollout().agent_infos["log_prob"]).all()


def test_a_garage_policys_log_prob_that_is_not_finite_is_refused_at_its_step():
    class InfiniteAtStepTwo(ScriptedPolicy):
        steps = 0

        def get_action(self, observation):
            self.steps += 1
            return self.action, {"log_prob": np.float32(-np.inf if self.steps == 3 else -0.5)}

    with pytest.raises(PolicyError, match=r"log-prob -inf at step 2 of an episode of logical worker 1"):
        worker(FixedLengthEnv(length=5), InfiniteAtStepTwo(), number=1).rollout()


def test_a_zero_argument_env_factory_is_refused_with_the_way_to_pass_it():
    with pytest.raises(ConfigError, match=r"make_cartpole is a callable that cannot take one argument.*old_env -> env.*"
                                          r"rqrl\.NewEnvUpdate\(make_cartpole\)"):
        check_env_update(fixtures.make_cartpole)
    with pytest.raises(ConfigError, match=r"is a callable that cannot take one argument"):
        check_env_update(lambda old_env, another: old_env)
    for accepted in (NewEnvUpdate(fixtures.make_cartpole), lambda old_env: old_env, FixedLengthEnv, None):
        check_env_update(accepted)


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), None], ids=["nan", "inf", "none"])
def test_an_env_reward_that_is_no_finite_number_is_refused_at_its_step(reward):
    """A NaN reward went into the episode; PPO trained on it and every weight, best.safetensors included, went NaN."""

    class BadRewardAtStepThree(gymnasium.Wrapper):
        steps = 0

        def step(self, action):
            obs, good, terminated, truncated, info = self.env.step(action)
            self.steps += 1
            return obs, (reward if self.steps == 3 else good), terminated, truncated, info

    built = worker(BadRewardAtStepThree(gymnasium.make("CartPole-v1")), fixtures.mlp_policy(), number=2,
                   max_length=50)
    with pytest.raises(EnvError, match=rf"worker 2's env returned reward {reward} at step 2 of its episode; "
                                       r"rewards must be finite numbers"):
        built.rollout()
