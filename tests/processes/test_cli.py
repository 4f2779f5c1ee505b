"""The everyday `rqrl` commands start without torch (compose runs `rqrl health` in every container; the CLI's
answers must not wait for torch): each command runs in a fresh interpreter under ``-X importtime``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.children import REPO_ROOT, worker_env

pytestmark = pytest.mark.timeout(120)


def imported_modules(*arguments: str) -> set[str]:
    """Top-level packages a fresh ``python ARGUMENTS`` imported (from -X importtime's report on stderr)."""
    result = subprocess.run([sys.executable, "-X", "importtime", *arguments], cwd=REPO_ROOT, env=worker_env(),
                            capture_output=True, text=True, timeout=60)
    return {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines()
            if line.startswith("import time:")}


def test_the_check_sees_torch_where_it_is_imported():
    assert "torch" in imported_modules("-c", "import rqrl.engine.policy")


@pytest.mark.parametrize("arguments", [
    ("-c", "import rqrl; rqrl.ConfigError, rqrl.RqrlError"),
    ("-m", "rqrl", "--help"),
    ("-m", "rqrl", "worker", "--help"),
    ("-m", "rqrl", "status", "--redis-url", "redis://127.0.0.1:1/0"),
    ("-m", "rqrl", "stop", "some-run", "--redis-url", "redis://127.0.0.1:1/0"),
    ("-m", "rqrl", "health", "--redis-url", "redis://127.0.0.1:1/0", "--worker", "--run", "some-run"),
], ids=["import", "help", "worker-help", "status", "stop", "health"])
def test_everyday_commands_never_import_torch(arguments):
    modules = imported_modules(*arguments)
    assert "rqrl" in modules and "click" in modules or arguments[0] == "-c"
    assert "torch" not in modules and "gymnasium" not in modules
