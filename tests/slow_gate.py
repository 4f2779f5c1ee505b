"""The gate of the ``slow`` marker (a pytest plugin, loaded by tests/conftest.py).

Slow tests are skipped, with a reason that says how to run them, unless ``--run-slow`` or
``RQRL_RUN_SLOW=1`` is given, ``-m`` names the marker (``pytest -m slow``), or the test is named on the
command line (``pytest tests/x.py::test_y``). A ``-m 'not slow'`` in addopts would instead deselect
them even when named.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RUN_SLOW_VARIABLE = "RQRL_RUN_SLOW"
SKIP_REASON = f"slow test: run it with --run-slow or {RUN_SLOW_VARIABLE}=1, -m slow, or by naming it"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False,
                     help=f"also run the tests marked slow (or set {RUN_SLOW_VARIABLE}=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if slow_tests_wanted(config):
        return
    named = named_tests(config)
    for item in items:
        if item.get_closest_marker("slow") is not None and not any(matches(item, test) for test in named):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def slow_tests_wanted(config: pytest.Config) -> bool:
    """True for --run-slow, RQRL_RUN_SLOW set (to anything but 0), or a -m expression about ``slow``."""
    return bool(config.getoption("--run-slow") or os.environ.get(RUN_SLOW_VARIABLE, "0") not in ("", "0")
                or "slow" in (config.option.markexpr or ""))


def named_tests(config: pytest.Config) -> list[tuple[Path, str]]:
    """(file, test path inside it) of each command-line argument that names tests with ``::``."""
    named = []
    for argument in config.args:
        path, separator, inside = str(argument).partition("::")
        if separator:
            named.append(((config.invocation_params.dir / path).resolve(), inside))
    return named


def matches(item: pytest.Item, test: tuple[Path, str]) -> bool:
    path, inside = test
    own = item.nodeid.partition("::")[2]
    return item.path.resolve() == path and (own == inside or own.startswith((f"{inside}[", f"{inside}::")))
