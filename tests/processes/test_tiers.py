"""The default tier's refusal of tests that start processes (tests/tiers.py), run by pytester on a small project
(it starts them in this process, so it is of this tier itself)."""

from __future__ import annotations

import shutil

import pytest

from tests.unit.test_tiers import project  # noqa: F401 - the small project, a fixture

pytest_plugins = ["pytester"]

STARTS_A_MULTIPROCESSING_PROCESS = """
import multiprocessing

def test_starts_a_child():
    child = multiprocessing.get_context("fork").Process(target=int)
    child.start()
    child.join()
"""


STARTS_REDIS = """
import shutil, subprocess

def test_starts_a_redis_server():
    subprocess.run([shutil.which("redis-server"), "--version"], check=True, capture_output=True)
"""


STARTS_A_PROCESS = """
import subprocess, sys

def test_starts_python():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_a_default_tier_test_that_starts_a_process_fails_and_says_where_it_belongs(project):
    project.path.joinpath("tests/integration/test_starts.py").write_text(STARTS_A_PROCESS)
    project.path.joinpath("tests/processes/test_starts_too.py").write_text(STARTS_A_PROCESS)
    result = project.runpytest_inprocess("-p", "no:cacheprovider", "--all")
    result.assert_outcomes(passed=6, errors=1)  # its call passes; its teardown reports the process
    output = result.stdout.str()
    assert "tests/integration/test_starts.py::test_starts_python started a process (python" in output
    assert "move this test to tests/processes/" in output
    assert "test_starts_too.py::test_starts_python started" not in output  # a processes-tier test may


def test_a_multiprocessing_child_counts_as_a_process(project):
    project.path.joinpath("tests/unit/test_child.py").write_text(STARTS_A_MULTIPROCESSING_PROCESS)
    result = project.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    assert "test_child.py::test_starts_a_child started a multiprocessing process" in result.stdout.str()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")
def test_a_redis_server_is_what_the_default_tier_may_start(project):
    project.path.joinpath("tests/integration/test_redis.py").write_text(STARTS_REDIS)
    project.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=3)
