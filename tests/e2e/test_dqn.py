"""`rqrl train dqn` (rqrl.algorithms.dqn on the SEED trainer) as a user runs it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import uuid

import pytest
import torch

from rqrl.algorithms.checkpoint import load_checkpoint, load_weights
from tests.children import (
    REPO_ROOT,
    alive,
    communicate_or_show_stacks,
    descendants,
    processes_with_marker,
    run_rqrl,
    stop_from_outside,
    stop_process,
    worker_env,
)
from tests.polling import wait_until
from tests.run_files import PNG_SIGNATURE, read_rows

pytestmark = pytest.mark.timeout(300)
TRIVIAL_ENV = "tests.fixtures:RqrlGuessSign-v0"


def test_a_short_run_writes_the_run_folder(tmp_path):
    result = run_rqrl("train", "dqn", "--env", TRIVIAL_ENV, "--seconds", "4", "--run-dir", str(tmp_path),
                      "--run-name", "short", "--target-return", "1000", "--eval-every", "1", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("time budget reached:"), result.stdout  # --seconds ended it, not the steps
    assert "run short on Redis unix://" in result.stderr, result.stderr[-3000:]
    run = tmp_path / "short"
    for name in ("final.safetensors", "metrics.csv", "config.json", "summary.json", "learning_curve.png"):
        assert (run / name).is_file(), name
    assert (run / "learning_curve.png").read_bytes()[:8] == PNG_SIGNATURE
    assert json.loads((run / "config.json").read_text())["algo"] == "dqn"
    rows = read_rows(run / "metrics.csv")
    assert rows and {"env_steps", "mean_return", "train_steps", "weights_version"} <= set(rows[0])
    assert any(row["eval_return"] for row in rows), "--eval-every 1: greedy returns in the rows"
    assert "run folder:" in result.stdout
    evaluated = run_rqrl("evaluate", str(run), "--episodes", "1", timeout=120)
    assert evaluated.returncode == 0 and "RqrlGuessSign-v0: 1 episodes" in evaluated.stdout, evaluated.stderr[-2000:]


@pytest.mark.slow
def test_dqn_solves_a_trivial_env(tmp_path):
    result = run_rqrl("train", "dqn", "--env", TRIVIAL_ENV, "--seconds", "240", "--run-dir", str(tmp_path),
                      "--run-name", "trivial", timeout=290)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "trivial" / "summary.json").read_text())
    assert summary["solved"] and summary["mean_return"] >= 19.0, summary
    assert (tmp_path / "trivial" / "best.safetensors").is_file()


@pytest.mark.slow
def test_dqn_solves_cartpole(tmp_path):
    result = run_rqrl("train", "dqn", "--env", "CartPole-v1", "--seconds", "280", "--run-dir", str(tmp_path),
                      "--run-name", "cartpole", timeout=295)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "cartpole" / "summary.json").read_text())
    assert summary["solved"] and summary["mean_return"] >= 475, summary


def trained(run) -> bool:
    """Whether metrics.csv shows a train step."""
    path = run / "metrics.csv"
    return path.is_file() and any(int(row["train_steps"] or 0) > 0 for row in read_rows(path))


def test_ctrl_c_stops_the_learner_and_its_processes_without_a_traceback(tmp_path):
    run = tmp_path / "interrupted"
    marker = uuid.uuid4().hex
    command = [sys.executable, "-m", "rqrl", "train", "dqn", "--env", TRIVIAL_ENV, "--seconds", "600",
               "--minimum-buffer-size", "100", "--target-return", "1000", "--run-dir", str(tmp_path),
               "--run-name", "interrupted", "--progress-seconds", "0.5"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_until(lambda: learner.poll() is not None or trained(run), 120, interval=0.2, message="a train step")
        children = descendants(learner.pid)
        os.killpg(learner.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
        stdout, stderr = communicate_or_show_stacks(learner, 60)
    finally:
        stop_process(learner)
    assert learner.returncode == 130, stderr[-3000:]
    assert "interrupted (SIGINT)" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]  # the actor and inference server processes printed one each
    wait_until(lambda: not processes_with_marker(marker) and not any(map(alive, children)), 10, interval=0.1,
               message=lambda: f"the learner's processes to exit after Ctrl-C: {processes_with_marker(marker)}")
    assert json.loads((run / "summary.json").read_text())["stopped_by"] == "SIGINT"


def test_sigterm_writes_a_checkpoint_and_resume_continues_with_the_same_weights(tmp_path):
    run = tmp_path / "resumable"
    marker = uuid.uuid4().hex
    command = [sys.executable, "-m", "rqrl", "train", "dqn", "--env", TRIVIAL_ENV, "--seconds", "600",
               "--minimum-buffer-size", "100", "--target-return", "1000", "--run-dir", str(tmp_path),
               "--run-name", "resumable", "--checkpoint-seconds", "0.5", "--progress-seconds", "0.5"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: learner.poll() is not None or (trained(run) and (run / "checkpoint.safetensors").is_file()),
                   120, interval=0.2, message="training to start and a periodic checkpoint")
        children = descendants(learner.pid)
        learner.send_signal(signal.SIGTERM)  # what `docker compose stop` sends
        stdout, stderr = communicate_or_show_stacks(learner, 60)
    finally:
        stop_process(learner)
    assert learner.returncode == 143, stderr[-3000:]
    assert "interrupted (SIGTERM)" in stderr
    progress = [line for line in stderr.splitlines() if line.startswith(f"DQN {TRIVIAL_ENV}:")]
    assert progress and "\r" not in stderr and all("steps/s (last 10 s)" in line for line in progress), stderr[-3000:]
    wait_until(lambda: not processes_with_marker(marker) and not any(map(alive, children)), 10, interval=0.1,
               message=lambda: f"the learner's processes to exit after SIGTERM: {processes_with_marker(marker)}")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["updates"] > 0, summary
    checkpoint = load_checkpoint(run / "checkpoint.safetensors")
    assert checkpoint.counters["env_steps"] == summary["env_steps"]
    assert checkpoint.counters["train_steps"] == summary["updates"]

    # a replay that cannot fill in 10 s: no train step, so the resumed networks must be the checkpoint's, bit for
    # bit (10 s, not less: on a loaded machine the actors may take seconds to start); --seconds counts the run's
    # sessions together, so 10 s more than the first one's
    seconds = str(math.ceil(checkpoint.counters["seconds"]) + 10)
    resumed = run_rqrl("train", "dqn", "--resume", str(run), "--env", TRIVIAL_ENV, "--seconds", seconds,
                       "--minimum-buffer-size", "200000", "--replay-capacity", "200000", "--target-return", "1000",
                       timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "the replay starts empty" in resumed.stderr
    after = json.loads((run / "summary.json").read_text())
    assert after["env_steps"] > summary["env_steps"] and after["episodes"] > summary["episodes"], (summary, after)
    assert after["updates"] == summary["updates"] and not after["interrupted"]
    final, _ = load_weights(run / "final.safetensors")
    resumed_checkpoint = load_checkpoint(run / "checkpoint.safetensors")
    for name, value in final.items():
        assert torch.equal(value, checkpoint.model[f"online.network.{name}"]), name
        target = f"target.network.{name}"
        assert torch.equal(resumed_checkpoint.model[target], checkpoint.model[target]), target
    # a row per learner state: env steps never go back, and a row repeats no earlier (env steps, train steps)
    states = [(int(row["env_steps"]), int(row["train_steps"])) for row in read_rows(run / "metrics.csv")]
    assert states == sorted(set(states)), f"metrics.csv went back in history after --resume: {states}"


def test_a_dqn_run_is_seen_by_status_and_health_and_ended_by_rqrl_stop(tmp_path, connection, redis_url):
    run = tmp_path / "dqn-stopped"
    command = [sys.executable, "-m", "rqrl", "train", "dqn", "--env", TRIVIAL_ENV, "--seconds", "600",
               "--minimum-buffer-size", "100", "--target-return", "1000", "--redis-url", redis_url,
               "--run-dir", str(tmp_path), "--run-name", "dqn-stopped", "--progress-seconds", "0.5"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)

    def trained_and_seen() -> bool:
        if learner.poll() is not None:
            return True
        if not trained(run):
            return False
        status = run_rqrl("status", "--run", "dqn-stopped", "--redis-url", redis_url)
        health = run_rqrl("health", "--run", "dqn-stopped", "--redis-url", redis_url)
        assert status.returncode == 0 and "dqn-stopped" in status.stdout, status.stdout + status.stderr
        assert health.returncode == 0 and "is alive" in health.stdout, health.stdout + health.stderr
        return True

    stop, stdout, stderr = stop_from_outside(learner, "dqn-stopped", redis_url, trained_and_seen,
                                             "training to start, seen by rqrl status and health")
    assert stop.returncode == 0 and "stopped by its learner" in stop.stdout, stop.stdout + stop.stderr
    assert learner.returncode == 0, stderr[-3000:]
    assert "stopped by rqrl stop" in stderr, stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] and summary["stopped_by"] == "rqrl stop" and summary["updates"] > 0, summary
    assert load_checkpoint(run / "checkpoint.safetensors").counters["env_steps"] == summary["env_steps"]
    assert connection.keys("rqrl:dqn-stopped:*") == []
