"""rqrl.algorithms.run_folder: a new run never writes over an earlier run's folder (two learners at once:
tests/processes/test_run_folder.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rqrl.algorithms.common import write_config
from rqrl.algorithms.dqn import DqnConfig, _DqnRun
from rqrl.algorithms.impala import ImpalaConfig, Learner
from rqrl.algorithms.ppo import PpoConfig, PpoLearner
from rqrl.algorithms.run_folder import LOCK_NAME, RunFolder
from rqrl.errors import ConfigError, RunFolderError


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    write_config(folder, PpoConfig(run_name="run", run_dir=str(tmp_path)), "ppo")
    return folder


def test_a_new_run_in_a_folder_that_holds_a_run_is_refused_naming_resume(earlier_run: Path) -> None:
    with pytest.raises(RunFolderError, match=f"holds a run already: resume it with `rqrl train --resume {earlier_run}"):
        RunFolder(earlier_run)
    assert issubclass(RunFolderError, ConfigError)


@pytest.mark.parametrize("learner", ["impala", "ppo", "dqn"])
def test_every_learner_refuses_a_run_name_in_use_before_it_starts(earlier_run: Path, learner: str) -> None:
    settings = {"run_dir": str(earlier_run.parent), "run_name": "run", "progress": False}
    with pytest.raises(RunFolderError, match="holds a run already"):
        if learner == "impala":
            Learner(ImpalaConfig(**settings))
        elif learner == "ppo":
            PpoLearner(PpoConfig(**settings))
        else:
            _DqnRun(DqnConfig(**settings))
    assert sorted(path.name for path in earlier_run.iterdir()) == ["config.json"]  # nothing written over


def test_resuming_the_run_in_the_folder_is_let_in(earlier_run: Path) -> None:
    for resumed in (earlier_run, earlier_run / "checkpoint.safetensors", str(earlier_run / ".." / "run")):
        folder = RunFolder(earlier_run, resumed)
        assert folder.stopping("interrupted (SIGINT)") == ("interrupted (SIGINT) before the run went on: nothing "
                                                           f"written; resume with --resume {earlier_run}")
        folder.close()
    with pytest.raises(RunFolderError):
        RunFolder(earlier_run, earlier_run.parent / "another-run")  # another run's checkpoint into this folder


def test_what_a_learner_says_as_it_stops_depends_on_whether_it_wrote_a_folder(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "new")
    assert folder.stopping("interrupted (SIGINT)") == ("interrupted (SIGINT) before the run started: nothing "
                                                       "written, no run folder")
    assert not (tmp_path / "new").exists()
    folder.open()
    assert (tmp_path / "new" / LOCK_NAME).is_file()
    assert folder.stopping("interrupted (SIGINT)") == (f"interrupted (SIGINT): writing a checkpoint; resume with "
                                                       f"--resume {tmp_path / 'new'}")
    folder.close()


def test_two_learners_of_one_process_cannot_hold_one_folder(tmp_path: Path) -> None:
    """A process's POSIX lock cannot tell its own learners apart (and a second handle's close would drop it): the
    process keeps the folders its learners hold."""
    first = RunFolder(tmp_path / "run")
    first.open()
    with pytest.raises(RunFolderError, match="another learner of this process"):
        RunFolder(tmp_path / "run")
    first.close()
    RunFolder(tmp_path / "run").close()


@pytest.mark.parametrize("learner", ["impala", "ppo", "dqn"])
def test_a_learner_leaves_the_callers_config_as_given(tmp_path: Path, learner: str) -> None:
    """A sweep that trains one config object twice gets two runs: the generated run name stays the learner's."""
    made = {"impala": (ImpalaConfig, Learner), "ppo": (PpoConfig, PpoLearner), "dqn": (DqnConfig, _DqnRun)}
    config_class, learner_class = made[learner]
    config = config_class(run_dir=str(tmp_path), progress=False)
    names = set()
    for _ in range(2):
        made_learner = learner_class(config)
        names.add(made_learner.run_dir.name)
        made_learner.folder.close()
    assert config.run_name is None and len(names) == 2 and all(name.startswith(learner) for name in names)
