"""Redis AUTH (requirepass), ACL users with minimal rules, and TLS, end to end with real `rqrl worker`
and `rqrl dashboard` processes. The ACL rules below are the ones docs/redis-security.md documents.

Every server here is a private redis-server on a free TCP port of 127.0.0.1 (never the shared one
on 6379), started once per module and always stopped at teardown.

The tests here run in-process; those that start processes are in tests/processes/test_redis_auth.py.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import torch
from redis.exceptions import NoPermissionError

from rqrl import RedisRefusedError
from rqrl.engine.server import find_redis_server
from tests.children import REPO_ROOT, run_rqrl
from tests.factories import redis_actors
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(120)

# ---- the ACL rules under test (docs/redis-security.md quotes them verbatim) -------------------------

WORKER_RULES = (
    "resetkeys ~rq:* ~rqrl:* resetchannels &rq:pubsub:* -@all "
    "+ping +info +client|setname +multi +exec +watch +unwatch "
    "+get +set +mget +exists +del +expire +pexpire +persist "
    "+incr +hget +hgetall +hset +hsetnx +hdel +hincrby +hincrbyfloat +sadd +srem +smembers +sismember "
    "+llen +lrange +rpush +lpop +blpop +ltrim +lrem +lmove +blmove "
    "+zadd +zrem +zrange +zrangebyscore +zremrangebyscore +xadd "
    "+eval +evalsha +script|load +subscribe +unsubscribe"
)
LEARNER_RULES = (
    "resetkeys ~rq:* ~rqrl:* resetchannels -@all "
    "+ping +info +multi +exec "
    "+get +getdel +set +mget +exists +del +expire +pttl +scan "
    "+hget +hgetall +hset +sadd +smembers "
    "+llen +lrange +ltrim +lset +rpush +lpop +blpop +lrem +lmove +blmove +sort +memory|usage "
    "+zrange +zrangebyscore +zremrangebyscore +zrem +eval +evalsha +script|load"
)
DASHBOARD_RULES = (
    "resetkeys %R~rq:* resetchannels -@all "
    "+ping +exists +hget +hgetall +llen +lrange +smembers +zcard +zrange +xrevrange"
)
RULES = {"worker": WORKER_RULES, "learner": LEARNER_RULES, "dashboard": DASHBOARD_RULES}
ACL_PASSWORDS = {"worker": "worker-pw-1", "learner": "learner-pw-2", "dashboard": "dashboard-pw-3",
                 "admin": "admin-pw-0"}
# denials the rules accept on purpose: RQ's worker reads CLIENT LIST (an @admin command that lists every
# client of the server) only to show its own address; denied, RQ warns once and shows 'unknown'

# a password with characters that must be percent-encoded in a URL
REQUIREPASS = "rq@rl/pass:word"
DOCS = REPO_ROOT / "docs" / "redis-security.md"


# ---- private redis-servers ---------------------------------------------------------------------------


@contextmanager
def running(server: RedisServer) -> Iterator[RedisServer]:
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def requirepass_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("requirepass"), ["--requirepass", REQUIREPASS],
                         {"password": REQUIREPASS}, tcp=True)
    with running(server):
        yield server


def requirepass_url(server: RedisServer, password: str | None = REQUIREPASS) -> str:
    auth = f":{quote(password, safe='')}@" if password is not None else ""
    return f"redis://{auth}127.0.0.1:{server.port}/0"


def aclfile_lines() -> list[str]:
    """The aclfile of docs/redis-security.md, with the test passwords; the default user is off."""
    return [
        "user default off",
        f"user admin on >{ACL_PASSWORDS['admin']} ~* &* +@all",
        *(f"user {name} reset on >{ACL_PASSWORDS[name]} {rules}" for name, rules in RULES.items()),
    ]


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("acl")
    aclfile = directory / "users.acl"
    aclfile.write_text("\n".join(aclfile_lines()) + "\n")
    server = RedisServer(directory, ["--aclfile", str(aclfile), "--acllog-max-len", "1000"],
                         {"username": "admin", "password": ACL_PASSWORDS["admin"]}, tcp=True)
    with running(server):
        yield server


def acl_url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{ACL_PASSWORDS[user]}@127.0.0.1:{server.port}/0"


# ---- TLS material: a CA and a server certificate for 127.0.0.1 / localhost, made with openssl ------


def tls_build_problem() -> str | None:
    """Why this machine cannot run the TLS tests, or None."""
    if shutil.which("openssl") is None:
        return "the openssl command-line tool is not installed"
    try:
        probe = subprocess.run([find_redis_server(), "--port", "0", "--tls-port", "0"], capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot run redis-server: {error}"
    if "Bad directive" in probe.stdout + probe.stderr:
        return "this redis-server was built without TLS support (BUILD_TLS=yes): it does not know --tls-port"
    return None


def make_certificates(directory: Path, name: str = "ca") -> dict[str, Path]:
    def openssl(*args: str) -> None:
        result = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            pytest.skip(f"openssl could not make test certificates: {result.stderr.strip()[-300:]}")

    (directory / "server.ext").write_text(
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\n"
        "keyUsage = digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n"
    )
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
            "-days", "2", "-subj", f"/CN=rqrl test {name}")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    openssl("x509", "-req", "-in", "server.csr", "-CA", f"{name}.crt", "-CAkey", f"{name}.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "server.ext")
    return {"ca": directory / f"{name}.crt", "cert": directory / "server.crt", "key": directory / "server.key"}


# ---- learner, workers, dashboard ------------------------------------------------------------------------


def collect(redis_url: str, run_name: str, batches: int = 1, **options) -> list:
    """Run a learner on ``redis_url`` and collect ``batches`` batches; returns the records."""
    records = []
    with redis_actors(redis_url, run_name, collect_timeout=60, **options) as actors:
        actors.broadcast_updated_policy(actors.policy.state_dict())
        for _ in range(batches):
            records.append(actors.collect_outputs("cpu").record)
            actors.broadcast_updated_policy(actors.policy.state_dict())
    return records


def run_rqrl_worker(redis_url: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_rqrl("worker", "--redis-url", redis_url, "--burst", timeout=timeout)


# ---- AUTH with requirepass -----------------------------------------------------------------------------


def learner_start_error(redis_url: str, timeout: float = 5) -> BaseException | None:
    """Start a learner on ``redis_url`` in a daemon thread and return what it raised; TimeoutError if it is
    still trying after ``timeout`` s (the thread then gives up on its own, after the client's retries)."""
    outcome: dict[str, BaseException] = {}

    def start() -> None:
        try:
            redis_actors(redis_url).start()
        except BaseException as error:  # handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=start, name="rqrl-test-learner-start", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the learner was still trying to connect after {timeout} s")
    return outcome.get("error")


def test_learner_with_a_wrong_password_fails_fast(requirepass_server):
    error = learner_start_error(requirepass_url(requirepass_server, "not-the-password"))
    assert isinstance(error, RedisRefusedError) and "invalid username-password pair" in str(error), error
    assert isinstance(error.__cause__, redis.AuthenticationError), error.__cause__


def test_the_train_run_folder_does_not_store_the_redis_password(tmp_path):
    from rqrl.algorithms.impala import ImpalaConfig, Learner

    url = f"redis://learner:{ACL_PASSWORDS['learner']}@127.0.0.1:1/0"
    threads = torch.get_num_threads()
    try:
        learner = Learner(ImpalaConfig(redis_url=url, run_dir=str(tmp_path), run_name="secret-check", progress=False))
    finally:
        torch.set_num_threads(threads)  # Learner sets the learner's thread count for the whole process
    assert not learner.run_dir.exists(), "the folder comes once the run has started"
    learner.open_run_folder()
    stored = (learner.run_dir / "config.json").read_text()
    assert "127.0.0.1:1" in stored  # the host stays, for the record
    assert ACL_PASSWORDS["learner"] not in stored


# ---- ACL users -------------------------------------------------------------------------------------------


def test_the_aclfile_and_acl_setuser_forms_define_the_same_users(acl_server):
    admin = acl_server.admin
    for name, rules in RULES.items():
        copy = f"{name}-copy"
        admin.execute_command("ACL", "SETUSER", copy, "reset", "on", f">{ACL_PASSWORDS[name]}", *rules.split())
        try:
            assert admin.acl_getuser(copy) == admin.acl_getuser(name)
        finally:
            admin.acl_deluser(copy)


def test_the_worker_and_learner_users_may_run_info_so_rq_uses_its_reliable_dequeue(acl_server):
    from rq.utils import get_version

    admin = acl_server.admin
    version = tuple(int(part) for part in admin.info("server")["redis_version"].split(".")[:3])
    for user in ("worker", "learner"):
        client = redis.Redis.from_url(acl_url(acl_server, user))
        assert client.info("server")["redis_version"]
        assert get_version(client) == version  # RQ dequeues with BLMOVE on Redis >= 6.2, from this version
        client.close()
    # the pitfall: without INFO, RQ silently assumes Redis 5.0.9 (and would dequeue with BLPOP, not BLMOVE)
    admin.execute_command("ACL", "SETUSER", "worker-no-info", "reset", "on", ">pw", *WORKER_RULES.split(), "-info")
    try:
        client = redis.Redis(host="127.0.0.1", port=acl_server.port, username="worker-no-info", password="pw")
        assert get_version(client) == (5, 0, 9)
        client.close()
    finally:
        admin.acl_deluser("worker-no-info")


@pytest.mark.parametrize("command", [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "SET", "maxmemory", "1"),
    ("CONFIG", "GET", "requirepass"),
    ("ACL", "LIST"),
    ("KEYS", "*"),
    ("SHUTDOWN", "NOSAVE"),
    ("GET", "session:42"),                  # a key outside ~rq:* and ~rqrl:*
    ("SET", "session:42", "stolen"),
    ("PUBLISH", "rq:pubsub:some-worker", "{}"),  # workers only listen; they send no commands to other workers
    ("MONITOR",),
], ids=lambda command: " ".join(command[:2]))
def test_the_worker_user_is_refused_what_it_must_not_do(acl_server, command):
    admin = acl_server.admin
    admin.set("session:42", "secret")
    worker = redis.Redis.from_url(acl_url(acl_server, "worker"))
    try:
        with pytest.raises(NoPermissionError, match="no permissions"):
            worker.execute_command(*command)
    finally:
        worker.close()
    assert admin.get("session:42") == b"secret"
    assert admin.ping()


def test_the_worker_and_learner_users_cannot_subscribe_outside_their_channels(acl_server):
    for user, channel in (("worker", "other-channel"), ("learner", "rq:pubsub:some-worker")):
        pubsub = redis.Redis.from_url(acl_url(acl_server, user)).pubsub()
        try:
            with pytest.raises(NoPermissionError, match="no permissions"):
                pubsub.subscribe(channel)
                pubsub.get_message(timeout=2)
        finally:
            pubsub.close()


def test_the_dashboard_user_only_reads_rq_keys(acl_server):
    admin = acl_server.admin
    admin.rpush("rq:queue:dashboard-probe", "job-1")
    dashboard = redis.Redis.from_url(acl_url(acl_server, "dashboard"))
    try:
        assert dashboard.llen("rq:queue:dashboard-probe") == 1
        for command in (("DEL", "rq:queue:dashboard-probe"), ("LPUSH", "rq:queue:dashboard-probe", "x"),
                        ("HGETALL", "rqrl:some-run:config"), ("INFO",), ("FLUSHALL",)):
            with pytest.raises(NoPermissionError, match="no permissions"):
                dashboard.execute_command(*command)
        assert admin.llen("rq:queue:dashboard-probe") == 1
    finally:
        dashboard.close()
        admin.delete("rq:queue:dashboard-probe")


def test_scripts_run_with_the_callers_permissions(acl_server):
    """The worker may load and run Lua scripts (rqrl's and RQ's), but a script cannot do more than the user."""
    worker = redis.Redis.from_url(acl_url(acl_server, "worker"))
    try:
        digest = worker.script_load("return redis.call('FLUSHALL')")
        with pytest.raises(redis.ResponseError, match="no permissions|can't run this command"):
            worker.evalsha(digest, 0)
        digest = worker.script_load("return redis.call('GET', KEYS[1])")
        with pytest.raises(redis.ResponseError, match="no permissions|can't access"):
            worker.evalsha(digest, 1, "session:42")
    finally:
        worker.close()


def test_the_documented_rules_are_the_tested_rules():
    text = DOCS.read_text()
    for name, rules in RULES.items():
        placeholder = f"{name.upper()}_PASSWORD"
        assert f"ACL SETUSER {name} reset on >{placeholder} {rules}" in text, f"the ACL SETUSER line of {name}"
        assert f"user {name} reset on >{placeholder} {rules}" in text, f"the aclfile line of {name}"


# ---- TLS -----------------------------------------------------------------------------------------------
