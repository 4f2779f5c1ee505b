"""The folder a learner writes (weights, checkpoint, config.json, metrics): a new run never writes over an earlier
run's folder, and two learners never write one folder at once.

A learner takes its folder when it is made: a folder that holds a run (its config.json) is refused unless the
learner resumes that very run, and a folder another learner on this machine holds is refused too. The hold is
a POSIX lock on ``LOCK_NAME`` in the folder, the learner process's own (processes it forks do not take it along),
released by ``close`` or when the process ends however it ends, so a killed learner's run can be resumed at once.
Such a lock cannot tell two learners of one process apart (and closing any handle on the file drops it), so a
process also keeps the folders its own learners hold, and opens the lock file once per folder. A folder shared
between machines (NFS) may not carry the lock: there only the refusal of a new run stands.

A learner also checks, before anything starts, that it can write its folder (a read-only disk or --run-dir is a
RunFolderError naming the folder, not an OSError once the run is under way), and the learner that takes a folder
removes the temporary files of a save that a killed learner left half written (``TEMPORARIES``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import weakref
from pathlib import Path
from typing import BinaryIO

from rqrl.errors import RunFolderError

log = logging.getLogger(__name__)

LOCK_NAME = ".learner.lock"
"""The file in a run folder that its learner holds a lock on, and that names that learner."""

TEMPORARIES = ("*.safetensors.tmp", ".tmp" + "[A-Za-z0-9]" * 6, "summary.json.tmp", "metrics.csv.partial")
"""Files a save writes before it renames them into place (rqrl.algorithms.checkpoint's, then safetensors' own, the
``tempfile`` crate's ``.tmp`` and six characters; rqrl.algorithms.metrics' summary and trimmed metrics): left
behind only by a learner killed mid-save."""

__all__ = ["LOCK_NAME", "TEMPORARIES", "RunFolder"]

_held: weakref.WeakValueDictionary[Path, RunFolder] = weakref.WeakValueDictionary()
"""The folders this process's learners hold, by resolved path (a learner dropped unclosed lets go of its own)."""


class RunFolder:
    """A learner's hold on its run folder ``path``; ``resumed``: the run folder (or a file in it) the learner
    resumes, None for a new run. RunFolderError if the folder holds another run or another learner holds it."""

    def __init__(self, path: str | Path, resumed: str | Path | None = None):
        self.path = Path(path)
        self.opened = False
        self._lock: BinaryIO | None = None
        _check_writable(self.path)
        if (self.path / "config.json").is_file() and not _resumes(resumed, self.path):
            raise RunFolderError(
                f"{self.path} holds a run already: resume it with `rqrl train --resume {self.path}` (in Python: "
                f"resume={str(self.path)!r}), or give this run another name (--run-name), or delete the folder "
                f"to start it over")
        if self.path.is_dir():
            self._hold()

    def open(self) -> None:
        """Make the folder, once the run has started (a launch that fails leaves none), and hold it."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self._lock is None:
            self._hold()
        self.opened = True

    def close(self) -> None:
        """Let the folder go: another learner may resume the run now."""
        if self._lock is not None:
            _held.pop(self.path.resolve(), None)
            self._lock.close()
            self._lock = None

    def stopping(self, reason: str) -> str:
        """The line a learner logs as it stops early for ``reason`` ("interrupted (SIGINT)", say)."""
        if self.opened:
            return f"{reason}: writing a checkpoint; resume with --resume {self.path}"
        if self._lock is not None:  # a resumed run's folder, from its earlier sessions
            return f"{reason} before the run went on: nothing written; resume with --resume {self.path}"
        return f"{reason} before the run started: nothing written, no run folder"

    def _hold(self) -> None:
        if self.path.resolve() in _held:
            raise RunFolderError(
                f"{self.path} is being written by another learner of this process (process {os.getpid()}): let "
                f"its train() end first")
        try:
            lock = open(self.path / LOCK_NAME, "a+b")  # noqa: SIM115 - held open until close()
        except OSError as error:
            raise RunFolderError(f"cannot write the run folder {self.path} ({error.strerror or error}): give a "
                                 f"writable --run-dir (in Python: run_dir=...)") from error
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read(200).decode(errors="replace").strip() or "a process"
            lock.close()
            raise RunFolderError(
                f"{self.path} is being written by another learner ({holder}): stop it first (Ctrl-C where it runs, "
                f"or `rqrl stop RUN_NAME`), then resume the run with `rqrl train --resume {self.path}`") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()} on {socket.gethostname()}".encode())
        lock.flush()
        self._lock = lock
        _held[self.path.resolve()] = self
        _remove_temporaries(self.path)


def _check_writable(path: Path) -> None:
    """RunFolderError unless this process can write ``path``, or make it in its nearest existing parent."""
    existing = next((folder for folder in (path, *path.parents) if folder.exists()), Path("."))
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return
    if not existing.is_dir():
        why = f"{existing} is a file, not a folder"
    elif os.statvfs(existing).f_flag & os.ST_RDONLY:
        why = f"{existing} is on a read-only file system"
    else:
        why = f"{existing} is not writable by this user"
    raise RunFolderError(f"cannot write the run folder {path}: {why}; give a writable --run-dir (in Python: "
                         f"run_dir=...)")


def _remove_temporaries(path: Path) -> None:
    """Delete what saves cut short by a killed learner left in ``path`` (TEMPORARIES): its holder writes no other."""
    for pattern in TEMPORARIES:
        for leftover in path.glob(pattern):
            if not leftover.is_file():
                continue
            try:
                leftover.unlink(missing_ok=True)
            except OSError as error:  # it costs disk space, not the run
                log.warning("cannot remove %s, a save cut short by an earlier learner: %s", leftover, error)
                continue
            log.info("removed %s, a save cut short by an earlier learner", leftover)


def _resumes(resumed: str | Path | None, path: Path) -> bool:
    """Whether the run ``resumed`` names (a run folder, or a file in one) is the run in ``path``."""
    if resumed is None:
        return False
    folder = Path(resumed) if Path(resumed).is_dir() else Path(resumed).parent
    return folder.resolve() == path.resolve()
