"""mkdocs hook: build `rqrl train` before mkdocs-click reads the command tree.

`rqrl` builds its `train` group on first use (its flags come from the learners' configs, which import torch),
so `main.commands` lacks it until something asks for it; mkdocs-click reads `main.commands`.
"""

from __future__ import annotations

from typing import Any

import click


def on_config(config: Any) -> Any:
    from rqrl.cli.commands import main

    if main.get_command(click.Context(main), "train") is None:
        raise RuntimeError("rqrl has no train command: the CLI reference would miss it")
    return config
