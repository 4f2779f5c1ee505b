"""Experiment tracking beside TensorBoard: ``--wandb`` sends the run's config and the scalars of every metrics row
(the same tags, at the same env steps) to Weights & Biases. wandb is the optional extra ``rqrl[wandb]``; with
``WANDB_MODE=offline`` it writes only a local run folder (``RUN_DIR/RUN_NAME/wandb/``) to sync later."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rqrl.algorithms.common import recorded_config
from rqrl.errors import ConfigError

WANDB_EXTRA = "pip install 'rqrl[wandb]'"


class ScalarLog(Protocol):
    """Where MetricsWriter sends each row's scalars besides metrics.csv and TensorBoard."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def check_wandb(enabled: bool) -> None:
    """ConfigError in one line, naming rqrl's extra, if ``enabled`` (--wandb) and wandb is not installed."""
    if enabled and importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"--wandb needs wandb, which is not installed: {WANDB_EXTRA}")


class WandbLog:
    """A wandb run named after the rqrl run, holding its config; ``log`` adds one metrics row's scalars at its env
    steps. wandb reads its own settings from the environment (WANDB_API_KEY, WANDB_MODE, WANDB_ENTITY...)."""

    def __init__(self, run_dir: Path, run_name: str, project: str, config: Mapping[str, Any]):
        check_wandb(True)
        import wandb

        self._run = wandb.init(project=project, name=run_name, group=run_name, config=dict(config),
                               dir=str(run_dir))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


def tracker(config: Any, run_dir: Path, algo: str) -> WandbLog | None:
    """--wandb's run for ``config``'s run (any algorithm's), named after its folder, with its recorded config (as
    config.json holds it); None without --wandb."""
    if not config.wandb:
        return None
    return WandbLog(run_dir, run_dir.name, config.wandb_project, recorded_config(config, algo))
