"""``rqrl train --config FILE``: a run's settings from a JSON object with the keys of a run's config.json, so a
recorded run can be repeated (``rqrl train --config runs/X/config.json``). Flags given on the command line override
the file; an unknown key or a value of the wrong type is refused in one line that names the key."""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from pathlib import Path
from typing import Any

import click

from rqrl.algorithms.common import ALGORITHMS

RUN_OWN = ("run_name", "resume")
"""Keys of a recorded config.json that name that run itself: a run started from the file is a new run in a folder
of its own (``--run-name`` names it, ``--resume`` continues a run)."""
EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def read_settings(path: str) -> dict[str, Any]:
    """The JSON object in ``path``; UsageError in one line for a file that holds none."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:  # ValueError: bad JSON, or bytes that are no UTF-8
        raise click.UsageError(f"--config {path}: cannot read it as JSON ({error})") from None
    if not isinstance(data, dict):
        raise click.UsageError(f"--config {path}: expected a JSON object of settings (the keys of a run's "
                               f"config.json), got a {type(data).__name__}")
    return data


def file_algorithm(path: str, data: dict[str, Any], chosen: str | None) -> str:
    """The algorithm the file's ``algo`` names (IMPALA, or the subcommand's, if it names none)."""
    algo = data.get("algo")
    if algo is None:
        return chosen or "impala"
    if algo not in ALGORITHMS:
        raise click.UsageError(f"--config {path}: algo {algo!r} is none of {', '.join(ALGORITHMS)}")
    if chosen is not None and chosen != algo:
        raise click.UsageError(f"--config {path} holds {algo} settings: run it with `rqrl train {algo} --config "
                               f"{path}`")
    return str(algo)


def checked_value(path: str, name: str, value: Any, hint: Any) -> Any:
    """``value`` if it has the type ``hint`` allows (an integer for a number, null for an optional), else a
    UsageError naming the key, the type expected and the value found."""
    arguments = typing.get_args(hint)
    optional = type(None) in arguments
    base = next((argument for argument in arguments if argument is not type(None)), hint)
    if value is None and optional:
        return None
    if base is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, base) and not (base is int and isinstance(value, bool)):
        return value
    expected = EXPECTED.get(base, str(base)) + (" or null" if optional else "")
    raise click.UsageError(f"--config {path}: {name} must be {expected}, got {json.dumps(value)}")


def file_settings(path: str, data: dict[str, Any], algo: str, config_class: type[Any]) -> dict[str, Any]:
    """The file's settings ``data``, checked against the fields of ``config_class``, without ``algo``, RUN_OWN's
    keys and Redis URLs whose password config.json left out (said on stderr)."""
    hints = typing.get_type_hints(config_class)
    fields = [spec.name for spec in dataclasses.fields(config_class)]
    for name in data:
        if name != "algo" and name not in fields:
            close = difflib.get_close_matches(name, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (`rqrl train {algo} --help` lists them as flags)"
            raise click.UsageError(f"--config {path}: unknown key {name!r}: no setting of {algo}{hint}")
    settings = {name: checked_value(path, name, value, hints[name]) for name, value in data.items() if name != "algo"}
    if settings.get("run_name") is not None:
        click.echo(f"--config {path}: starting a new run (its run_name {settings['run_name']!r} is not taken; "
                   f"--run-name names this one)", err=True)
    for name in RUN_OWN:
        settings.pop(name, None)
    for name in ("redis_url", "worker_redis_url"):
        if ":***@" in (settings.get(name) or ""):  # config.json never records a password
            click.echo(f"--config {path}: {name} has no password recorded; not taken (give --"
                       f"{name.replace('_', '-')} or set REDIS_URL)", err=True)
            settings.pop(name)
    return settings
