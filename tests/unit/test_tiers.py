"""The tiers of tests/tiers.py, run by pytest's pytester on a small project: which tiers a plain run, --tier,
--all and a named path take (tests/processes/test_tiers.py: the default tier's refusal of tests that start
processes)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

PASSING = "def test_one():\n    pass\n"


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # quicker: the runs need no installed plugin
    pytester.makeconftest("pytest_plugins = ['tests.tiers']")
    pytester.makeini("[pytest]\naddopts = --import-mode=importlib\n")  # the project's tests/ is no package
    for folder in ("unit", "integration", "processes", "e2e"):
        pytester.path.joinpath("tests", folder).mkdir(parents=True)
        pytester.path.joinpath(f"tests/{folder}/test_{folder}.py").write_text(PASSING)
    return pytester


def passed_files(result) -> set[str]:
    return {line.split("::")[0].rsplit("/", 2)[-2] for line in result.outlines if "PASSED" in line and "::" in line}


@pytest.mark.parametrize("arguments, folders", [
    ((), {"unit", "integration"}),
    (("--tier", "processes"), {"processes"}),
    (("--tier", "default", "--tier", "e2e"), {"unit", "integration", "e2e"}),
    (("--all",), {"unit", "integration", "processes", "e2e"}),
    (("--all", "-m", "not e2e"), {"unit", "integration", "processes"}),
    (("tests/e2e",), {"e2e"}),
    (("tests/processes/test_processes.py::test_one",), {"processes"}),
    (("tests",), {"unit", "integration"}),
], ids=["plain", "tier", "two-tiers", "all", "all-but-e2e", "folder", "named-test", "tests-root"])
def test_each_run_takes_the_tiers_it_names(project, arguments, folders):
    result = project.runpytest_inprocess("-p", "no:cacheprovider", "-v", *arguments)
    assert passed_files(result) == folders, result.outlines
