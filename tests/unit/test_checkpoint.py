"""Weights and training checkpoints as safetensors files: round trips and refusals."""

from __future__ import annotations

import copy

import pytest
import safetensors.torch
import torch

from rqrl import ConfigError, RqrlError
from rqrl.algorithms.checkpoint import (
    CheckpointError,
    TrainingState,
    load_checkpoint,
    load_into,
    load_weights,
    recorded_mean_return,
    save_checkpoint,
    save_weights,
)


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def loss_of(model: torch.nn.Module, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(16, 3, generator=generator)
    targets = torch.randn(16, 2, generator=generator)
    return (model(inputs) - targets).pow(2).mean()


def test_weights_round_trip_with_metadata(tmp_path):
    model = small_model()
    model.train()
    loss_of(model, 0).backward()  # moves the BatchNorm running stats and its int64 counter
    metadata = {"env_id": "CartPole-v1", "hidden_size": 64, "mean_return": None, "score": 12.5,
                "nested": {"list": [1, 2, 3]}}
    path = tmp_path / "deep" / "folder" / "final.safetensors"
    save_weights(path, model.state_dict(), metadata)
    state_dict, loaded_metadata = load_weights(path)
    assert loaded_metadata == metadata
    assert set(state_dict) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert state_dict[key].dtype == value.dtype, key
        assert torch.equal(state_dict[key], value), key
    assert state_dict["1.num_batches_tracked"].dtype == torch.int64
    assert [p.name for p in path.parent.iterdir()] == ["final.safetensors"]  # no temporary file left behind
    fresh = small_model(seed=1)
    fresh.load_state_dict(state_dict)
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_saving_again_replaces_the_file(tmp_path):
    path = tmp_path / "w.safetensors"
    save_weights(path, {"x": torch.zeros(2)}, {"version": 1})
    save_weights(path, {"x": torch.ones(3)}, {"version": 2})
    state_dict, metadata = load_weights(path)
    assert torch.equal(state_dict["x"], torch.ones(3)) and metadata == {"version": 2}


def train_steps(model, optimizer, seeds):
    for seed in seeds:
        optimizer.zero_grad()
        loss_of(model, seed).backward()
        optimizer.step()


def test_adam_checkpoint_round_trip_continues_identically(tmp_path):
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-5, weight_decay=1e-3)
    train_steps(model, optimizer, seeds=[0, 1, 2])
    counters = {"env_steps": 3000, "updates": 3, "recent_returns": [1.0, 2.5], "best_mean_return": None}
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, TrainingState(model.state_dict(), optimizer.state_dict(), counters))

    state = load_checkpoint(path)
    assert state.counters == counters
    restored = small_model(seed=7)
    restored.load_state_dict(state.model)
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=0.5)
    restored_optimizer.load_state_dict(state.optimizer)
    group = restored_optimizer.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (1e-2, (0.8, 0.95), 1e-5, 1e-3)
    for parameter in restored.parameters():
        assert float(restored_optimizer.state[parameter]["step"]) == 3

    train_steps(model, optimizer, seeds=[3, 4])
    train_steps(restored, restored_optimizer, seeds=[3, 4])
    for (name, original), continued in zip(model.named_parameters(), restored.parameters(), strict=True):
        assert torch.equal(original, continued), name


def test_a_fresh_optimizer_would_not_continue_identically(tmp_path):
    """Guards the test above: Adam's state matters for the next step on these inputs."""
    model = small_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train_steps(model, optimizer, seeds=[0, 1, 2])
    restored = copy.deepcopy(model)
    fresh_optimizer = torch.optim.Adam(restored.parameters(), lr=1e-2)
    train_steps(model, optimizer, seeds=[3])
    train_steps(restored, fresh_optimizer, seeds=[3])
    assert not torch.equal(model[0].weight, restored[0].weight)


def test_a_weights_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "final.safetensors"
    save_weights(path, small_model().state_dict(), {"env_id": "CartPole-v1"})
    with pytest.raises(CheckpointError, match="weights file, not a training checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize("loader", [load_weights, load_checkpoint])
def test_missing_files_raise(tmp_path, loader):
    with pytest.raises(CheckpointError, match="no weights file"):
        loader(tmp_path / "nothing.safetensors")
    with pytest.raises(CheckpointError):
        loader(tmp_path)  # a folder is not a file


def write_truncated(path):
    save_weights(path, small_model().state_dict(), {"a": 1})
    path.write_bytes(path.read_bytes()[:-12])


def write_bad_metadata(path):
    safetensors.torch.save_file({"x": torch.zeros(2)}, str(path), metadata={"rqrl": "{not json"})


@pytest.mark.parametrize("corrupt", [
    lambda path: path.write_bytes(b""),
    lambda path: path.write_bytes(b"not a safetensors file at all"),
    lambda path: path.write_bytes(b"\xff" * 64),
    write_truncated,
    write_bad_metadata,
], ids=["empty", "text", "huge-header", "truncated", "bad-metadata"])
@pytest.mark.parametrize("loader", [load_weights, load_checkpoint])
def test_corrupt_files_raise(tmp_path, corrupt, loader):
    path = tmp_path / "broken.safetensors"
    corrupt(path)
    with pytest.raises(CheckpointError, match="cannot read weights file") as raised:
        loader(path)
    assert isinstance(raised.value, RqrlError) and raised.value.__cause__ is not None


def test_a_save_that_fails_on_a_full_disk_is_one_error_and_keeps_the_file_written_before(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.safetensors"
    (tmp_path / "config.json").write_text("{}")  # a run folder: the message says how to go on with the run
    save_weights(path, {"x": torch.zeros(2)}, {"version": 1})

    def full_disk(tensors, filename, metadata=None):
        open(filename, "wb").close()  # what a cut-short write leaves
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(CheckpointError) as raised:
        save_weights(path, {"x": torch.ones(2)}, {"version": 2})
    message = str(raised.value)
    assert message.startswith(f"cannot write {path}: Error while serializing: I/O error: No space left on device")
    assert "the checkpoint.safetensors written before stays" in message
    assert f"then resume the run with `rqrl train --resume {tmp_path}`" in message
    (tmp_path / "config.json").unlink()  # a file of the user's own: no run to resume
    with pytest.raises(CheckpointError) as raised:
        save_weights(path, {"x": torch.ones(2)}, {"version": 2})
    assert "--resume" not in str(raised.value)
    assert load_weights(path)[1] == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.safetensors"]  # no temporary left


def test_a_read_only_folder_is_a_checkpoint_error_naming_the_file(tmp_path, monkeypatch):
    def read_only(tensors, filename, metadata=None):
        raise PermissionError(30, "Read-only file system", filename)

    monkeypatch.setattr(safetensors.torch, "save_file", read_only)
    with pytest.raises(CheckpointError, match=f"cannot write {tmp_path / 'best.safetensors'}: Read-only file system; "
                                              f"no best.safetensors was written"):
        save_weights(tmp_path / "best.safetensors", {"x": torch.zeros(2)}, {})


def test_the_mean_return_a_weights_file_records(tmp_path):
    path = tmp_path / "best.safetensors"
    assert recorded_mean_return(path) is None
    for recorded, read in ((214.67, 214.67), (None, None), (float("nan"), None), (3, 3.0)):
        save_weights(path, {"x": torch.zeros(1)}, {"mean_return": recorded})
        assert recorded_mean_return(path) == read
    path.write_bytes(b"garbage")
    assert recorded_mean_return(path) is None


def test_a_state_that_does_not_fit_is_a_config_error_not_a_torch_traceback(tmp_path):
    with pytest.raises(ConfigError, match=r"x.safetensors does not fit this Sequential \(Error\(s\) in loading "
                                          r"state_dict.*\): use the right size") as raised:
        load_into(small_model(), torch.nn.Linear(3, 9).state_dict(), tmp_path / "x.safetensors", "use the right size")
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_weights_and_checkpoints_get_the_mode_the_umask_gives_a_new_file(tmp_path):
    """safetensors writes through a private temporary file (0o600): on a shared volume another user could not read
    the weights, where every other file of the run folder is readable (0o644 under umask 022)."""
    import os
    import stat

    from rqrl.algorithms.checkpoint import FILE_MODE, _read_umask

    umask = os.umask(0o022)  # this test's thread is the only one: reading the umask by setting it is safe here
    os.umask(umask)
    assert _read_umask() == umask and FILE_MODE == 0o666 & ~umask
    (tmp_path / "plain.txt").write_text("x")  # what any other file of the folder gets
    save_weights(tmp_path / "best.safetensors", {"x": torch.zeros(2)}, {})
    save_checkpoint(tmp_path / "checkpoint.safetensors", TrainingState({"x": torch.zeros(2)}, {}))
    for name in ("plain.txt", "best.safetensors", "checkpoint.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == FILE_MODE, name


def test_a_volume_that_refuses_chmod_does_not_fail_the_save(tmp_path, monkeypatch):
    """NFS with root_squash, FUSE or CIFS may refuse the mode: the save itself went through, and said it failed."""
    import errno
    import os

    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refused)
    save_weights(tmp_path / "best.safetensors", {"x": torch.ones(2)}, {"version": 1})
    assert (tmp_path / "best.safetensors").is_file()
