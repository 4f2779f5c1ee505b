"""`rqrl train --env ALE/Pong-v5` as a user runs it (rqrl.algorithms.atari): IMPALA, PPO and DQN train the Nature
CNN on the real Pong ROM with real workers, for a tiny budget each, and exit cleanly."""

from __future__ import annotations

import importlib.util
import json
import math
import uuid

import pytest

from rqrl.algorithms.checkpoint import load_weights
from tests.children import processes_with_marker, run_rqrl, worker_env
from tests.polling import wait_until
from tests.run_files import read_rows

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
                       reason="ale-py or opencv not installed: pip install 'rqrl[atari]'"),
]


def train(tmp_path, *arguments: str) -> tuple[dict, list[dict]]:
    """Run `rqrl train ARGUMENTS` in tmp_path/run; its summary and metrics rows, once it exited with 0 and left no
    process behind."""
    marker = uuid.uuid4().hex
    result = run_rqrl("train", *arguments, "--run-dir", str(tmp_path), "--run-name", "run", "--no-progress",
                      env=worker_env(RQRL_TEST_MARKER=marker), timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    wait_until(lambda: not processes_with_marker(marker), 10, interval=0.1,
               message=lambda: f"the run's processes to exit: {processes_with_marker(marker)}")
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["env_id"] == "ALE/Pong-v5"
    weights, metadata = load_weights(run / "final.safetensors")
    assert metadata["env_id"] == "ALE/Pong-v5" and "budget reached" in result.stdout
    assert any(key.endswith("torso.convs.0.weight") and tuple(value.shape) == (32, 4, 8, 8)
               for key, value in weights.items()), sorted(weights)
    return json.loads((run / "summary.json").read_text()), read_rows(run / "metrics.csv")


def test_impala_trains_the_cnn_on_pong_with_local_workers(tmp_path):
    # a game of Pong takes 816-1,081 agent steps at random (6 seeds), longer once the ball is returned: 1,920 steps
    # an actor (1,280 failed CI once, one game short) leave each actor a whole game
    summary, rows = train(tmp_path, "--env", "ALE/Pong-v5", "--total-env-steps", "3840", "--n-actors", "2",
                          "--batch-size", "2", "--n-rollout-steps", "32", "--workers", "2", "--seed", "1")
    assert summary["env_steps"] >= 3840 and summary["updates"] >= 60, summary  # 64 steps an update
    assert summary["episodes"] >= 2 and -21 <= summary["mean_return"] <= -10, summary  # a whole game each
    assert float(rows[-1]["workers_alive"]) == 2 and math.isfinite(float(rows[-1]["policy_loss"]))


def test_ppo_trains_the_cnn_on_pong_without_sticky_actions_and_evaluate_plays_it_so(tmp_path):
    summary, _ = train(tmp_path, "ppo", "--env", "ALE/Pong-v5", "--total-env-steps", "400", "--num-samples", "200",
                       "--max-episode-length", "50", "--n-workers", "2", "--workers", "1", "--epochs", "1",
                       "--minibatch-size", "64", "--repeat-action-probability", "0")
    assert summary["env_steps"] >= 400 and summary["updates"] >= 2 and summary["episodes"] >= 8, summary
    assert json.loads((tmp_path / "run" / "config.json").read_text())["repeat_action_probability"] == 0.0
    result = run_rqrl("evaluate", str(tmp_path / "run"), "--episodes", "1", timeout=120)
    assert result.returncode == 0 and "ALE/Pong-v5: 1 episodes, return" in result.stdout, result.stderr[-3000:]


def test_dqn_trains_the_cnn_on_pong_from_a_uint8_replay(tmp_path):
    summary, rows = train(tmp_path, "dqn", "--env", "ALE/Pong-v5", "--seconds", "15", "--minimum-buffer-size", "100",
                          "--replay-capacity", "1000", "--batch-size", "16")
    assert summary["updates"] >= 1, summary  # train steps: the replay filled past its minimum and trained
    assert int(rows[-1]["replay_size"]) >= 100
    bytes_per_transition = float(rows[-1]["replay_megabytes"]) * 2**20 / int(rows[-1]["replay_size"])
    assert 0 < bytes_per_transition < 14_000  # about a 7,056-byte frame each (less where the screen stands still)
