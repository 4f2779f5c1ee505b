"""`rqrl train --wandb` with wandb in its offline mode: the run's config and its metrics rows' scalars are in the
local wandb run folder it writes (rqrl.algorithms.tracking)."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

from tests.children import run_rqrl, worker_env
from tests.run_files import read_rows

pytestmark = pytest.mark.timeout(240)
TRIVIAL_ENV = "tests.fixtures:RqrlGuessSign-v0"
BLOCK = 32 * 1024
"""The .wandb file is LevelDB's log format after a 7-byte header: 32 KiB blocks of records, each with a 7-byte
header (CRC-32C, little-endian length, type: 1 whole, 2 first, 3 middle, 4 last piece)."""


def wandb_records(path: Path) -> list[bytes]:
    """The serialized Record messages of a .wandb transaction log."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is no wandb log"
    records, pieces, offset = [], b"", 7
    while offset + 7 <= len(data):
        if BLOCK - offset % BLOCK < 7:  # a block's tail too short for a header is padding
            offset += BLOCK - offset % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[offset + 4:offset + 7])
        pieces += data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):
            records.append(pieces)
            pieces = b""
        elif kind == 0 and length == 0:
            break
    return records


def logged(run_folder: Path) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The config and the history rows the offline run under ``run_folder``/wandb recorded."""
    from wandb.proto import wandb_internal_pb2

    (log_file,) = run_folder.glob("wandb/offline-run-*/run-*.wandb")
    config: dict[str, object] = {}
    history = []
    for data in wandb_records(log_file):
        record = wandb_internal_pb2.Record.FromString(data)
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):  # the run's first record holds wandb.init's config, later ones updates
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return config, history


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed: pip install 'rqrl[wandb]'")
def test_wandb_offline_gets_the_config_and_every_metrics_rows_scalars(tmp_path):
    result = run_rqrl("train", "--env", TRIVIAL_ENV, "--total-env-steps", "3000", "--n-actors", "2",
                      "--batch-size", "2", "--n-rollout-steps", "20", "--workers", "1", "--eval-every", "0.2",
                      "--run-dir", str(tmp_path), "--run-name", "tracked", "--wandb", "--wandb-project", "rqrl-test",
                      env=worker_env(WANDB_MODE="offline", WANDB_SILENT="true"), timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "tracked"
    config, history = logged(run)
    assert config["n_actors"] == 2 and config["algo"] == "impala" and config["run_name"] == "tracked", config
    rows = read_rows(run / "metrics.csv")
    steps = [row["_step"] for row in history]
    assert steps == [int(row["env_steps"]) for row in rows], "a wandb step per metrics row, at its env steps"
    assert all("losses/policy_loss" in row and "charts/steps_per_second" in row for row in history), history[:2]
    assert [row["charts/mean_return"] for row in history if "charts/mean_return" in row] == [
        float(row["mean_return"]) for row in rows if row["mean_return"]]
    assert any("charts/eval_return" in row for row in history)
