"""`rqrl dashboard` seen in a real headless Chromium (Debian's `chromium`): the queues, the workers with what
they run, and a failed job's traceback, as a person would see them while workers run; and markup planted in
Redis shown as text, with none of its script run. Screenshots of the pages are kept in test-artifacts/dashboard/
(RQRL_TEST_ARTIFACTS overrides the folder)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.results import Result
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


def render(url: str, screenshot: str | None = None) -> str:
    """The page's DOM once its scripts have loaded their data (headless Chromium); a screenshot goes to ARTIFACTS."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    if screenshot is not None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        subprocess.run([*flags, f"--screenshot={ARTIFACTS / screenshot}", "--window-size=1280,900", url],
                       capture_output=True, timeout=90, check=True)
    return subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True).stdout


def visible_text(dom: str) -> str:
    """The text a person reads in the body of ``dom``, before its row templates, whitespace collapsed."""
    body = dom[dom.find("<body"):]
    body = body[:body.find("<script")] if "<script" in body else body  # the page, not its row templates
    return html.unescape(" ".join(re.sub(r"<[^>]+>", " ", body).split()))


def browse(url: str, screenshot: str) -> str:
    """The page's text once its scripts have loaded their data; a screenshot goes to ARTIFACTS."""
    return visible_text(render(url, screenshot))


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


def payload(where: str) -> str:
    """Markup that, if a page ran it, would set the document's title to ``xss:WHERE`` (an image's onerror, and a
    script that jQuery's append would run)."""
    return (f"<img src=x alt=xss:{where}-img onerror=document.title=this.alt>"
            f"<script>document.title='xss:{where}-script'</script>")


MARKUP_ID = "<img src=x alt=xss:id onerror=document.title=this.alt>"
"""A job id RQ refuses to read (it allows letters, digits, _ and -), planted in the failed registry; no slash."""
JS_QUEUE = "q')}});document.title='xss:queue-js';$('x').on('y',function(){if(1){$(this).val('"
"""A queue name that closes the jobs page's `$(this).val('NAME')` and runs a statement of its own."""


def plant_markup(connection) -> Job:
    """Markup where Redis writers can put it: a queue name, a worker's name, a failed job's description,
    arguments, metadata, origin and traceback, and a job id in the failed registry whose hash RQ cannot read;
    the failed job is returned."""
    hostile_queue = payload("queue")
    for name in (hostile_queue, JS_QUEUE):
        connection.sadd("rq:queues", f"rq:queue:{name}")
    job = Job.create("os.system", args=(payload("args"),), id="markup-job", connection=connection,
                     serializer=JSONSerializer, origin="rqrl", description=payload("description"),
                     meta={"note": payload("meta")}, status=JobStatus.FAILED)
    job.save()  # the registry's add saves no meta
    failed_registry("rqrl", connection).add(job, ttl=3600)
    Result.create_failure(job, ttl=3600, exc_string=f"Traceback: {payload('traceback')}")
    elsewhere = Job.create("os.system", id="markup-origin", connection=connection, serializer=JSONSerializer,
                           origin=payload("origin"), status=JobStatus.FAILED)
    elsewhere.save()
    connection.hset(f"rq:job:{MARKUP_ID}", mapping={"data": "[]", "origin": "rqrl", "status": "failed"})
    connection.zadd("rq:failed:rqrl", {MARKUP_ID: 4_000_000_000})
    worker = Worker([hostile_queue], name=payload("worker"), connection=connection, serializer=JSONSerializer)
    worker.register_birth()
    worker.set_state("busy")
    worker.set_current_job_id(job.id)
    return job


SCREENSHOTS = {"view/jobs/rqrl/failed/8/asc/1": "markup-failed-jobs.png", "view/job/markup-job": "markup-job.png"}


def title(dom: str) -> str:
    """The document's title in ``dom``: a payload that ran changed it."""
    found = re.search(r"<title>(.*?)</title>", dom, re.DOTALL)
    return html.unescape(found.group(1)) if found else ""


@pytest.mark.filterwarnings("ignore:CLIENT SETNAME command not supported")  # RQ's Worker() that plants a name
def test_markup_planted_in_redis_shows_as_text_and_runs_no_script(redis_url, connection, tmp_path):
    job = plant_markup(connection)
    port = free_port()
    log_file = tmp_path / "dashboard.log"
    dashboard = start_dashboard(redis_url, port, log_file)
    base = f"http://127.0.0.1:{port}/0"
    pages = {  # page -> the planted text a person must see on it, literally
        "view/queues": [payload("queue"), JS_QUEUE],
        "view/workers": [payload("worker"), payload("queue"), job.get_call_string()],
        "view/jobs/rqrl/failed/8/asc/1": [payload("description"), "markup-job", f"Traceback: {payload('traceback')}",
                                          MARKUP_ID, "unreadable job"],
        "view/job/markup-job": [payload("description"), f"Traceback: {payload('traceback')}", payload("meta"),
                                "Origin queue : rqrl"],
        "view/job/markup-origin": [f"Origin queue : {payload('origin')}"],
        f"view/jobs/{quote(JS_QUEUE, safe='')}/failed/8/asc/1": [f"jobs on queue {JS_QUEUE}"],
    }
    try:
        get_json(f"{base}/data/queues.json", dashboard, log_file, timeout=60)
        problems = []
        for page, texts in pages.items():
            dom = render(f"{base}/{page}", SCREENSHOTS.get(page))
            if title(dom) != "RQ dashboard":
                problems.append(f"{page}: a planted script ran and set the title to {title(dom)!r}")
            shown = visible_text(dom)
            missing = [text for text in texts if text not in shown]
            if missing:
                problems.append(f"{page}: not shown as text: {missing}; the page shows: {shown}")
        assert not problems, "\n".join(problems)
    finally:
        stop_process(dashboard, timeout=15)


def answers(url: str) -> bool:
    """Whether a web server answers ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def serve_folder(folder: Path, port: int) -> subprocess.Popen:
    """A plain web server of ``folder`` on ``port``: another site, as far as the browser is concerned."""
    return subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                             str(folder)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_a_page_of_another_site_cannot_requeue_through_the_operators_browser(redis_url, connection, tmp_path):
    job = Job.create("os.system", args=("true",), id="csrf-target", connection=connection, serializer=JSONSerializer,
                     origin="rqrl", description="a failed job", status=JobStatus.FAILED)
    failed_registry("rqrl", connection).add(job, ttl=3600)
    port, other_port = free_port(), free_port()
    log_file = tmp_path / "dashboard.log"
    dashboard = start_dashboard(redis_url, port, log_file)
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(  # what a page the operator opens elsewhere could do: post on load
        f'<form id="f" method="post" action="http://127.0.0.1:{port}/requeue/rqrl"></form>'
        '<script>document.getElementById("f").submit()</script>')
    other = serve_folder(site, other_port)
    try:
        get_json(f"http://127.0.0.1:{port}/0/data/queues.json", dashboard, log_file, timeout=60)
        wait_until(lambda: answers(f"http://127.0.0.1:{other_port}/index.html"), timeout=20, message="the other site")
        shown = visible_text(render(f"http://127.0.0.1:{other_port}/index.html"))
        assert "rqrl dashboard refused POST /requeue/rqrl" in shown, shown
        assert failed_registry("rqrl", connection).get_job_ids() == [job.id], "nothing was requeued"
    finally:
        stop_process(other, timeout=5)
        stop_process(dashboard, timeout=15)
