"""click's CliRunner for `rqrl` commands run in-process, stderr kept apart on every click the project allows."""

from __future__ import annotations

from click.testing import CliRunner, Result

from rqrl.cli import main


def invoke(*arguments: str, env: dict[str, str] | None = None) -> Result:
    """``rqrl ARGUMENTS`` in this process; ``result.stderr`` holds what the command wrote to stderr."""
    try:
        runner = CliRunner(mix_stderr=False)  # click 8.1; 8.2 keeps stderr apart by itself and has no such argument
    except TypeError:
        runner = CliRunner()
    return runner.invoke(main, list(arguments), env=env, catch_exceptions=False)
