"""rqrl.algorithms.atari: ALE ids become the preprocessed env (real ROMs: Pong, Breakout), the life-loss option, the
env factory a worker unpickles, and one line naming rqrl[atari] when ale-py or opencv is missing."""

from __future__ import annotations

import importlib.util
import pickle
import sys

import numpy as np
import pytest

from rqrl.algorithms.atari import check_atari_options, make_atari_env
from rqrl.algorithms.common import env_factory, env_spaces, make_train_env
from rqrl.algorithms.dqn import DqnConfig
from rqrl.algorithms.impala import ImpalaConfig
from rqrl.algorithms.ppo import PpoConfig
from rqrl.errors import ConfigError, MissingExtraError

needs_atari = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="ale-py or opencv not installed: pip install 'rqrl[atari]'")


def play(env, actions, seed=0, limit=5000):
    """Step ``env`` from a reset with seed ``seed`` with actions drawn from ``actions`` until the episode ends;
    returns the steps and the last info."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    for step in range(1, limit + 1):
        _, _, terminated, truncated, info = env.step(int(rng.choice(actions)))
        if terminated or truncated:
            return step, info
    raise AssertionError(f"no episode end in {limit} steps")


@needs_atari
def test_pong_is_four_stacked_84x84_grayscale_frames_of_uint8():
    env = make_train_env("ALE/Pong-v5")
    try:
        assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
        assert env.action_space.n == 6
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs.max() > 0
        for _ in range(10):
            obs, reward, *_ = env.step(env.action_space.sample())
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert not np.array_equal(obs[0], obs[-1]), "the stack holds 4 different frames"
        kwargs = env.spec.kwargs  # the base env: frame skip in the preprocessing, v5's sticky actions kept
        assert kwargs["frameskip"] == 1 and kwargs["repeat_action_probability"] == 0.25
    finally:
        env.close()


@needs_atari
@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "ALE/Breakout-v5"])
def test_the_env_observes_its_ram_and_gives_the_frames_an_rgb_observing_env_gives(env_id):
    """The preprocessing reads its frames off the emulator's screen: the base env's own observations are the cheap
    128-byte RAM, and the observations, rewards and ends are those of the same env observing its RGB screen."""
    cheap, screen = make_atari_env(env_id), make_atari_env(env_id, obs_type="rgb")
    try:
        assert cheap.unwrapped.observation_space.shape == (128,) and screen.unwrapped.observation_space.shape[2] == 3
        rng = np.random.default_rng(0)
        first = [env.reset(seed=7)[0] for env in (cheap, screen)]
        assert np.array_equal(*first)
        for _ in range(300):
            action = int(rng.integers(cheap.action_space.n))
            (obs, reward, terminated, truncated, _), expected = cheap.step(action), screen.step(action)
            assert np.array_equal(obs, expected[0]) and (reward, terminated, truncated) == tuple(expected[1:4])
            if terminated or truncated:
                assert np.array_equal(cheap.reset()[0], screen.reset()[0])
    finally:
        cheap.close()
        screen.close()


@needs_atari
def test_the_learners_size_their_networks_by_the_preprocessed_env():
    assert env_spaces("ALE/Pong-v5") == ((4, 84, 84), 6, None)
    assert env_spaces("ALE/Breakout-v5").obs_shape == (4, 84, 84)


@needs_atari
def test_gymnasium_make_arguments_pass_through():
    env = make_atari_env("ALE/Pong-v5", repeat_action_probability=0.0)
    try:
        assert env.spec.kwargs["repeat_action_probability"] == 0.0 and env.spec.kwargs["frameskip"] == 1
    finally:
        env.close()


@needs_atari
def test_terminal_on_life_loss_ends_a_breakout_episode_at_the_first_life_lost():
    actions = [1, 2, 3]  # FIRE (serves the ball), RIGHT, LEFT
    whole_game = make_train_env("ALE/Breakout-v5")
    one_life = make_train_env("ALE/Breakout-v5", terminal_on_life_loss=True)
    try:
        game_steps, game_info = play(whole_game, actions)
        life_steps, life_info = play(one_life, actions)
    finally:
        whole_game.close()
        one_life.close()
    assert game_info["lives"] == 0 and life_info["lives"] == 4
    assert life_steps < game_steps


def test_terminal_on_life_loss_is_refused_for_an_env_that_is_not_atari():
    with pytest.raises(ConfigError, match=r"--terminal-on-life-loss is for Atari env ids \(ALE/\.\.\.\), not "
                                          r"'CartPole-v1'"):
        ImpalaConfig(env_id="CartPole-v1", terminal_on_life_loss=True)
    with pytest.raises(ConfigError, match="--terminal-on-life-loss"):
        make_train_env("CartPole-v1", terminal_on_life_loss=True)
    with pytest.raises(ConfigError, match="--terminal-on-life-loss and --repeat-action-probability are for Atari"):
        make_train_env("CartPole-v1", terminal_on_life_loss=True, repeat_action_probability=0.1)
    check_atari_options("ALE/Pong-v5", True)


@pytest.mark.parametrize("config_class", [ImpalaConfig, PpoConfig, DqnConfig])
def test_sticky_actions_are_refused_for_an_env_that_is_not_atari_or_out_of_range(config_class):
    with pytest.raises(ConfigError, match=r"--repeat-action-probability is for Atari env ids .* not 'CartPole-v1'"):
        config_class(env_id="CartPole-v1", repeat_action_probability=0.0)
    with pytest.raises(ConfigError, match="expected --repeat-action-probability between 0 and 1, got 1.5"):
        config_class(env_id="ALE/Pong-v5", repeat_action_probability=1.5)


@needs_atari
@pytest.mark.parametrize(("given", "emulator"), [(None, 0.25), (0.0, 0.0), (0.5, 0.5)])
def test_sticky_actions_reach_the_emulator_of_the_workers_and_of_the_evaluations(given, emulator):
    config = ImpalaConfig(env_id="ALE/Pong-v5", repeat_action_probability=given)
    for env in (pickle.loads(pickle.dumps(env_factory(config)))(),
                make_train_env(config.env_id, repeat_action_probability=config.repeat_action_probability)):
        try:
            assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(emulator)
        finally:
            env.close()

@needs_atari
def test_an_unknown_atari_id_is_one_line_with_gymnasiums_hint():
    with pytest.raises(ConfigError, match=r"unknown Atari env id 'ALE/Pongg-v5' .*Did you mean: `Pong`"):
        make_train_env("ALE/Pongg-v5")


@needs_atari
def test_the_env_factory_pickles_by_reference_and_builds_the_env_where_it_is_unpickled():
    factory = env_factory(ImpalaConfig(env_id="ALE/Breakout-v5", terminal_on_life_loss=True))
    blob = pickle.dumps(factory)  # plain pickle: a reference to rqrl.algorithms.common.make_train_env, no code
    assert b"make_train_env" in blob and len(blob) < 300
    env = pickle.loads(blob)()
    try:
        _, info = play(env, [1, 2, 3])
        assert info["lives"] == 4  # the option travelled with the factory
    finally:
        env.close()


@pytest.mark.parametrize(("module", "what"), [("ale_py", "Atari envs need ale-py"),
                                              ("cv2", "Atari's preprocessing .* needs opencv")])
def test_a_missing_ale_py_or_opencv_is_one_line_naming_the_extra(monkeypatch, module, what):
    monkeypatch.setitem(sys.modules, module, None)  # what `import MODULE` finds where it is not installed
    with pytest.raises(MissingExtraError, match=rf"{what}, which is not installed .*: pip install \"rqrl\[atari\]\"$") \
            as raised:
        make_train_env("ALE/Pong-v5")
    assert raised.value.extra == "atari" and "\n" not in str(raised.value)
    with pytest.raises(MissingExtraError):
        env_spaces("ALE/Pong-v5")  # what `rqrl train --env ALE/Pong-v5` meets first
