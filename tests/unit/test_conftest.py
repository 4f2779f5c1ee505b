"""The test harness's own rules: the ``slow`` marker's gate (tests/slow_gate.py) and an environment the
developer's shell cannot redirect (tests/conftest.py), run by pytest's pytester on small test files; and
wait_until (tests/polling.py)."""

from __future__ import annotations

import pytest

from tests.polling import wait_until

pytest_plugins = ["pytester"]

TESTS = """
import pytest

@pytest.mark.slow
@pytest.mark.parametrize("case", [1, 2])
def test_slow(case):
    pass

def test_fast():
    pass
"""


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("RQRL_RUN_SLOW", raising=False)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # quicker: the runs need no installed plugin
    pytester.makeini("[pytest]\nmarkers =\n    slow: long-running\n")
    pytester.makeconftest("pytest_plugins = ['tests.slow_gate']")
    pytester.makepyfile(test_gate=TESTS)
    return pytester


@pytest.mark.parametrize("arguments, env, outcomes", [
    ((), {}, {"passed": 1, "skipped": 2}),
    (("--run-slow",), {}, {"passed": 3}),
    ((), {"RQRL_RUN_SLOW": "1"}, {"passed": 3}),
    ((), {"RQRL_RUN_SLOW": "0"}, {"passed": 1, "skipped": 2}),
    (("-m", "slow"), {}, {"passed": 2, "deselected": 1}),
    (("-m", "not slow"), {}, {"passed": 1, "deselected": 2}),
    (("test_gate.py::test_slow",), {}, {"passed": 2}),
    (("test_gate.py::test_slow[2]", "test_gate.py::test_fast"), {}, {"passed": 2}),
], ids=["default", "option", "variable", "variable-0", "m-slow", "m-not-slow", "named", "named-case"])
def test_slow_tests_run_only_when_asked_for(project, monkeypatch, arguments, env, outcomes):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    project.runpytest_inprocess("-p", "no:cacheprovider", *arguments).assert_outcomes(**outcomes)


def test_a_skipped_slow_test_says_how_to_run_it(project):
    result = project.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.stdout.fnmatch_lines(["*run it with --run-slow or RQRL_RUN_SLOW=1*"])


ISOLATION_TESTS = """
import os

def test_environment():
    assert "REDIS_URL" not in os.environ and "RQRL_QUEUE" not in os.environ
    assert "RQ_DASHBOARD_REDIS_URL" not in os.environ
    assert os.environ["RQRL_SECRET"] == "rqrl-test-secret"
"""


def test_the_shell_cannot_point_tests_at_another_redis_or_secret(pytester, monkeypatch):
    for name, value in (("REDIS_URL", "redis://elsewhere:6379/0"), ("RQRL_QUEUE", "theirs"),
                        ("RQ_DASHBOARD_REDIS_URL", "redis://elsewhere:6379/0"), ("RQRL_SECRET", "the-shells")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest("from tests.conftest import isolated_environment, isolated_session_environment  # noqa: F401")
    pytester.makepyfile(test_isolation=ISOLATION_TESTS)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_wait_until_returns_the_first_truthy_value_and_names_what_never_came():
    calls = iter([0, [], "ready"])
    assert wait_until(lambda: next(calls), 5, interval=0) == "ready"
    with pytest.raises(AssertionError, match=r"after 0.05 s waiting for the answer \(last: 42\)"):
        wait_until(lambda: None, 0.05, interval=0.01, message=lambda: "the answer (last: 42)")
