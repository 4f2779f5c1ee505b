"""Redis AUTH (requirepass), ACL users with minimal rules, and TLS, end to end with real `rqrl worker`
and `rqrl dashboard` processes. The ACL rules below are the ones docs/redis-security.md documents.

Every server here is a private redis-server on a free TCP port of 127.0.0.1 (never the shared one
on 6379), started once per module and always stopped at teardown.

The tests here start processes; the in-process ones are in tests/integration/test_redis_auth.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from rqrl import ActorFailedError, RedisRefusedError, RQSampler
from tests import fixtures
from tests.children import REPO_ROOT, WorkerProcesses, free_port, get_json, stop_process, worker_env
from tests.conftest import TEST_SECRET
from tests.factories import redis_actors
from tests.integration.test_redis_auth import (  # noqa: F401 - shared with the in-process tests
    ACL_PASSWORDS,
    DASHBOARD_RULES,
    LEARNER_RULES,
    REQUIREPASS,
    RULES,
    WORKER_RULES,
    acl_server,
    acl_url,
    aclfile_lines,
    collect,
    learner_start_error,
    make_certificates,
    requirepass_server,
    requirepass_url,
    run_rqrl_worker,
    running,
    tls_build_problem,
)
from tests.polling import wait_until
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(120)

# ---- the ACL rules under test (docs/redis-security.md quotes them verbatim) -------------------------

# denials the rules accept on purpose: RQ's worker reads CLIENT LIST (an @admin command that lists every
# client of the server) only to show its own address; denied, RQ warns once and shows 'unknown'
EXPECTED_DENIALS = {("worker", "client|list"), ("worker", "config|get")}

# a password with characters that must be percent-encoded in a URL


# ---- private redis-servers ---------------------------------------------------------------------------


def acl_denials(server: RedisServer) -> set[tuple[str, str]]:
    """(user, command or key) of each refusal in the server's ACL LOG; redis-py's CLIENT SETINFO on connect
    (refused on Redis >= 7.2, unknown before, ignored by redis-py either way) is left out."""
    return {(entry["username"], entry["object"]) for entry in server.admin.acl_log(count=1000)
            if entry["object"] != "client|setinfo"}


# ---- TLS material: a CA and a server certificate for 127.0.0.1 / localhost, made with openssl ------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    problem = tls_build_problem()
    if problem:
        pytest.skip(f"TLS not tested: {problem}")
    directory = tmp_path_factory.mktemp("tls")
    files = make_certificates(directory)
    server = RedisServer(directory, ["--tls-cert-file", str(files["cert"]), "--tls-key-file", str(files["key"]),
                                     "--tls-ca-cert-file", str(files["ca"]), "--tls-auth-clients", "no"],
                         {"ssl": True, "ssl_cert_reqs": "required", "ssl_ca_certs": str(files["ca"])}, tls=True)
    server.ca_file = files["ca"]
    with running(server):
        yield server


def tls_url(server: RedisServer, ca_file: Path) -> str:
    return (f"rediss://127.0.0.1:{server.port}/0?ssl_cert_reqs=required"
            f"&ssl_ca_certs={quote(str(ca_file), safe='/')}")


# ---- learner, workers, dashboard ------------------------------------------------------------------------


@contextmanager
def workers_on(redis_url: str) -> Iterator[WorkerProcesses]:
    pool = WorkerProcesses(redis_url)
    try:
        yield pool
    finally:
        pool.stop_all()


@contextmanager
def dashboard_on(redis_url: str, log_file: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    with open(log_file, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "rqrl", "dashboard", "--redis-url", redis_url,
                                    "--bind", "127.0.0.1", "--port", str(port)], cwd=REPO_ROOT, env=worker_env(),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop_process(process)


def wait_for_failed_job(base: str, process: subprocess.Popen, log_file: Path, timeout: float = 30) -> str:
    """The id of the first job in the dashboard's failed list of queue rqrl (RQ files it after the learner
    has seen the failure report)."""

    def failed_jobs() -> list[dict]:
        return get_json(f"{base}/0/data/jobs/rqrl/failed/8/asc/1.json", process, log_file)["jobs"]

    return wait_until(failed_jobs, timeout, interval=0.2, message="a failed job in RQ's failed registry")[0]["id"]


# ---- AUTH with requirepass -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wrong_password_worker(requirepass_server) -> subprocess.CompletedProcess:
    return run_rqrl_worker(requirepass_url(requirepass_server, "not-the-password"))


def test_requirepass_learner_and_worker_collect_a_batch(requirepass_server):
    url = requirepass_url(requirepass_server)
    with workers_on(url) as workers:
        workers.start("auth-worker")
        workers.wait_registered(requirepass_server.admin, 1)
        record, = collect(url, "auth-run")
    assert record.rewards.shape == (16, 2)
    assert set(record.worker) == {"auth-worker"}
    assert not requirepass_server.admin.keys("rqrl:auth-run:*"), "stop() left keys behind"


def test_rqrl_worker_with_a_wrong_or_missing_password_exits_with_a_clear_error(requirepass_server,
                                                                               wrong_password_worker):
    assert wrong_password_worker.returncode != 0
    assert "invalid username-password pair" in wrong_password_worker.stderr, wrong_password_worker.stderr
    missing = run_rqrl_worker(requirepass_url(requirepass_server, None))
    assert missing.returncode != 0
    assert "authenticated" in missing.stderr or "Authentication required" in missing.stderr, missing.stderr


def test_rqrl_worker_error_does_not_echo_the_password(wrong_password_worker):
    assert wrong_password_worker.returncode != 0
    assert "not-the-password" not in wrong_password_worker.stderr


def test_acl_users_collect_fail_and_show_on_the_dashboard(acl_server, tmp_path):
    admin = acl_server.admin
    admin.execute_command("ACL", "LOG", "RESET")
    log_file = tmp_path / "dashboard.log"
    with workers_on(acl_url(acl_server, "worker")) as workers, \
            dashboard_on(acl_url(acl_server, "dashboard"), log_file) as (base, dashboard):
        workers.start("acl-worker")
        workers.wait_registered(admin, 1)
        # more actor groups than workers and short slices: jobs yield and the worker enqueues continuations
        with redis_actors(acl_url(acl_server, "learner"), "acl-run", n_actors=4, actors_per_job=1,
                          min_job_seconds=0.05, collect_timeout=60) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            for _ in range(4):
                record = actors.collect_outputs("cpu").record
                assert record.rewards.shape == (16, 2)
                actors.broadcast_updated_policy(actors.policy.state_dict())
            queues = get_json(f"{base}/0/data/queues.json", dashboard, log_file)
            listed = get_json(f"{base}/0/data/workers.json", dashboard, log_file)
            assert actors.workers_alive(cached=False) == 1
        assert "rqrl" in {queue["name"] for queue in queues["queues"]}
        assert [worker["name"] for worker in listed["workers"]] == ["acl-worker"]
        # the failure path under the worker's rules: the learner gets the env's error, not a NOPERM
        with redis_actors(acl_url(acl_server, "learner"), "acl-failing", fixtures.make_failing_env,
                          fixtures.mlp_policy(1, 2), collect_timeout=60) as actors:
            actors.broadcast_updated_policy(actors.policy.state_dict())
            with pytest.raises(ActorFailedError, match="CountingEnv exploded"):
                for _ in range(5):
                    actors.collect_outputs("cpu")
            failed_job = wait_for_failed_job(base, dashboard, log_file)
            job = get_json(f"{base}/0/data/job/{failed_job}.json", dashboard, log_file)
        assert job["status"] == "failed" and "CountingEnv exploded" in (job["exc_info"] or "")
    assert not admin.keys("rqrl:acl-run:*") and not admin.keys("rqrl:acl-failing:*"), "stop() left keys behind"
    # nothing was refused but the one denial the rules mean (which also shows the ACL LOG check is live)
    assert acl_denials(acl_server) == EXPECTED_DENIALS, admin.acl_log(count=20)


def test_local_workers_connect_with_their_own_acl_user(acl_server):
    admin = acl_server.admin
    admin.execute_command("ACL", "LOG", "RESET")
    records = collect(acl_url(acl_server, "learner"), "acl-local", batches=3, n_local_workers=1,
                      start_method="fork", worker_redis_url=acl_url(acl_server, "worker"))
    assert [record.rewards.shape for record in records] == [(16, 2)] * 3
    assert not admin.keys("rqrl:acl-local:*")
    # the one denial the worker rules mean (CLIENT LIST, by user 'worker') shows the local worker
    # logged in as 'worker'; as 'learner' it would have been refused other commands (HINCRBY, LMOVE)
    assert acl_denials(acl_server) == EXPECTED_DENIALS, admin.acl_log(count=20)


def test_a_sampler_and_its_workers_run_under_the_learner_and_worker_users(acl_server):
    """garage's sampler under the documented rules: the learner user drives it, a local worker logs in as
    'worker', and nothing is refused but the denials the rules mean."""
    admin = acl_server.admin
    admin.execute_command("ACL", "LOG", "RESET")
    with RQSampler(fixtures.VersionPolicy(1), fixtures.make_echo_env(), max_episode_length=100, n_workers=2,
                   redis_url=acl_url(acl_server, "learner"), worker_redis_url=acl_url(acl_server, "worker"),
                   run_name="acl-sampler", secret=TEST_SECRET, n_local_workers=1, start_method="fork",
                   progress=False) as sampler:
        first = sampler.obtain_samples(0, 40, None)
        exact = sampler.obtain_exact_episodes(2, fixtures.VersionPolicy(3))
    assert int(first.lengths.sum()) >= 40
    assert len(exact.lengths) == 4 and set(exact.actions.tolist()) == {3}
    assert not admin.keys("rqrl:acl-sampler:*"), "shutdown left keys behind"
    # the sampler never asks for proto-max-bulk-len, so CONFIG GET may not show; CLIENT LIST by 'worker' shows
    # the local worker logged in as 'worker'
    denials = acl_denials(acl_server)
    assert ("worker", "client|list") in denials and denials <= EXPECTED_DENIALS, admin.acl_log(count=20)


@pytest.mark.timeout(150)
def test_seed_actors_and_servers_run_as_jobs_under_the_worker_user(acl_server):
    """The SEED trainer in job mode under the documented rules: the learner user runs the trainer, the
    actors and inference servers run on an `rqrl worker` logged in as 'worker'."""
    from rqrl.seed import Config, Trainer
    from tests.seed_fixtures import cartpole_agent, make_cartpole

    admin = acl_server.admin
    admin.execute_command("ACL", "LOG", "RESET")
    config = Config(redis_url=acl_url(acl_server, "learner"), run_name="acl-seed", secret=TEST_SECRET,
                    actor_threads=2, minimum_buffer_size=50, inference_batchsize=2, inference_delay=0.01,
                    broadcast_period=0.5, request_timeout=1.0, queue_name="rqrl-seed-acl")

    def stop_once_trained(trainer) -> None:  # noqa: ANN001 - a Trainer
        if trainer.stats.train_steps >= 5:
            trainer.stop()

    with workers_on(acl_url(acl_server, "worker")) as workers:
        for index in range(2):  # one inference server and one actor, each holding a worker for the run
            workers.start(f"acl-seed-worker-{index}", queue="rqrl-seed-acl")
        workers.wait_registered(admin, 2, queue="rqrl-seed-acl")
        trainer = Trainer(cartpole_agent(), config, make_cartpole, on_progress=stop_once_trained,
                          progress_seconds=0.1)
        trainer.start(90.0)
    stats = trainer.stats
    assert stats.train_steps >= 5, stats
    assert stats.counters["pushed"] == stats.transitions_received > 0, stats
    assert stats.restarts == []
    assert not admin.keys("rqrl:acl-seed:*"), "the trainer left keys behind"
    denials = acl_denials(acl_server)
    assert ("worker", "client|list") in denials and denials <= EXPECTED_DENIALS, admin.acl_log(count=20)


def test_a_worker_under_older_rules_without_sismember_keeps_working(acl_server):
    from rqrl.engine.timings import protocol_timings

    admin = acl_server.admin
    old_rules = WORKER_RULES.replace(" +sismember", "")
    assert old_rules != WORKER_RULES
    admin.execute_command("ACL", "SETUSER", "old-worker", "reset", "on", ">old-pw", *old_rules.split())
    url = f"redis://old-worker:old-pw@127.0.0.1:{acl_server.port}/0"
    try:
        with workers_on(url) as workers:
            process = workers.start("old-rules")
            workers.wait_registered(admin, 1)
            records = collect(acl_url(acl_server, "learner"), "acl-old-worker", batches=3)
            assert [record.worker for record in records] == [("old-rules", "old-rules")] * 3
            time.sleep(protocol_timings().heartbeat * 2 + 1)  # idle heartbeats, which check the registration
            assert process.poll() is None, "the worker quit on a NOPERM for SISMEMBER"
            process.terminate()
            stderr = process.communicate(timeout=30)[1].decode()
        assert "add +sismember to its ACL user" in stderr
    finally:
        admin.acl_deluser("old-worker")
        admin.execute_command("ACL", "LOG", "RESET")


def test_tls_learner_worker_and_dashboard_work_over_rediss(tls_server, tmp_path):
    url = tls_url(tls_server, tls_server.ca_file)
    log_file = tmp_path / "dashboard.log"
    env = worker_env(REDIS_URL=url)  # the worker reads REDIS_URL: no URL on its command line
    worker = subprocess.Popen([sys.executable, "-m", "rqrl", "worker", "--name", "tls-worker", "--log-level",
                               "WARNING"], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pool = WorkerProcesses(url)
    pool.processes.append(worker)
    try:
        with dashboard_on(url, log_file) as (base, dashboard):
            pool.wait_registered(tls_server.admin, 1)
            record, = collect(url, "tls-run")
            listed = get_json(f"{base}/0/data/workers.json", dashboard, log_file)
    finally:
        pool.stop_all()
    assert record.rewards.shape == (16, 2)
    assert set(record.worker) == {"tls-worker"}
    assert [entry["name"] for entry in listed["workers"]] == ["tls-worker"]


def test_tls_refuses_an_untrusted_certificate_and_plain_connections(tls_server, tmp_path):
    other_ca = make_certificates(tmp_path, "other-ca")["ca"]
    untrusted = redis.Redis.from_url(tls_url(tls_server, other_ca))
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusted.ping()
    system_store = redis.Redis.from_url(f"rediss://127.0.0.1:{tls_server.port}/0")  # no ssl_ca_certs
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        system_store.ping()
    plain = redis.Redis.from_url(f"redis://127.0.0.1:{tls_server.port}/0", socket_timeout=5)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    result = run_rqrl_worker(tls_url(tls_server, other_ca))
    assert result.returncode != 0 and "certificate verify failed" in result.stderr, result.stderr


def test_learner_with_an_untrusted_certificate_fails_fast(tls_server, tmp_path):
    other_ca = make_certificates(tmp_path, "other-ca")["ca"]
    error = learner_start_error(tls_url(tls_server, other_ca))
    assert isinstance(error, RedisRefusedError) and "certificate verify failed" in str(error), error
    assert isinstance(error.__cause__, redis.ConnectionError), error.__cause__
