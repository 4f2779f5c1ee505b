"""`rqrl train` and `rqrl evaluate` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from rqrl.algorithms.checkpoint import load_checkpoint
from tests.children import (
    REPO_ROOT,
    _command_line,
    alive,
    communicate_or_show_stacks,
    descendants,
    free_port,
    processes_with_marker,
    run_rqrl,
    stop_from_outside,
    stop_process,
    worker_env,
)
from tests.polling import wait_until
from tests.redis_servers import RedisServer
from tests.run_files import PNG_SIGNATURE, read_rows, tensorboard_scalars

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
                  "--run-name", "trivial", "--seed", "1", "--eval-every", "0.2", "--eval-episodes", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    # the embedded Redis is named, so `rqrl status` and `rqrl stop` can reach it from another shell
    assert "run trivial on Redis unix://" in result.stderr and "rqrl status --redis-url unix://" in result.stderr
    run = tmp_path / "trivial"
    for name in ("final.safetensors", "best.safetensors", "checkpoint.safetensors", "metrics.csv", "config.json",
                 "summary.json", "learning_curve.png"):
        assert (run / name).is_file(), name
    assert any((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "learning_curve.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = read_rows(run / "metrics.csv")
    assert rows and {"env_steps", "mean_return", "policy_lag_mean", "queue_size"} <= set(rows[0])
    seconds = json.loads((run / "summary.json").read_text())["seconds"]
    assert len(rows) <= seconds + 2, f"{len(rows)} rows in {seconds:.1f} s: more than one a second"
    evaluated = [float(row["eval_return"]) for row in rows if row["eval_return"]]  # --eval-every 0.2
    assert evaluated and all(0 <= value <= 20 for value in evaluated), evaluated
    # windowed throughput, lag range, workers, rejected records and learner timings, in the CSV and TensorBoard
    windowed = {"steps_per_second_10s", "policy_lag_min", "workers_alive", "records_rejected", "dequeue_seconds",
                "update_seconds"}
    assert windowed <= set(rows[0])
    assert float(rows[-1]["workers_alive"]) == 2 and float(rows[-1]["steps_per_second_10s"]) > 0
    assert {f"charts/{name}" for name in windowed} | {"charts/eval_return"} <= {tag for _, tag, _ in
                                                                               tensorboard_scalars(run)}
    summary = json.loads((run / "summary.json").read_text())
    random_policy_return = 10.0  # 20 coin flips
    assert summary["mean_return"] > random_policy_return + 5, summary
    assert summary["bottleneck"] in ("workers", "learner", "balanced"), summary
    assert summary["bottleneck_detail"] in result.stdout and "waited for rollouts" in result.stdout, result.stdout
    # stderr is a pipe: plain progress lines (one at the start, every 10 s, one at the end), never a redrawn bar
    progress = [line for line in result.stderr.splitlines() if line.startswith(f"IMPALA {TRIVIAL_ENV}:")]
    assert progress and "\r" not in result.stderr, result.stderr[-3000:]
    assert all("steps/s (last 10 s)" in line and "lag" in line and "queue" in line and "workers" in line
               for line in progress), progress
    evaluation = rqrl("evaluate", str(run), "--episodes", "5")
    assert evaluation.returncode == 0, evaluation.stderr
    [result_line] = [line for line in evaluation.stdout.splitlines() if "episodes, return " in line]
    mean = float(result_line.split("episodes, return ")[1].split(" ")[0])
    assert mean > random_policy_return + 5


def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_resume_continues(tmp_path):
    command = [sys.executable, "-m", "rqrl", "train", "--env", TRIVIAL_ENV, "--total-env-steps", "100000000",
               "--target-return", "1000", "--n-actors", "2", "--batch-size", "2", "--workers", "2",
               "--run-dir", str(tmp_path), "--run-name", "interrupted"]
    marker = uuid.uuid4().hex
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    run = tmp_path / "interrupted"
    wait_until(lambda: rows_written(run, learner) >= 5, 120, interval=0.2, message="5 rows of metrics.csv")
    children = descendants(learner.pid)
    assert len(children) >= 3, "expected local workers and a redis-server under the learner"
    os.killpg(learner.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    stdout, stderr = communicate_or_show_stacks(learner, 60)
    assert learner.returncode == 130, stderr[-3000:]
    assert "interrupted" in stdout and "Traceback" not in stderr, stderr[-3000:]
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
    # the (part of a) batch the learner had popped, and the next one if it was popped ahead (RunOptions.pop_ahead)
    held = connection.llen("rqrl:killed:unacknowledged")
    assert held <= 4
    steps_before = int(read_rows(run / "metrics.csv")[-1]["env_steps"])

    resumed = rqrl("train", "--resume", str(run), *common, "--total-env-steps", str(steps_before + 4000))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (f"re-delivering {held} rollout(s)" in resumed.stderr) == (held > 0), resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= steps_before + 4000
    env_steps = [int(row["env_steps"]) for row in read_rows(run / "metrics.csv")]
    assert env_steps == sorted(set(env_steps)), "metrics.csv went back in history after --resume"
    assert worker.poll() is None, "the worker noticed the learner's death"
    assert connection.keys("rqrl:killed:*") == [], "the resumed learner's stop() cleans the run up"


PPO_ARGUMENTS = ("ppo", "--env", TRIVIAL_ENV, "--n-workers", "4", "--num-samples", "400",
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


def test_a_ppo_run_resumes_as_ppo_with_its_recorded_settings(tmp_path):
    first = rqrl("train", *PPO_ARGUMENTS, "--total-env-steps", "800", "--run-dir", str(tmp_path), "--run-name", "p")
    assert first.returncode == 0, first.stderr[-3000:]
    steps = json.loads((tmp_path / "p" / "summary.json").read_text())["env_steps"]
    # neither the algorithm nor its settings repeated: config.json has them
    resumed = rqrl("train", "--resume", str(tmp_path / "p"), "--total-env-steps", "1600")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming with --total-env-steps 1600 (recorded: 800)" in resumed.stderr
    assert "run p on Redis unix://" in resumed.stderr
    assert "PPO" in resumed.stderr  # the PPO learner's progress, not IMPALA's
    recorded = json.loads((tmp_path / "p" / "config.json").read_text())
    assert recorded["algo"] == "ppo" and recorded["env_id"] == TRIVIAL_ENV and recorded["num_samples"] == 400
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["env_steps"] >= 1600 and summary["updates"] > 2 and steps >= 800
    assert int(float(read_rows(tmp_path / "p" / "metrics.csv")[-1]["env_steps"])) == summary["env_steps"]


def test_sigterm_to_a_ppo_learner_stops_like_ctrl_c_and_progress_is_plain_lines(tmp_path):
    marker = uuid.uuid4().hex
    command = [sys.executable, "-m", "rqrl", "train", *PPO_ARGUMENTS, "--total-env-steps", "100000000",
               "--target-return", "1000", "--checkpoint-seconds", "0.5", "--progress-seconds", "0.5",
               "--run-dir", str(tmp_path), "--run-name", "ppo-terminated"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "ppo-terminated"
    try:
        wait_until(lambda: rows_written(run, learner) >= 3, 120, interval=0.2, message="2 rows of metrics.csv")
        children = descendants(learner.pid)
        learner.send_signal(signal.SIGTERM)  # only the learner, as `docker compose stop` sends it
        stdout, stderr = communicate_or_show_stacks(learner, 60)
    finally:
        stop_process(learner)
    assert learner.returncode == 143, stderr[-3000:]
    assert "interrupted (SIGTERM)" in stderr, stderr[-3000:]
    wait_until(lambda: not processes_with_marker(marker) and not any(map(alive, children)), 10, interval=0.1,
               message=lambda: f"the learner's processes to exit after SIGTERM: {processes_with_marker(marker)}")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] and summary["stopped_by"] == "SIGTERM", summary
    assert load_checkpoint(run / "checkpoint.safetensors").counters["env_steps"] == summary["env_steps"]
    progress = [line for line in stderr.splitlines() if line.startswith(f"PPO {TRIVIAL_ENV}:")]
    assert progress and "\r" not in stderr and all("steps/s (last 10 s)" in line for line in progress), stderr[-3000:]


def test_sigterm_to_a_ppo_learner_whose_redis_is_gone_exits_within_seconds_with_its_checkpoint(tmp_path):
    """Redis crashed under a run and the learner is told to stop: its sampling call in flight (sample-ahead) and
    its tear-down ride out the outage for 3 s, not 60 s each (before: the 45 s watchdog cut the clean-up short)."""
    server = RedisServer(tmp_path, tcp=True).start()
    marker = uuid.uuid4().hex
    command = [sys.executable, "-m", "rqrl", "train", *PPO_ARGUMENTS, "--total-env-steps", "100000000",
               "--target-return", "1000", "--checkpoint-seconds", "0.5", "--run-dir", str(tmp_path / "runs"),
               "--run-name", "ppo-orphaned", "--redis-url", server.url, "--no-progress"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "runs" / "ppo-orphaned"
    try:
        wait_until(lambda: rows_written(run, learner) >= 3, 120, interval=0.2, message="2 rows of metrics.csv")
        server.kill()
        time.sleep(2.0)  # the learner and its sampler ride out the outage now
        learner.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        stdout, stderr = communicate_or_show_stacks(learner, 60)
        exited_after = time.monotonic() - signalled
    finally:
        stop_process(learner)
        server.stop()
    assert learner.returncode == 143, stderr[-3000:]
    assert exited_after < 25, f"exited {exited_after:.1f} s after SIGTERM: {stderr[-3000:]}"
    assert "did not finish within" not in stderr, "the watchdog cut the clean-up short"
    assert "`rqrl stop ppo-orphaned --redis-url URL` deletes them" in stderr, stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM", summary
    assert load_checkpoint(run / "checkpoint.safetensors").counters["env_steps"] == summary["env_steps"]

def test_rqrl_stop_ends_a_ppo_run(tmp_path, connection, redis_url):
    command = [sys.executable, "-m", "rqrl", "train", *PPO_ARGUMENTS, "--total-env-steps", "100000000",
               "--target-return", "1000", "--redis-url", redis_url, "--run-dir", str(tmp_path),
               "--run-name", "ppo-stopped"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    run = tmp_path / "ppo-stopped"
    stop, stdout, stderr = stop_from_outside(learner, "ppo-stopped", redis_url,
                                             lambda: rows_written(run, learner) >= 3, "2 rows of metrics.csv")
    assert stop.returncode == 0 and "stopped by its learner" in stop.stdout, stop.stdout + stop.stderr
    assert learner.returncode == 0, stderr[-3000:]
    assert "stopped from outside this sampler (rqrl stop)" in stderr, stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] and summary["stopped_by"] == "rqrl stop", summary
    assert load_checkpoint(run / "checkpoint.safetensors").counters["env_steps"] == summary["env_steps"]
    assert connection.keys("rqrl:ppo-stopped:*") == []


def embedded_redis_url(learner: subprocess.Popen) -> str | None:
    """The URL of ``learner``'s own redis-server (its Unix socket), once it runs."""
    for pid in descendants(learner.pid):
        words = _command_line(pid).split()
        if words and words[0].endswith("redis-server") and len(words) > 1 and words[1].startswith("unixsocket:"):
            return f"unix://{words[1].removeprefix('unixsocket:')}?db=0"
    return None


def test_rqrl_stop_ends_a_run_on_the_learners_own_redis(tmp_path):
    """The learner shuts its embedded Redis down as it stops: `rqrl stop` says the run stopped, and exits 0."""
    command = [sys.executable, "-m", "rqrl", "train", "--env", TRIVIAL_ENV, "--n-actors", "2", "--batch-size", "2",
               "--n-rollout-steps", "20", "--workers", "1", "--run-dir", str(tmp_path), "--run-name", "embedded",
               "--target-return", "1000", "--total-env-steps", "100000000"]
    learner = subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    run = tmp_path / "embedded"
    try:
        wait_until(lambda: rows_written(run, learner) >= 2, 120, interval=0.2, message="2 rows of metrics.csv")
        url = embedded_redis_url(learner)
        assert url is not None, "no redis-server among the learner's processes"
    except BaseException:
        stop_process(learner)
        raise
    stop, _, stderr = stop_from_outside(learner, "embedded", url, lambda: True, "nothing")
    assert stop.returncode == 0 and "run embedded: stopped" in stop.stdout, stop.stdout + stop.stderr
    assert learner.returncode == 0, stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "rqrl stop", summary


def start_learner(tmp_path, redis_url: str, run_name: str, *extra: str) -> subprocess.Popen:
    """`rqrl train` on ``redis_url`` with external workers only, until stopped."""
    command = [sys.executable, "-m", "rqrl", "train", "--env", TRIVIAL_ENV, "--n-actors", "2", "--batch-size", "2",
               "--n-rollout-steps", "20", "--workers", "0", "--redis-url", redis_url, "--run-dir", str(tmp_path),
               "--run-name", run_name, "--target-return", "1000", "--total-env-steps", "100000000", *extra]
    return subprocess.Popen(command, cwd=REPO_ROOT, env=worker_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_jobs(connection, run_name: str) -> list[bytes]:
    """RQ job hashes of a run still in Redis."""
    return connection.keys(f"rq:job:rqrl_{run_name}_*")


def test_sigterm_to_the_learner_stops_like_ctrl_c(tmp_path, connection, redis_url, workers):
    worker = workers.start("steady")
    workers.wait_registered(connection, 1)
    learner = start_learner(tmp_path, redis_url, "terminated", "--checkpoint-seconds", "1000")
    run = tmp_path / "terminated"
    try:
        wait_until(lambda: rows_written(run, learner) >= 5, 120, interval=0.2, message="5 rows of metrics.csv")
        assert not (run / "checkpoint.safetensors").exists(), "no checkpoint before the stop (--checkpoint-seconds)"
        statuses: list[str] = []

        def shows_the_worker_busy() -> bool:
            """Two groups share the one worker, each job yielding to the other every second: a status taken
            between two jobs shows the worker idle and both queued, so look again."""
            status = rqrl("status", "--redis-url", redis_url, timeout=60)
            assert status.returncode == 0, status.stderr
            statuses.append(status.stdout)
            return "steady  busy  group " in status.stdout

        wait_until(shows_the_worker_busy, 30, interval=0.5, message=lambda: f"a busy worker in {statuses[-1]}")
        assert "run terminated: queue rqrl, 2 actors" in statuses[-1], statuses[-1]
        assert "learner   alive, heartbeat" in statuses[-1] and "steps/s (10 s)" in statuses[-1], statuses[-1]
        assert "1 alive of 1 registered" in statuses[-1], statuses[-1]
        learner.send_signal(signal.SIGTERM)  # what `docker compose stop` sends to the container's process
        stdout, stderr = communicate_or_show_stacks(learner, 60)
    finally:
        stop_process(learner)
    assert learner.returncode == 143, stderr[-3000:]
    assert "interrupted (SIGTERM)" in stdout, stdout + stderr[-3000:]
    assert (run / "checkpoint.safetensors").is_file() and (run / "final.safetensors").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] and summary["stopped_by"] == "SIGTERM"
    assert connection.keys("rqrl:terminated:*") == [] and run_jobs(connection, "terminated") == []
    assert worker.poll() is None, "the external worker outlives the learner"
    assert rqrl("status", "--redis-url", redis_url, timeout=60).stdout.strip() == "no rqrl runs on this Redis"
    wait_until(lambda: connection.hget("rq:worker:steady", "state") == b"idle", 15,
               message="the worker to be idle again")


@pytest.mark.slow  # about 25 s
def test_rqrl_stop_ends_a_run_from_anywhere(tmp_path, connection, redis_url, workers):
    workers.start("steady")
    workers.wait_registered(connection, 1)
    learner = start_learner(tmp_path, redis_url, "stopped")
    run = tmp_path / "stopped"
    stop, stdout, stderr = stop_from_outside(learner, "stopped", redis_url,
                                             lambda: rows_written(run, learner) >= 5, "5 rows of metrics.csv")
    assert stop.returncode == 0, stop.stderr
    assert "stopped by its learner" in stop.stdout, stop.stdout
    assert learner.returncode == 0, stderr[-3000:]
    assert "interrupted (rqrl stop)" in stdout, stdout
    assert json.loads((run / "summary.json").read_text())["stopped_by"] == "rqrl stop"
    assert connection.keys("rqrl:stopped:*") == []


def test_a_run_whose_learner_died_frees_its_workers_and_rqrl_stop_cleans_it_up(tmp_path, connection, redis_url,
                                                                                 workers):
    workers.start("steady")
    workers.wait_registered(connection, 1)
    learner = start_learner(tmp_path, redis_url, "orphaned", "--learner-timeout", "2")
    run = tmp_path / "orphaned"
    try:
        wait_until(lambda: rows_written(run, learner) >= 3, 120, interval=0.2, message="3 rows of metrics.csv")
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=10)
    finally:
        stop_process(learner)
    assert connection.exists("rqrl:orphaned:config")
    # the job sees the learner's deadline pass (2 s) and ends; the worker is free for other runs
    wait_until(lambda: connection.hget("rq:worker:steady", "state") == b"idle"
               and not connection.zcard("rq:wip:rqrl"), 30, interval=0.2,
               message="the worker to drop the orphaned run's job")
    stop = rqrl("stop", "orphaned", "--redis-url", redis_url, timeout=90)
    assert stop.returncode == 0, stop.stderr
    assert "no live learner" in stop.stdout
    # all but the stop flag, kept a day so a learner that only looked dead stops instead of storing the run again
    assert connection.keys("rqrl:orphaned:*") == [b"rqrl:orphaned:stopped"] and run_jobs(connection, "orphaned") == []
    assert 0 < connection.ttl("rqrl:orphaned:stopped") <= 24 * 3600


def test_sigterm_to_a_busy_worker_hands_its_job_back_within_seconds(tmp_path, connection, redis_url, workers):
    leaving = workers.start("leaving")
    staying = workers.start("staying")
    workers.wait_registered(connection, 2)
    # one actor group, so one job: a 60 s slice that never yields unless the worker is asked to stop
    learner = start_learner(tmp_path, redis_url, "handover", "--actors-per-job", "2")
    run = tmp_path / "handover"
    try:
        wait_until(lambda: rows_written(run, learner) >= 5, 120, interval=0.2, message="5 rows of metrics.csv")
        busy = wait_until(lambda: [name for name in ("leaving", "staying")
                                   if connection.hget(f"rq:worker:{name}", "state") == b"busy"], 30,
                          message="a busy worker")
        assert len(busy) == 1
        process = leaving if busy[0] == "leaving" else staying
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        exit_seconds = time.monotonic() - sent
        assert process.returncode == 0
        assert exit_seconds < 15, f"the worker took {exit_seconds:.1f} s to exit (compose's grace is 30 s)"
        rows_then = rows_written(run, learner)
        wait_until(lambda: rows_written(run, learner) >= rows_then + 10, 60, interval=0.2,
                   message="training to go on on the other worker")
        learner.send_signal(signal.SIGTERM)
        stdout, stderr = communicate_or_show_stacks(learner, 60)
    finally:
        stop_process(learner)
    assert learner.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr and "lost its job" not in stderr, stderr[-3000:]
    env_steps = [int(row["env_steps"]) for row in read_rows(run / "metrics.csv")]
    assert env_steps == sorted(env_steps)


def test_a_resumed_learner_re_runs_the_groups_its_dead_predecessors_workers_dropped(tmp_path, connection, redis_url,
                                                                                     workers):
    workers.start("steady")
    workers.wait_registered(connection, 1)
    learner = start_learner(tmp_path, redis_url, "revived", "--learner-timeout", "2", "--checkpoint-seconds", "0.5")
    run = tmp_path / "revived"
    try:
        wait_until(lambda: (run / "checkpoint.safetensors").is_file() and rows_written(run, learner) >= 3, 120,
                   interval=0.2, message="a checkpoint and 3 rows of metrics.csv")
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=10)
    finally:
        stop_process(learner)
    wait_until(lambda: connection.hget("rq:worker:steady", "state") == b"idle" and not connection.zcard("rq:wip:rqrl"),
               30, interval=0.2, message="the worker to drop the orphaned run's job")
    steps_before = int(read_rows(run / "metrics.csv")[-1]["env_steps"])
    resumed = rqrl("train", "--resume", str(run), "--env", TRIVIAL_ENV, "--n-actors", "2", "--batch-size", "2",
                   "--n-rollout-steps", "20", "--workers", "0", "--redis-url", redis_url, "--run-dir", str(tmp_path),
                   "--run-name", "revived", "--target-return", "1000", "--total-env-steps", str(steps_before + 2000))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= steps_before + 2000
    assert connection.keys("rqrl:revived:*") == []


@pytest.mark.parametrize("algorithm", [(), ("ppo",), ("dqn",)], ids=["impala", "ppo", "dqn"])
def test_a_launch_against_a_redis_where_nothing_answers_fails_fast_and_leaves_no_run_folder(tmp_path, algorithm):
    started = time.monotonic()
    result = rqrl("train", *algorithm, "--env", TRIVIAL_ENV, "--redis-url", f"redis://127.0.0.1:{free_port()}/0",
                  "--run-dir", str(tmp_path), "--run-name", "failed", timeout=60)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "nothing answers at Redis" in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert time.monotonic() - started < 30, "the launch waited for the outage window"
    assert not (tmp_path / "failed").exists(), "a launch that never started left a run folder"


def test_a_recorded_config_json_repeats_the_run_in_a_new_folder(tmp_path):
    first = rqrl("train", "--env", TRIVIAL_ENV, "--total-env-steps", "1500", "--n-actors", "2", "--batch-size", "2",
                 "--n-rollout-steps", "10", "--hidden-size", "16", "--workers", "1", "--learning-rate", "0.002",
                 "--run-dir", str(tmp_path), "--run-name", "original")
    assert first.returncode == 0, first.stderr[-3000:]
    recorded = json.loads((tmp_path / "original" / "config.json").read_text())
    again = rqrl("train", "--config", str(tmp_path / "original" / "config.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "its run_name 'original' is not taken" in again.stderr
    (repeated,) = [path for path in tmp_path.iterdir() if path.name != "original"]
    assert json.loads((repeated / "config.json").read_text()) == {**recorded, "run_name": repeated.name}
    assert json.loads((repeated / "summary.json").read_text())["env_steps"] >= 1500
    assert json.loads((tmp_path / "original" / "summary.json").read_text())["env_steps"] < 3000, "left alone"
