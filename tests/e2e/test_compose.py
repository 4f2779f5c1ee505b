"""compose.yaml without a Docker engine: its structure, and each service's command run locally."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.children import REPO_ROOT, alive, free_port, get_json, run_rqrl, stop_process, worker_env
from tests.conftest import TEST_SECRET
from tests.polling import wait_until
from tests.run_files import read_rows

pytestmark = pytest.mark.timeout(180)
COMPOSE_URL = "redis://redis:6379/0"
# compose.yaml's learner trains LunarLander-v3 unless RQRL_ENV names another env; box2d, which LunarLander needs, is
# in the image but not in every test venv: the tests that train pick CartPole as a compose user would
CARTPOLE = {"RQRL_ENV": "CartPole-v1"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?error} with ``variables``."""

    def value(match: re.Match) -> str:
        name, kind, rest = match.groups()
        if variables.get(name):
            return variables[name]
        if kind == "-":
            return rest
        raise AssertionError(f"compose needs {name}: {rest}")

    return _VARIABLE.sub(value, text)


def rqrl_arguments(service: dict, redis_url: str, volumes: dict[str, Path] | None = None,
                   variables: dict[str, str] | None = None) -> list[str]:
    """The arguments of the service's `rqrl` command as compose runs it: variables interpolated, the test Redis
    for the compose one, and each mounted volume's path (``volumes``: compose volume name -> local folder)."""
    mounts = {spec.split(":")[1]: str(volumes[spec.split(":")[0]]) for spec in service.get("volumes", [])
              if volumes and spec.split(":")[0] in volumes}
    command = [interpolate(part, variables or {}) for part in service["command"]]
    command = [redis_url if part == COMPOSE_URL else mounts.get(part, part) for part in command]
    assert command[0] == "rqrl", f"expected an rqrl command, got {command}"
    return command[1:]


def service_env(service: dict, secrets: Path) -> dict[str, str]:
    """The service's environment as compose sets it, on top of the test's own without RQRL_SECRET: each compose
    secret the service names is a file under ``secrets`` holding the test secret, and /run/secrets/NAME in the
    environment points there (so rqrl reads the secret the way it does in a container)."""
    environment = {}
    for name, value in service.get("environment", {}).items():
        value = interpolate(str(value), {})
        for secret in service.get("secrets", []):
            (secrets / secret).write_text(TEST_SECRET + "\n")
            value = value.replace(f"/run/secrets/{secret}", str(secrets / secret))
        environment[name] = value
    env = worker_env(**environment)
    env.pop("RQRL_SECRET", None)
    return env


def grace_seconds(service: dict) -> float:
    """The service's stop_grace_period (compose's default: 10 s)."""
    period = str(service.get("stop_grace_period", "10s"))
    assert period.endswith("s") and period[:-1].isdigit(), period
    return float(period[:-1])


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
    assert "ARG EXTRA_PACKAGES" in dockerfile and "ARG TORCH_INDEX" in dockerfile


def check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    """check-jsonschema with the compose-spec JSON schema it ships (no network), as `docker compose config`
    would check the file's structure."""
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_compose_file_passes_the_compose_spec_schema():
    result = check_compose_schema(REPO_ROOT / "compose.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_spec_schema_check_catches_a_misspelt_key(compose, tmp_path):
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker"]["stop_grace_perid"] = broken["services"]["worker"].pop("stop_grace_period")
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = check_compose_schema(path)
    assert result.returncode != 0 and "stop_grace_perid" in result.stdout + result.stderr, result.stdout


def test_the_learner_trains_into_a_named_volume_its_user_owns(compose):
    learner = compose["services"]["learner"]
    assert learner["command"][:2] == ["rqrl", "train"]
    assert learner["command"][learner["command"].index("--workers") + 1] == "0"
    run_dir = learner["command"][learner["command"].index("--run-dir") + 1]
    volume, path = learner["volumes"][0].split(":")[:2]
    assert path == run_dir and volume in compose["volumes"], "run folders go to a named volume"
    dockerfile = (REPO_ROOT / "workers" / "Dockerfile").read_text()
    assert f"chown rqrl:rqrl {run_dir}" in dockerfile, "the volume starts owned by the image's non-root user"
    assert dockerfile.index(f"chown rqrl:rqrl {run_dir}") < dockerfile.index("USER rqrl")


def test_services_have_healthchecks_restart_policies_and_rotated_logs(compose):
    services = compose["services"]
    for name in ("worker", "learner"):
        healthcheck = services[name]["healthcheck"]
        assert healthcheck["test"][:3] == ["CMD", "rqrl", "health"], name
        # a check costs 0.4 CPU-s (rqrl health imports no torch; torch took 3 CPU-s and every 25 s timeout under
        # load): a timeout of at most 20 s, and at most one check a 30 s
        assert grace_seconds({"stop_grace_period": healthcheck["timeout"]}) <= 20, f"{name}: healthcheck timeout"
        assert grace_seconds({"stop_grace_period": healthcheck["interval"]}) >= 30, f"{name}: healthcheck interval"
    for name in ("worker", "learner", "dashboard"):
        # without init the process is PID 1, which ignores SIGTERM: every stop waits the grace period and kills it
        assert services[name].get("init") is True, f"{name}: SIGTERM must reach the process (and zombies reaped)"
    assert services["redis"]["restart"] == "unless-stopped"
    for name, service in services.items():
        options = service["logging"]["options"]
        assert service["logging"]["driver"] == "json-file" and options["max-size"] and options["max-file"], name


def test_the_learner_trains_lunar_lander_by_default_and_rqrl_env_picks_another(compose):
    command = compose["services"]["learner"]["command"]
    env_id = command[command.index("--env-id") + 1]
    assert interpolate(env_id, {}) == "LunarLander-v3"
    assert interpolate(env_id, CARTPOLE) == "CartPole-v1"
    # enough actors for 16 workers to each step a group of 4 (with fewer, some of --scale worker=16 stay idle)
    assert int(command[command.index("--n-actors") + 1]) >= 64
    dockerfile = (REPO_ROOT / "workers" / "Dockerfile").read_text()
    assert re.search(r'pip install .*"\.\[[^]]*\bbox2d\b', dockerfile), "the image needs gymnasium's box2d"
    # CI's smoke test keeps CartPole (LunarLander takes longer than its budget on 2 cores), through RQRL_ENV
    smoke = (REPO_ROOT / "scripts" / "compose-smoke.sh").read_text()
    assert 'export RQRL_ENV="${RQRL_SMOKE_ENV:-CartPole-v1}"' in smoke


def test_workers_and_learner_read_the_secret_from_a_compose_secrets_file(compose):
    assert compose["secrets"]["rqrl_secret"] == {"file": "./secrets/rqrl_secret"}
    for name in ("worker", "learner"):
        service = compose["services"][name]
        assert service["secrets"] == ["rqrl_secret"], name
        assert service["environment"] == {"RQRL_SECRET_FILE": "/run/secrets/rqrl_secret"}, name
    # a required variable (${RQRL_SECRET:?...}) given on `up` alone made every later compose command fail
    # ("required variable RQRL_SECRET is missing a value"): the file needs none
    assert "${RQRL_SECRET" not in (REPO_ROOT / "compose.yaml").read_text()


def test_redis_port_is_never_published(compose):
    assert "ports" not in compose["services"]["redis"]
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name} publishes {mapping} beyond localhost"


def test_worker_service_command_runs(compose, redis_url, connection):
    result = run_rqrl(*rqrl_arguments(compose["services"]["worker"], redis_url), "--burst", timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("variables", [CARTPOLE, {}], ids=["RQRL_ENV=CartPole-v1", "default"])
def test_learner_service_command_trains_against_the_worker_service(compose, redis_url, connection, workers,
                                                                    tmp_path, variables):
    if not variables:
        pytest.importorskip("Box2D", reason="compose.yaml's default env, LunarLander-v3, needs rqrl[box2d]")
    worker_command = compose["services"]["worker"]["command"]
    workers.start("compose-worker", queue=worker_command[worker_command.index("--queue") + 1])
    workers.wait_registered(connection, 1)
    volume = tmp_path / "runs"
    volume.mkdir()
    learner = compose["services"]["learner"]
    arguments = rqrl_arguments(learner, redis_url, {"runs": volume}, variables)
    result = subprocess.run([sys.executable, "-m", "rqrl", *arguments, "--total-env-steps", "2000",
                             "--n-actors", "2", "--batch-size", "2"], cwd=volume, env=service_env(learner, tmp_path),
                            capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((volume / "compose" / "summary.json").read_text())
    assert summary["env_steps"] >= 2000
    config = json.loads((volume / "compose" / "config.json").read_text())
    assert config["env_id"] == (variables or {"RQRL_ENV": "LunarLander-v3"})["RQRL_ENV"]
    health = run_rqrl(*rqrl_arguments({"command": learner["healthcheck"]["test"][1:]}, redis_url), timeout=60)
    assert health.returncode == 1 and "no run 'compose'" in health.stdout, "the run ended: no learner"


def start_service(service: dict, redis_url: str, volume: Path, *extra: str) -> subprocess.Popen:
    """The service's command as a local process, as compose runs it (env, working directory, volume)."""
    arguments = rqrl_arguments(service, redis_url, {"runs": volume}, CARTPOLE)
    return subprocess.Popen([sys.executable, "-m", "rqrl", *arguments, *extra], cwd=volume,
                            env=service_env(service, volume.parent), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.slow  # four workers and a learner on a small machine: about a minute
@pytest.mark.timeout(400)
def test_compose_services_train_with_four_workers_and_stop_within_their_grace_periods(compose, redis_url,
                                                                                       connection, tmp_path):
    services = compose["services"]
    volume = tmp_path / "runs"
    volume.mkdir()
    workers = [start_service(services["worker"], redis_url, volume, "--name", f"compose-{index}")
               for index in range(4)]
    learner = None
    try:
        wait_until(lambda: connection.scard("rq:workers:rqrl") >= 4, 60, message="4 workers")
        health = run_rqrl(*rqrl_arguments({"command": services["worker"]["healthcheck"]["test"][1:]}, redis_url),
                          "compose-", timeout=60)  # in a container, --worker alone finds its host's worker
        assert health.returncode == 0, health.stdout + health.stderr
        learner = start_service(services["learner"], redis_url, volume, "--n-actors", "4", "--batch-size", "4",
                                "--progress-seconds", "1")
        metrics = volume / "compose" / "metrics.csv"
        wait_until(lambda: learner.poll() is None and metrics.is_file() and len(read_rows(metrics)) >= 20, 120,
                   interval=0.5, message=lambda: f"training progress (learner exit code {learner.poll()})")
        health = run_rqrl(*rqrl_arguments({"command": services["learner"]["healthcheck"]["test"][1:]}, redis_url),
                          timeout=60)
        assert health.returncode == 0, health.stdout + health.stderr
        # `docker compose stop`: the learner first (it depends on the workers), then the workers
        for service, processes in (("learner", [learner]), ("worker", workers)):
            sent = time.monotonic()
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(timeout=grace_seconds(services[service]) + 30)
                took = time.monotonic() - sent
                assert took < grace_seconds(services[service]), f"{service} took {took:.0f} s after SIGTERM"
        stdout, stderr = learner.communicate()
        assert learner.returncode == 143 and "interrupted (SIGTERM)" in stdout, stderr[-3000:]
        assert all(worker.returncode == 0 for worker in workers)
    finally:
        for process in [*workers, *([learner] if learner else [])]:
            stop_process(process)
    assert (volume / "compose" / "checkpoint.safetensors").is_file()
    assert connection.keys("rqrl:*") == [] and connection.keys("rq:job:*") == []
    assert not any(alive(process.pid) for process in [*workers, learner])


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
