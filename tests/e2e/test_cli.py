"""The `rqrl` command line as a user runs it."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from rqrl.algorithms.checkpoint import save_weights
from rqrl.algorithms.impala import ActorCritic
from tests.children import (
    REPO_ROOT,
    alive,
    communicate_or_show_stacks,
    descendants,
    free_port,
    get_json,
    processes_with_marker,
    run_rqrl,
    start_dashboard,
    stop_process,
    worker_env,
)
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)


def test_demo_collects_rollouts_with_an_embedded_redis_and_shows_progress():
    result = run_rqrl("demo", "--seconds", "3", "--actors", "4", "--progress-seconds", "1")
    assert result.returncode == 0, result.stderr
    # stderr is a pipe here, not a terminal: plain lines, never a redrawn bar
    progress = [line for line in result.stderr.splitlines() if "steps/s" in line]
    assert len(progress) >= 2, result.stderr
    assert "\r" not in result.stderr and all(len(line) < 300 for line in progress), result.stderr
    assert all("workers " in line and "queue " in line and "lag " in line for line in progress), progress
    assert "done:" in result.stdout


def test_demo_without_progress_prints_only_the_summary():
    result = run_rqrl("demo", "--seconds", "1", "--actors", "2", "--no-progress", "--progress-seconds", "0.1")
    assert result.returncode == 0, result.stderr
    assert "steps/s" not in result.stderr, result.stderr
    assert "done:" in result.stdout
    steps = int(result.stdout.split("done: ")[1].split(" env steps")[0].replace(",", ""))
    assert steps > 0


def test_demo_against_an_external_redis_with_an_external_worker(redis_url, connection, workers):
    workers.start("e2e-worker")
    workers.wait_registered(connection, 1)
    result = run_rqrl("demo", "--seconds", "2", "--actors", "2", "--workers", "0", "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    assert "0 local worker(s)" in result.stdout and "done:" in result.stdout


def test_missing_redis_server_says_how_to_get_one():
    result = run_rqrl("demo", "--seconds", "1", env=worker_env(RQRL_REDIS_SERVER="/nonexistent/redis-server"))
    assert result.returncode != 0
    assert "RQRL_REDIS_SERVER" in result.stderr


def test_worker_with_an_unreachable_redis_fails_clearly():
    result = run_rqrl("worker", "--redis-url", "redis://127.0.0.1:1/0", timeout=60)
    assert result.returncode != 0
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr


def test_worker_burst_exits_when_the_queue_is_empty(redis_url, connection):
    result = run_rqrl("worker", "--redis-url", redis_url, "--burst", timeout=60)
    assert result.returncode == 0, result.stderr


def listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


def test_dashboard_listens_on_localhost_opens_on_the_rqrl_queue_and_explains_gone_jobs(redis_url, connection,
                                                                                    tmp_path):
    port = free_port()
    log_file = tmp_path / "dashboard.log"
    dashboard = start_dashboard(redis_url, port, log_file)
    base = f"http://127.0.0.1:{port}"
    try:
        get_json(f"{base}/0/data/queues.json", dashboard, log_file, timeout=60)
        assert listening_addresses(port) == ["0100007F"], "listens on 127.0.0.1 only"
        with urllib.request.urlopen(f"{base}/0/view/jobs", timeout=10) as reply:
            page = reply.read().decode()
        assert 'id="select-queue" title="Queue name" value="rqrl"' in page
        assert 'id="empty-btn"' not in page, "delete buttons are off unless --delete"
        for path in ("/0/view/job/rqrl_gone_g0_r7", "/0/data/job/rqrl_gone_g0_r7.json"):
            with pytest.raises(urllib.error.HTTPError) as refusal:
                urllib.request.urlopen(base + path, timeout=10)
            assert refusal.value.code == 404, path
            assert "is no longer in Redis" in refusal.value.read().decode(), path
    finally:
        stop_process(dashboard)


def test_sigterm_to_demo_stops_it_cleanly_with_its_summary():
    marker = uuid.uuid4().hex
    demo = subprocess.Popen([sys.executable, "-m", "rqrl", "demo", "--seconds", "120", "--actors", "2", "--workers",
                             "1", "--progress-seconds", "0.5"], cwd=REPO_ROOT, env=worker_env(RQRL_TEST_MARKER=marker),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: demo.poll() is None and len(descendants(demo.pid)) >= 2, 60, interval=0.2,
                   message="the demo's redis-server and worker")
        children = descendants(demo.pid)
        wait_until(lambda: demo.poll() is not None or "steps/s" in (demo.stderr.readline() or ""), 60,
                   message="a progress line")
        demo.send_signal(signal.SIGTERM)
        stdout, stderr = communicate_or_show_stacks(demo, 60)
    finally:
        stop_process(demo)
    assert demo.returncode == 143, stderr[-3000:]
    assert "interrupted (SIGTERM):" in stdout and "Traceback" not in stderr, stdout + stderr[-3000:]
    wait_until(lambda: not processes_with_marker(marker) and not any(map(alive, children)), 10, interval=0.1,
               message="the demo's processes to exit")


def test_evaluate_video_writes_an_mp4_of_each_greedy_episode(tmp_path):
    missing = [name for name in ("moviepy", "pygame") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install 'rqrl[video]'")
    save_weights(tmp_path / "final.safetensors", ActorCritic(4, 2, 16).state_dict(),
                 {"env_id": "CartPole-v1", "hidden_size": 16, "env_steps": 640, "updates": 10, "mean_return": 9.0})
    result = run_rqrl("evaluate", str(tmp_path), "--episodes", "2", "--video", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"weights: {tmp_path / 'final.safetensors'} (640 env steps, updates 10" in result.stdout, result.stdout
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 2, result.stdout + result.stderr[-2000:]
    for video in videos:
        data = video.read_bytes()
        assert len(data) > 1000 and data[4:8] == b"ftyp", video  # an ISO media file, with frames in it
    assert f"videos: {tmp_path / 'videos'} (2 mp4 file(s))" in result.stdout
