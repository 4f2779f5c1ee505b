"""compose.yaml without a Docker engine: its structure, and each service's command run locally."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.polling import wait_until
from tests.processes import REPO_ROOT, free_port, get_json, run_rqrl, stop_process, worker_env

pytestmark = pytest.mark.timeout(180)
COMPOSE_URL = "redis://redis:6379/0"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())


def rqrl_arguments(service: dict, redis_url: str) -> list[str]:
    """The arguments of the service's `rqrl` command, with the test Redis for the compose one."""
    command = [redis_url if part == COMPOSE_URL else part for part in service["command"]]
    assert command[0] == "rqrl", f"expected an rqrl command, got {command}"
    return command[1:]


def test_compose_file_is_well_formed(compose):
    services = compose["services"]
    assert {"redis", "worker", "learner", "dashboard"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        assert isinstance(service.get("command", []), list), f"{name}: command must be a list (exec form)"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
    build = services["worker"]["build"]
    assert (REPO_ROOT / build["context"] / build["dockerfile"]).is_file()
    dockerfile = (REPO_ROOT / build["dockerfile"]).read_text()
    assert "torch==2.13.0" in dockerfile and "download.pytorch.org/whl/cpu" in dockerfile


def test_workers_and_learner_share_a_required_secret(compose):
    for name in ("worker", "learner"):
        assert compose["services"][name]["environment"]["RQRL_SECRET"].startswith("${RQRL_SECRET:?"), name


def test_redis_port_is_never_published(compose):
    assert "ports" not in compose["services"]["redis"]
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name} publishes {mapping} beyond localhost"


def test_worker_service_command_runs(compose, redis_url, connection):
    result = run_rqrl(*rqrl_arguments(compose["services"]["worker"], redis_url), "--burst", timeout=60)
    assert result.returncode == 0, result.stderr


def test_learner_service_command_runs_against_the_worker_service(compose, redis_url, connection, workers):
    worker_command = compose["services"]["worker"]["command"]
    workers.start("compose-worker", queue=worker_command[worker_command.index("--queue") + 1])
    workers.wait_registered(connection, 1)
    arguments = rqrl_arguments(compose["services"]["learner"], redis_url)
    arguments[arguments.index("--seconds") + 1] = "2"
    result = run_rqrl(*arguments, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "done:" in result.stdout


def test_dashboard_service_shows_queues_and_busy_workers(compose, redis_url, connection, workers, tmp_path: Path):
    workers.start("busy-worker")
    workers.wait_registered(connection, 1)
    port = free_port()
    arguments = rqrl_arguments(compose["services"]["dashboard"], redis_url)
    arguments[arguments.index("--port") + 1] = str(port)
    arguments[arguments.index("--bind") + 1] = "127.0.0.1"
    demo = subprocess.Popen([sys.executable, "-m", "rqrl", "demo", "--redis-url", redis_url, "--workers", "0",
                             "--seconds", "20", "--actors", "2"], cwd=REPO_ROOT, env=worker_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log_file = tmp_path / "dashboard.log"
    with open(log_file, "wb") as log:
        dashboard = subprocess.Popen([sys.executable, "-m", "rqrl", *arguments], cwd=REPO_ROOT, env=worker_env(),
                                     stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}/0/data"
    try:
        listings = []

        def busy_workers() -> list[dict]:
            listings.append(get_json(f"{base}/workers.json", dashboard, log_file, timeout=60))
            return [worker for worker in listings[-1]["workers"] if worker["current_job"] != "idle"]

        busy = wait_until(busy_workers, 60, interval=0.2, message=lambda: f"a busy worker shown: {listings[-1:]}")
        assert busy[0]["current_job"]["job_id"].startswith("rqrl_")
        queues = get_json(f"{base}/queues.json", dashboard, log_file)
        assert "rqrl" in [queue["name"] for queue in queues["queues"]]
    finally:
        for process in (dashboard, demo):
            stop_process(process, timeout=15)
