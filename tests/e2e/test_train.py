"""`rqrl train` and `rqrl evaluate` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from tests.polling import wait_until
from tests.processes import REPO_ROOT, alive, descendants, processes_with_marker, run_rqrl, stop_process, worker_env
from tests.run_files import PNG_SIGNATURE, read_rows

pytestmark = pytest.mark.timeout(240)
TRIVIAL_ENV = "tests.fixtures:RqrlGuessSign-v0"


def rqrl(*arguments: str, timeout: float = 200) -> subprocess.CompletedProcess:
    return run_rqrl(*arguments, timeout=timeout)


def rows_written(run, learner: subprocess.Popen) -> int:
    """Lines in the run's metrics.csv so far; a learner that exits meanwhile fails the test with its stderr."""
    if learner.poll() is not None:
        stderr = learner.stderr.read()
        raise AssertionError(f"the learner exited with {learner.returncode}: "
                             f"{(stderr.decode() if isinstance(stderr, bytes) else stderr)[-3000:]}")
    metrics = run / "metrics.csv"
    return len(metrics.read_text().splitlines()) if metrics.is_file() else 0


def test_train_solves_a_trivial_env_and_writes_the_run_folder(tmp_path):
    result = rqrl("train", "--env", TRIVIAL_ENV, "--total-env-steps", "60000", "--n-actors", "4",
                  "--batch-size", "4", "--n-rollout-steps", "20", "--workers", "2", "--run-dir", str(tmp_path),
                  "--run-name", "trivial", "--seed", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "trivial"
    for name in ("final.safetensors", "best.safetensors", "checkpoint.safetensors", "metrics.csv", "config.json",
                 "summary.json", "learning_curve.png"):
        assert (run / name).is_file(), name
    assert any((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "learning_curve.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = read_rows(run / "metrics.csv")
    assert rows and {"env_steps", "mean_return", "policy_lag_mean", "queue_size"} <= set(rows[0])
    summary = json.loads((run / "summary.json").read_text())
    random_policy_return = 10.0  # 20 coin flips
    assert summary["mean_return"] > random_policy_return + 5, summary
    assert "step/s" in result.stderr and "lag" in result.stderr and "queue" in result.stderr  # progress bar
    evaluation = rqrl("evaluate", str(run), "--episodes", "5")
    assert evaluation.returncode == 0, evaluation.stderr
    mean = float(evaluation.stdout.split("return ")[1].split(" ")[0])
    assert mean > random_policy_return + 5


def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_resume_continues(tmp_path):
    command = [sys.executable, "-m", "rqrl", "train", "--env", TRIVIAL_ENV, "--total-env-steps", "100000000",
               "--target-return", "1000", "--n-actors", "2", "--batch-size", "2", "--workers", "2",
               "--run-dir", str(tmp_path), "--run-name", "interrupted"]
    marker = uuid.uuid4().hex
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = tmp_path / "interrupted"
    wait_until(lambda: rows_written(run, learner) >= 20, 120, interval=0.2, message="20 rows of metrics.csv")
    children = descendants(learner.pid)
    assert len(children) >= 3, "expected local workers and a redis-server under the learner"
    os.killpg(learner.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    stdout, stderr = learner.communicate(timeout=60)
    assert learner.returncode == 130, stderr[-3000:]
    assert "interrupted" in stdout
    assert (run / "checkpoint.safetensors").is_file()
    wait_until(lambda: not processes_with_marker(marker) and not any(map(alive, children)), 5, interval=0.1,
               message=lambda: f"the learner's processes to exit after Ctrl-C: {processes_with_marker(marker)}")
    assert processes_with_marker(marker) == [], "processes left behind after Ctrl-C"
    assert [pid for pid in children if alive(pid)] == [], "children of the learner left behind after Ctrl-C"
    steps_before = json.loads((run / "summary.json").read_text())["env_steps"]

    resumed = rqrl("train", "--resume", str(run), "--env", TRIVIAL_ENV, "--total-env-steps",
                   str(steps_before + 2000), "--n-actors", "2", "--batch-size", "2", "--workers", "1",
                   "--target-return", "1000", "--run-dir", str(tmp_path), "--run-name", "interrupted")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= steps_before + 2000


def test_a_sigkilled_learner_resumes_its_run_on_the_same_redis_and_workers_never_notice(
        tmp_path, connection, redis_url, workers):
    worker = workers.start("steady")
    workers.wait_registered(connection, 1)
    common = ["--env", TRIVIAL_ENV, "--n-actors", "2", "--batch-size", "2", "--n-rollout-steps", "20",
              "--workers", "0", "--redis-url", redis_url, "--run-dir", str(tmp_path), "--run-name", "killed",
              "--target-return", "1000", "--checkpoint-seconds", "0.5"]
    learner = subprocess.Popen([sys.executable, "-m", "rqrl", "train", *common, "--total-env-steps", "100000000"],
                               cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run = tmp_path / "killed"
    try:
        wait_until(lambda: (run / "checkpoint.safetensors").is_file() and rows_written(run, learner) >= 5, 120,
                   interval=0.2, message="a checkpoint and 5 rows of metrics.csv")
        learner.send_signal(signal.SIGKILL)  # no clean-up at all: the run's keys, jobs and batch stay in Redis
        learner.wait(timeout=10)
    finally:
        stop_process(learner)
    assert connection.exists("rqrl:killed:config")
    held = connection.llen("rqrl:killed:unacknowledged")  # the (part of a) batch the learner had popped
    assert held <= 2
    steps_before = int(read_rows(run / "metrics.csv")[-1]["env_steps"])

    resumed = rqrl("train", "--resume", str(run), *common, "--total-env-steps", str(steps_before + 4000))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"re-delivering {held} rollout(s)" in resumed.stderr) == (held > 0), resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= steps_before + 4000
    assert worker.poll() is None, "the worker noticed the learner's death"
    assert connection.keys("rqrl:killed:*") == [], "the resumed learner's stop() cleans the run up"


PPO_ARGUMENTS = ("--algo", "ppo", "--env", TRIVIAL_ENV, "--n-workers", "4", "--num-samples", "400",
                 "--minibatch-size", "100", "--epochs", "4", "--learning-rate", "0.003", "--workers", "1",
                 "--seed", "1")


@pytest.mark.slow  # about 30 s on a loaded 2-core machine; tests/unit/test_ppo.py runs the loop in-process
def test_train_ppo_on_the_garage_sampler_writes_the_run_folder(tmp_path):
    result = rqrl("train", *PPO_ARGUMENTS, "--total-env-steps", "4000", "--run-dir", str(tmp_path),
                  "--run-name", "ppo")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "ppo"
    for name in ("final.safetensors", "best.safetensors", "checkpoint.safetensors", "metrics.csv", "config.json",
                 "summary.json", "learning_curve.png"):
        assert (run / name).is_file(), name
    assert any((run / "tensorboard").glob("events.out.tfevents.*"))
    rows = read_rows(run / "metrics.csv")
    assert rows and {"env_steps", "mean_return", "clip_fraction", "dropped_episodes"} <= set(rows[0])
    assert json.loads((run / "config.json").read_text())["algo"] == "ppo"
    assert "PPO" in result.stderr  # the progress bar
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] >= 4000 and summary["mean_return"] > 15, summary  # random: about 10
    evaluation = rqrl("evaluate", str(run), "--episodes", "5")
    assert evaluation.returncode == 0, evaluation.stderr


def test_train_refuses_flags_of_the_other_algorithm():
    result = rqrl("train", "--algo", "ppo", "--n-actors", "3", "--total-env-steps", "1")
    assert result.returncode != 0 and "--n-actors" in result.stderr and "ppo" in result.stderr
    result = rqrl("train", "--num-samples", "100", "--total-env-steps", "1")
    assert result.returncode != 0 and "--num-samples" in result.stderr


@pytest.mark.slow
def test_train_ppo_resumes_where_it_stopped(tmp_path):
    first = rqrl("train", *PPO_ARGUMENTS, "--total-env-steps", "800", "--run-dir", str(tmp_path), "--run-name", "p")
    assert first.returncode == 0, first.stderr[-3000:]
    steps = json.loads((tmp_path / "p" / "summary.json").read_text())["env_steps"]
    resumed = rqrl("train", *PPO_ARGUMENTS, "--total-env-steps", "1600", "--resume", str(tmp_path / "p"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["env_steps"] >= 1600 and summary["updates"] > 2 and steps >= 800
    assert int(float(read_rows(tmp_path / "p" / "metrics.csv")[-1]["env_steps"])) == summary["env_steps"]
