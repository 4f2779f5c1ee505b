"""rqrl/cli/dashboard.py through Flask's test client on a real Redis: a failed job that RQ cannot read is
listed as unreadable beside the good ones (rq-dashboard answered 500 for the whole list), its page and data
say why, and every response carries the script policy whose nonce the page's one inline script holds."""

from __future__ import annotations

import re

import pytest
import rq_dashboard.cli
import rq_dashboard.web
from rq.job import Job, JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from rqrl.cli.dashboard import secure_rq_dashboard
from rqrl.engine.rq_safety import failed_registry

QUEUE = "rqrl"
LATER = 4_000_000_000  # a registry score (2096): the bad job sorts after the good one
REQUIRED_FIELDS = {"data": '["os.system", null, ["true"], {}]', "origin": QUEUE, "status": "failed"}


@pytest.fixture
def client(redis_url, connection):
    """A test client of rq-dashboard's app as `rqrl dashboard` runs it (JSON serializer, rqrl's classes)."""
    secure_rq_dashboard(rq_dashboard.web)
    app = rq_dashboard.cli.make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = redis_url
    rq_dashboard.web.config.serializer = JSONSerializer  # what `rqrl dashboard` asks for with --json
    rq_dashboard.web.setup_rq_connection(app)
    return app.test_client()


def plant_good_job(connection, job_id: str = "good-job") -> Job:
    """A failed job as RQ writes one, with its traceback, in the failed registry of QUEUE."""
    job = Job.create("os.system", args=("true",), id=job_id, connection=connection, serializer=JSONSerializer,
                     origin=QUEUE, description="a good job", status=JobStatus.FAILED)
    failed_registry(QUEUE, connection).add(job, ttl=3600)
    Result.create_failure(job, ttl=3600, exc_string="Traceback: ForbiddenJobError")
    return job


def hash_with(**fields: str | bytes):
    """A planter of a job hash with RQ's required fields, ``fields`` among them."""
    return lambda connection, key: connection.hset(key, mapping={**REQUIRED_FIELDS, **fields})


def results_not_a_stream(connection, key: str) -> None:
    """A readable job hash whose results key (RQ reads a stream there) is a string."""
    hash_with()(connection, key)
    connection.set(key.replace(":job:", ":results:"), "junk")


MALFORMED = {  # what a Redis writer can leave at rq:job:ID -> how it plants it
    "a hash that is gone": lambda connection, key: None,
    "a string, not a hash": lambda connection, key: connection.set(key, "junk"),
    "a list, not a hash": lambda connection, key: connection.rpush(key, "junk"),
    "a hash without data": lambda connection, key: connection.hset(key, "origin", QUEUE),
    "a date that is not one": hash_with(created_at="yesterday"),
    "a status RQ does not know": hash_with(status="<b>weird</b>"),
    "a timeout that is not a number": hash_with(timeout="soon"),
    "a failure_ttl that is not a number": hash_with(failure_ttl="x"),
    "dependency ids that are not JSON": hash_with(dependency_ids="[1"),
    "a description that is not UTF-8": hash_with(description=b"\xff\xfe"),
    "results that are not a stream": results_not_a_stream,
}


@pytest.mark.parametrize("job_id", ["bad-job", "id RQ refuses!"])
@pytest.mark.parametrize("malformed", list(MALFORMED))
def test_a_malformed_failed_job_is_listed_as_unreadable_beside_the_good_one(client, connection, malformed,
                                                                             job_id):
    plant_good_job(connection)
    MALFORMED[malformed](connection, f"rq:job:{job_id}")
    connection.zadd(f"rq:failed:{QUEUE}", {job_id: LATER})

    reply = client.get(f"/0/data/jobs/{QUEUE}/failed/8/asc/1.json")

    assert reply.status_code == 200, reply.text
    good, bad = reply.json["jobs"]
    assert (good["id"], good["description"], good["exc_info"]) == ("good-job", "a good job",
                                                                   "Traceback: ForbiddenJobError")
    assert bad["id"] == job_id and bad["description"].startswith("unreadable job: "), bad
    assert bad["exc_info"] is None, "no Requeue button for a job RQ cannot read"


@pytest.mark.parametrize("malformed", [name for name in MALFORMED if name != "a hash that is gone"])
def test_an_unreadable_jobs_page_says_so_and_its_data_shows_it_as_unreadable(client, connection, malformed):
    MALFORMED[malformed](connection, "rq:job:bad-job")

    page = client.get("/0/view/job/bad-job")
    data = client.get("/0/data/job/bad-job.json")

    assert page.status_code in (200, 422), page.text  # 422 where RQ cannot fetch it at all
    if page.status_code == 422:
        assert "job bad-job is unreadable (" in page.text and "HGETALL rq:job:bad-job" in page.text, page.text
    assert data.status_code == 200, data.text
    assert data.json["status"] == "unreadable" and data.json["description"].startswith("unreadable job: ")


def test_an_unreadable_jobs_page_escapes_what_it_quotes(client, connection):
    connection.hset("rq:job:bad-job", mapping={**REQUIRED_FIELDS, "status": "<script>alert(1)</script>"})

    page = client.get("/0/view/job/bad-job")

    assert page.status_code == 422
    assert "<script>" not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text, page.text


def test_a_gone_job_still_answers_404(client, connection):
    for path in ("/0/view/job/gone-job", "/0/data/job/gone-job.json"):
        reply = client.get(path)
        assert reply.status_code == 404 and "is no longer in Redis" in reply.text, (path, reply.text)


def script_policy(reply) -> dict[str, str]:
    """The directives of the reply's Content-Security-Policy, by name."""
    policy = reply.headers.get("Content-Security-Policy", "")
    return {part.split()[0]: part for part in (p.strip() for p in policy.split(";")) if part}


def test_every_response_carries_the_script_policy_nosniff_and_no_framing(client, connection):
    plant_good_job(connection)
    page = client.get("/")  # the queues page ("/0/view/queues" redirects there)
    scripts = re.findall(r'<script src="([^"]+)"', page.text)
    assert len(scripts) >= 4, page.text
    replies = {path: client.get(path) for path in [
        "/", "/0/view/queues", "/0/view/workers", "/0/view/jobs", "/0/view/jobs/rqrl/failed/8/asc/1",
        "/0/view/job/good-job", "/0/view/job/gone-job", "/0/data/queues.json", "/0/data/workers.json",
        "/0/data/jobs/rqrl/failed/8/asc/1.json", "/0/data/job/good-job.json", "/favicon.ico", "/no-such-page",
        *scripts]}
    replies["POST /job/good-job/requeue"] = client.post("/job/good-job/requeue")

    for path, reply in replies.items():
        directives = script_policy(reply)
        assert "'unsafe-inline'" not in directives.get("script-src", "'unsafe-inline'"), (path, directives)
        assert directives.get("frame-ancestors") == "frame-ancestors 'none'", (path, directives)
        assert directives.get("default-src") == "default-src 'none'", (path, directives)
        assert reply.headers.get("X-Content-Type-Options") == "nosniff", path
    assert replies["POST /job/good-job/requeue"].json == {"status": "OK"}
    assert [replies[path].status_code for path in scripts] == [200] * len(scripts)


def test_the_pages_inline_script_holds_the_nonce_of_its_response_and_no_other_does(client):
    nonces = []
    for path in ("/", "/0/view/workers", "/0/view/jobs", "/"):
        reply = client.get(path)
        nonce = re.search(r"'nonce-([^']+)'", script_policy(reply)["script-src"]).group(1)
        tags = re.findall(r"<script\b[^>]*>", reply.text)
        inline = [tag for tag in tags if "src=" not in tag and "text/template" not in tag]
        assert inline == [f'<script nonce="{nonce}" type="text/javascript">'], (path, tags)
        assert all("nonce" not in tag for tag in tags if tag not in inline), (path, tags)
        nonces.append(nonce)
    assert len(set(nonces)) == len(nonces) and all(len(nonce) >= 24 for nonce in nonces), nonces


ANOTHER_SITE = [{"Sec-Fetch-Site": "cross-site", "Origin": "https://pages.example"},
                {"Sec-Fetch-Site": "same-site", "Origin": "http://other.localhost"},
                {"Origin": "https://pages.example"}]  # a browser that sends no Sec-Fetch-Site


@pytest.mark.parametrize("headers", ANOTHER_SITE)
def test_an_action_another_site_sends_is_refused_and_changes_nothing(client, connection, headers):
    job = plant_good_job(connection)
    for send, path in ((client.post, f"/job/{job.id}/requeue"), (client.post, f"/requeue/{QUEUE}"),
                       (client.get, f"/requeue/{QUEUE}")):  # requeue-all answers GET too
        reply = send(path, headers=headers)
        assert reply.status_code == 403 and "refused" in reply.text and "CSRF" in reply.text, (path, reply.text)
    assert failed_registry(QUEUE, connection).get_job_ids() == [job.id], "the job is still failed: nothing requeued"


@pytest.mark.parametrize("headers", [{"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"},
                                     {"Origin": "http://localhost"}, {}])  # its own page; an old browser; curl
def test_the_dashboards_own_pages_and_clients_that_are_no_browser_may_act(client, connection, headers):
    job = plant_good_job(connection)
    reply = client.post(f"/job/{job.id}/requeue", headers=headers)
    assert reply.status_code == 200, reply.text
    assert failed_registry(QUEUE, connection).get_job_ids() == []


def test_pages_and_their_data_open_from_a_link_on_another_site(client, connection):
    plant_good_job(connection)
    for path in ("/", "/0/data/queues.json"):
        assert client.get(path, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200, path
