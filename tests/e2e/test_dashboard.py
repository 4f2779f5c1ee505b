"""`rqrl dashboard` seen in a real headless Chromium (Debian's `chromium`): the queues, the workers with what
they run, and a failed job's traceback, as a person would see them while workers run. Screenshots of each
page are kept in test-artifacts/dashboard/ (RQRL_TEST_ARTIFACTS overrides the folder)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from rqrl.engine.rq_safety import failed_registry
from tests.children import REPO_ROOT, free_port, get_json, start_dashboard, stop_process, worker_env
from tests.polling import wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(CHROMIUM is None, reason="no headless browser: Debian's chromium is not installed "
                                                "(apt-get install chromium); .ci/run installs it where it can"),
]
ARTIFACTS = Path(os.environ.get("RQRL_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts")) / "dashboard"


def browse(url: str, screenshot: str) -> str:
    """The page's text once its scripts have loaded their data (headless Chromium); a screenshot goes to ARTIFACTS."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    subprocess.run([*flags, f"--screenshot={ARTIFACTS / screenshot}", "--window-size=1280,900", url],
                   capture_output=True, timeout=90, check=True)
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True).stdout
    body = dom[dom.find("<body"):]
    body = body[:body.find("<script")] if "<script" in body else body  # the page, not its row templates
    return " ".join(re.sub(r"<[^>]+>", " ", body).split())


def test_a_browser_shows_queues_busy_workers_and_a_failed_jobs_traceback(redis_url, connection, workers, tmp_path):
    workers.start("steady")
    workers.wait_registered(connection, 1)
    # a job no learner enqueues: the worker refuses it, and it lands in the failed registry with its traceback
    hostile = Queue("rqrl", connection=connection, serializer=JSONSerializer).enqueue("os.system", "true",
                                                                                     job_id="hostile-job")
    demo = subprocess.Popen([sys.executable, "-m", "rqrl", "demo", "--redis-url", redis_url, "--workers", "0",
                             "--seconds", "90", "--actors", "2"], cwd=REPO_ROOT, env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    log_file = tmp_path / "dashboard.log"
    dashboard = start_dashboard(redis_url, port, log_file)
    base = f"http://127.0.0.1:{port}/0"
    try:
        get_json(f"{base}/data/queues.json", dashboard, log_file, timeout=60)
        wait_until(lambda: hostile.id in failed_registry("rqrl", connection).get_job_ids(), 60,
                   message="the hostile job to fail")
        wait_until(lambda: (connection.hget("rq:worker:steady", "current_job") or b"").startswith(b"rqrl_"), 60,
                   message="the worker to run the demo's actors")

        queues = browse(f"{base}/view/queues", "queues.png")
        assert re.search(r"\brqrl \d+ \d+ \d+ \d+ \d+ 1 \d+\b", queues), queues  # the rqrl row: 1 failed job

        shown = []

        def busy_worker_shown() -> bool:
            shown.append(browse(f"{base}/view/workers", "workers.png"))
            return "steady" in shown[-1] and "rqrl.maze.jobs.run_actor_group(" in shown[-1]

        wait_until(busy_worker_shown, 60, interval=0.5, message=lambda: f"the busy worker on the page: {shown[-1:]}")

        failed = browse(f"{base}/view/jobs/rqrl/failed/8/asc/1", "failed-jobs.png")
        assert "hostile-job" in failed and "os.system('true')" in failed, failed
        job = browse(f"{base}/view/job/hostile-job", "failed-job.png")
        assert "Status : failed" in job and "ForbiddenJobError" in job and "Traceback" in job, job
    finally:
        for process in (dashboard, demo):
            stop_process(process, timeout=15)
    assert all((ARTIFACTS / name).stat().st_size > 0
               for name in ("queues.png", "workers.png", "failed-jobs.png", "failed-job.png"))
