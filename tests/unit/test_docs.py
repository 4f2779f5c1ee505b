"""The docs' shell examples name real commands and flags: every `rqrl ...` line of a ```bash block of the README
and the docs site is checked against the click command tree (the help text and the flags are the code's)."""

from __future__ import annotations

import shlex

import click
import pytest

from rqrl.cli.commands import main
from tests.doc_blocks import Block, all_blocks


def rqrl_lines(block: Block) -> list[str]:
    """The `rqrl ...` commands of a shell block, without their comments (also after `&&` or `export ...;`)."""
    commands = []
    for line in block.code.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        commands += [part.strip() for part in line.split("&&") if part.strip().startswith("rqrl ")]
    return commands


def resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The command that ``rqrl WORDS`` runs, and the words left for its options and arguments."""
    command: click.Command = main
    words = list(words)
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(click.Context(command), words[0])
        if sub is None:
            break
        command, words = sub, words[1:]
    return command, words


COMMANDS = [(block.name, line) for block in all_blocks("bash") for line in rqrl_lines(block)]


def test_the_docs_hold_rqrl_commands_of_every_kind() -> None:
    names = {resolve(shlex.split(line)[1:])[0].name for _, line in COMMANDS}
    assert {"train", "ppo", "dqn", "evaluate", "worker", "status", "stop"} <= names, names


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[f"{where}: {line}" for where, line in COMMANDS])
def test_each_rqrl_command_in_the_docs_names_a_real_command_and_real_flags(where: str, line: str) -> None:
    command, rest = resolve(shlex.split(line)[1:])
    flags = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help", "-h"}
    unknown = [word.split("=", 1)[0] for word in rest if word.startswith("-") and word.split("=", 1)[0] not in flags]
    assert unknown == [], f"{where}: `{line}` uses flags `{command.name}` does not have"
    if isinstance(command, click.Group) and not command.invoke_without_command:
        pytest.fail(f"{where}: `{line}` names the group {command.name} without a command")


def test_a_wrong_flag_is_caught() -> None:
    command, rest = resolve(["train", "dqn", "--no-such-flag"])
    assert command.name == "dqn" and rest == ["--no-such-flag"]
    assert "--no-such-flag" not in {opt for param in command.params for opt in param.opts}
